"""Targets: the site a lease is for, as the registrable domain of a host name.

A lease request may name a ``target`` (a host name, ``www.shop.example.co.uk``, or a URL's
host); bans, concurrency limits and refusals (:mod:`app.serving.bans`) apply to its
registrable domain (``example.co.uk``), derived with the Public Suffix List of
`tldextract <https://github.com/john-kurkowski/tldextract>`_: the snapshot bundled with the
installed package, never fetched at run time.  A host whose suffix is not on the list (an IP
address, ``localhost``, ``site-a.test``) is its own target, whole.  An internationalised host
name counts in its ASCII form (IDNA, UTS #46 mapping: ``Bücher.de`` and ``xn--bcher-kva.de``
are one target), since HTTP libraries hand either form over as a URL's host.
"""

from __future__ import annotations

import ipaddress
import re
from functools import lru_cache

import idna
import tldextract

#: Longest host name accepted (RFC 1035: 253 characters in text form).
MAX_HOST_LENGTH = 253
_LABEL = re.compile(r"^(?!-)[a-z0-9_-]{1,63}(?<!-)$")

#: The extractor: bundled snapshot only (``suffix_list_urls=()``), no cache directory, so no
#: network access and no file written at run time.  The list's private section counts
#: (``user.github.io`` is a site of its own, not ``github.io``).
_EXTRACT = tldextract.TLDExtract(suffix_list_urls=(), cache_dir=None, include_psl_private_domains=True)


class TargetError(ValueError):
    """A ``target`` that is not a host name; the message says what is wrong with it."""


def _host(value: str) -> str:
    """The host part of ``value`` (a host name, ``host:port`` or a URL), lower-cased, without a
    trailing dot."""
    text = value.strip()
    if "://" in text:
        text = text.split("://", 1)[1]
    text = text.split("/", 1)[0].split("?", 1)[0].split("#", 1)[0]
    if "@" in text:
        text = text.rsplit("@", 1)[1]
    if text.startswith("["):  # [IPv6]:port
        return text[1:text.find("]")] if "]" in text else text
    if text.count(":") == 1:
        text = text.split(":", 1)[0]
    return text.rstrip(".").lower()


@lru_cache(maxsize=65_536)
def registrable_domain(value: str) -> str:
    """Return the target a lease for ``value`` counts against.

    Args:
        value: a host name (``www.example.com``), ``host:port``, a URL (its host is taken) or an
            IP address.
    Returns:
        the registrable domain (``example.com``, ``example.co.uk``); the whole host when its suffix
        is not on the Public Suffix List (``localhost``, ``site-a.test``, an IP address).
    Raises:
        TargetError: not a host name (empty, too long, a label with other characters than
            letters, digits, ``-`` and ``_`` once an internationalised name is in its ASCII
            form), naming what is wrong.
    """
    if not isinstance(value, str):
        raise TargetError(f"must be a host name string, got {type(value).__name__}")
    host = _host(value)
    if not host:
        raise TargetError("must be a host name, got an empty one")
    if not host.isascii():
        try:
            host = idna.encode(host, uts46=True).decode("ascii").lower().rstrip(".")
        except idna.IDNAError as exc:
            raise TargetError(f"{host!r} is not an internationalised host name: {exc}") from None
    if len(host) > MAX_HOST_LENGTH:
        raise TargetError(f"host name is {len(host)} characters long, at most {MAX_HOST_LENGTH} allowed")
    try:
        return str(ipaddress.ip_address(host))
    except ValueError:
        pass
    for label in host.split("."):
        if not _LABEL.match(label):
            raise TargetError(f"{label!r} of {host!r} is not a host name label (letters, digits, '-' and '_', "
                              "1 to 63 characters, not starting or ending with '-')")
    parts = _EXTRACT(host)
    if not parts.suffix or not parts.domain:
        return host
    return f"{parts.domain}.{parts.suffix}"
