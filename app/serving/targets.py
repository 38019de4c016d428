"""Targets: the site a lease is for, as the registrable domain of a host name.

A lease request may name a ``target`` (a host name, ``www.shop.example.co.uk``, or a URL's
host); bans, concurrency limits and refusals (:mod:`app.serving.bans`) apply to its
registrable domain (``example.co.uk``), derived with the Public Suffix List of
`tldextract <https://github.com/john-kurkowski/tldextract>`_: the snapshot bundled with the
installed package, never fetched at run time.  A host whose suffix is not on the list (an IP
address, ``localhost``, ``site-a.test``) is its own target, whole.  An internationalised host
name counts in its ASCII form (IDNA, UTS #46 mapping: ``Bücher.de`` and ``xn--bcher-kva.de``
are one target), since HTTP libraries hand either form over as a URL's host.  An IPv4 address
counts in its dotted-quad form whatever its spelling (``127.1``, ``2130706433``, ``0x7f.0.0.1``,
``::ffff:127.0.0.1`` are all ``127.0.0.1``: HTTP clients connect to that one address for each).
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
#: A label that makes a host an IPv4 address when it is the last one (the WHATWG URL standard's
#: "ends in a number"): decimal digits, or ``0x`` and hexadecimal digits.
_NUMBER = re.compile(r"^(?:[0-9]+|0x[0-9a-f]*)$")

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


def _ipv4(host: str) -> str | None:
    """The dotted-quad form of ``host`` when it is an IPv4 address in any of the spellings URL
    parsers and ``inet_aton`` take (``127.1``, ``2130706433``, ``0x7f.0.0.1``, ``0177.0.0.1``,
    ``1.2.3.04``: each part decimal, ``0x`` hexadecimal or ``0`` octal; the last part fills the
    bytes left), else ``None``."""
    parts = host.split(".")
    if not _NUMBER.match(parts[-1]) or len(parts) > 4:
        return None
    numbers = []
    for part in parts:
        if part.startswith("0x"):
            digits, base = part[2:] or "0", 16
        elif len(part) > 1 and part.startswith("0"):
            digits, base = part[1:], 8
        else:
            digits, base = part, 10
        try:
            numbers.append(int(digits, base))
        except ValueError:
            return None
    *head, last = numbers
    if any(n > 255 for n in head) or last >= 256 ** (4 - len(head)):
        return None
    value = last
    for i, n in enumerate(head):
        value += n << (8 * (3 - i))
    return str(ipaddress.IPv4Address(value))


def registrable_domain(value: str) -> str:
    """Return the target a lease for ``value`` counts against.

    Args:
        value: a host name (``www.example.com``), ``host:port``, a URL (its host is taken) or an
            IP address.
    Returns:
        the registrable domain (``example.com``, ``example.co.uk``); the whole host when its suffix
        is not on the Public Suffix List (``localhost``, ``site-a.test``); an IP address in its
        canonical form (an IPv4 address dotted-quad, however it was spelled).
    Raises:
        TargetError: not a host name (empty, too long, a label with other characters than
            letters, digits, ``-`` and ``_`` once an internationalised name is in its ASCII
            form), naming what is wrong.
    """
    if not isinstance(value, str):
        raise TargetError(f"must be a host name string, got {type(value).__name__}")
    # (cached by host, not by the value: a URL's path and query would fill the cache)
    return _registrable(_host(value))


@lru_cache(maxsize=65_536)
def _registrable(host: str) -> str:
    """:func:`registrable_domain` of ``host`` (:func:`_host`'s answer)."""
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
        address = ipaddress.ip_address(host)
    except ValueError:
        pass
    else:
        # (an IPv4-mapped IPv6 address reaches the IPv4 address: one target with it)
        mapped = address.ipv4_mapped if isinstance(address, ipaddress.IPv6Address) else None
        return str(mapped or address)
    for label in host.split("."):
        if not _LABEL.match(label):
            raise TargetError(f"{label!r} of {host!r} is not a host name label (letters, digits, '-' and '_', "
                              "1 to 63 characters, not starting or ending with '-')")
    ipv4 = _ipv4(host)
    if ipv4 is not None:
        return ipv4
    parts = _EXTRACT(host)
    if not parts.suffix or not parts.domain:
        return host
    return f"{parts.domain}.{parts.suffix}"
