"""Where the health worker may send a probe: endpoints and health URLs checked against denied ranges.

Whoever may write a Proxy chooses an External Proxy's ``spec.endpoint`` and every
``spec.healthCheck.url``.  The health worker connects to the endpoint and asks the proxy to
fetch the URL, and the outcome (refused, timeout, status) lands in the Proxy's conditions, so
without a check the worker is a port scanner of its own network (docs/security.md).

Denied by default (:data:`DEFAULT_DENIED_RANGES`): loopback (``127.0.0.0/8``, ``::1``),
link-local (``169.254.0.0/16``, ``fe80::/10``: the cloud metadata servers live there) and
"this host" (``0.0.0.0/8``, ``::``; connecting to ``0.0.0.0`` reaches the local host on
Linux), with their IPv4-mapped IPv6 forms; plus the names in :data:`DENIED_NAMES` (GCE's
metadata server, whose name only resolves inside GCE).  Operators add ranges (the cluster's
Pod and Service ranges, the VPC) with ``PROBE_DENIED_RANGES`` and carve exceptions out of the
denied ranges with ``PROBE_ALLOWED_RANGES`` (the test suite and a developer's local stack run
Squids on loopback: ``PROBE_ALLOWED_RANGES=127.0.0.0/8``).

``PROBE_DENIED_RANGES`` applies to every endpoint, the operator's own proxies included, so it
cannot hold the cluster's Pod range while the kubernetes provider runs Squid Pods there.
``PROBE_EXTERNAL_DENIED_RANGES`` is denied only for what a Proxy author points the worker at:
the endpoint of an **External** Proxy (any record that does not say ``Managed``) and every
health URL (the proxy-side check and the worker's own direct control request, which any Proxy
author chooses), never a Managed proxy's endpoint, which the provider gave.  ``PROBE_ALLOWED_RANGES``
does not exempt from it: it is what the operator keeps from Proxy authors on purpose.

Private and shared address space (:data:`DEFAULT_EXTERNAL_DENIED_RANGES`: RFC 1918, the CGNAT
range of RFC 6598, IPv6 unique local addresses of RFC 4193) is denied by default to the same
author-chosen destinations, and only ``PROBE_EXTERNAL_ALLOWED_RANGES`` exempts from it (an
External proxy or a health origin on a private network, on purpose).  Address ranges: RFC 6890
(special-purpose registries), RFC 3927 (IPv4 link-local), RFC 4291 §2.5 (IPv6 loopback,
link-local, IPv4-mapped).

Two different checks:

* the **endpoint** is resolved here, every address it resolves to is checked (one denied
  address denies the name), and the probe connects to the address that was checked, never to
  the name again (:meth:`DestinationPolicy.endpoint_address`), so a DNS answer that changes
  between check and connect (rebinding) cannot steer the connection;
* the **health URL** is fetched by the proxy, which resolves its host itself, in its own
  network.  Here its host is checked as a literal or through this process's resolver
  (:meth:`DestinationPolicy.check_url`), as urllib3 (which writes the probe's request) reads the
  URL and as :func:`urllib.parse.urlsplit` does when that differs (:func:`url_hosts`); a name
  that does not resolve here is let through, since the proxy may well resolve it: what the proxy
  may reach is the job of Squid's own destination rules.
"""

from __future__ import annotations

import functools
import ipaddress
import socket
import threading
import time
from typing import Callable, Iterable
from urllib.parse import urlsplit

import urllib3

#: Ranges no probe may connect to or fetch from unless ``PROBE_ALLOWED_RANGES`` allows them.
DEFAULT_DENIED_RANGES = ("127.0.0.0/8", "::1/128", "169.254.0.0/16", "fe80::/10", "0.0.0.0/8", "::/128")

#: Ranges denied by default to what a Proxy author chooses (External endpoints, every health URL)
#: unless ``PROBE_EXTERNAL_ALLOWED_RANGES`` allows them, never to a Managed proxy's endpoint:
#: RFC 1918 private networks, RFC 6598 shared (CGNAT) space, RFC 4193 unique local IPv6.
DEFAULT_EXTERNAL_DENIED_RANGES = ("10.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16", "100.64.0.0/10", "fc00::/7")

#: Host names denied whatever they resolve to here: GCE's metadata server (it resolves to
#: 169.254.169.254 only inside GCE; docs: cloud.google.com/compute/docs/metadata/querying-metadata).
DENIED_NAMES = frozenset({"metadata.google.internal", "metadata.goog", "metadata"})  # as app.squid.conf refuses

Resolver = Callable[..., list]


class DestinationDenied(Exception):
    """A probe destination lies in a denied range (or is a denied name); the message says which."""


def parse_ranges(text: str | Iterable[str], *, name: str = "ranges") -> tuple:
    """Parse CIDR ranges from a comma/space separated string or an iterable of strings.

    Args:
        text: e.g. ``"10.0.0.0/8, fd00::/8"``; a bare address counts as a /32 (/128).
        name: what to call the value in an error (the environment variable).
    Returns:
        a tuple of :mod:`ipaddress` networks.
    Raises:
        ValueError: an entry is not an address or a CIDR range (host bits set are refused, as in
            ``ipaddress.ip_network(strict=True)``); the message names ``name`` and the entry.
    """
    items = text.replace(",", " ").split() if isinstance(text, str) else [str(t).strip() for t in text]
    out = []
    for item in items:
        if not item:
            continue
        try:
            out.append(_plain_network(ipaddress.ip_network(item)))
        except ValueError:
            raise ValueError(f"{name}: not an IP address or CIDR range: {item!r}") from None
    return tuple(out)


def _plain_network(net):
    """The IPv4 network behind a range written in IPv4-mapped form (``::ffff:10.0.0.0/104`` is
    ``10.0.0.0/8``), else ``net``: addresses are compared in their IPv4 form (:func:`_plain`),
    so a mapped range kept as IPv6 would match nothing."""
    if net.version == 6 and net.prefixlen >= 96 and net.network_address.ipv4_mapped is not None:
        return ipaddress.ip_network(f"{net.network_address.ipv4_mapped}/{net.prefixlen - 96}")
    return net


def _plain(ip):
    """The IPv4 address behind an IPv4-mapped IPv6 address (``::ffff:127.0.0.1``), else ``ip``."""
    mapped = getattr(ip, "ipv4_mapped", None)
    return mapped if mapped is not None else ip


class DestinationPolicy:
    """Which addresses a probe may reach.

    Args:
        denied: networks refused in addition to :data:`DEFAULT_DENIED_RANGES`.
        allowed: networks exempted from every denied range (checked first).
        external_denied: networks refused for External endpoints and health URLs only
            (``PROBE_EXTERNAL_DENIED_RANGES``), never for a Managed proxy's endpoint.
        external_allowed: networks exempted, for External endpoints and health URLs, from
            :data:`DEFAULT_EXTERNAL_DENIED_RANGES` only (``PROBE_EXTERNAL_ALLOWED_RANGES``).
        resolver: ``socket.getaddrinfo``-compatible function (tests of name resolution use
            the real one; the parameter exists so that callers choose the resolver, not a patch).
        url_cache_seconds: how long the verdict on a health URL's host name is reused (a batch
            of proxies sharing a URL costs one lookup).
    An address is denied when it is in a denied range and in no allowed range; a destination a
    Proxy author chose (``external``) is also denied in an ``external_denied`` range, which the
    allowed ranges do not exempt (a local stack allows its Pod range for its own Squid Pods and
    still keeps External endpoints out of it), and in a :data:`DEFAULT_EXTERNAL_DENIED_RANGES`
    range that ``external_allowed`` does not exempt.
    """

    def __init__(self, denied: Iterable = (), allowed: Iterable = (), *, external_denied: Iterable = (),
                 external_allowed: Iterable = (), resolver: Resolver = socket.getaddrinfo,
                 url_cache_seconds: float = 30.0) -> None:
        self.denied = parse_ranges(DEFAULT_DENIED_RANGES) + tuple(denied)
        self.external_denied = tuple(external_denied)
        self.external_default_denied = parse_ranges(DEFAULT_EXTERNAL_DENIED_RANGES)
        self.external_allowed = tuple(external_allowed)
        self.allowed = tuple(allowed)
        self.resolver = resolver
        self.url_cache_seconds = url_cache_seconds
        self._url_cache: dict[str, tuple[float, str | None]] = {}
        self._lock = threading.Lock()

    def denied_range(self, address: str, *, external: bool = False):
        """Return the denied network ``address`` falls in, or ``None`` when it may be reached.

        Args:
            address: an IP address.
            external: also check :attr:`external_denied` and the private ranges of
                :data:`DEFAULT_EXTERNAL_DENIED_RANGES` not in :attr:`external_allowed` (a
                destination a Proxy author chose).
        Raises:
            ValueError: ``address`` is not an IP address.
        """
        ip = _plain(ipaddress.ip_address(address.split("%", 1)[0]))
        if external:  # explicit intent about what authors may reach: no allowed range exempts it
            for net in self.external_denied:
                if net.version == ip.version and ip in net:
                    return net
            if not any(ip in net for net in self.external_allowed if net.version == ip.version):
                for net in self.external_default_denied:
                    if net.version == ip.version and ip in net:
                        return net
        if any(ip in net for net in self.allowed if net.version == ip.version):
            return None
        for net in self.denied:
            if net.version == ip.version and ip in net:
                return net
        return None

    def _hint(self, net) -> str:
        """What lifts a denial by :data:`DEFAULT_EXTERNAL_DENIED_RANGES` (empty for other ranges)."""
        if net in self.external_default_denied and net not in self.external_denied:
            return " (private address space, denied to External endpoints and health URLs unless " \
                   "PROBE_EXTERNAL_ALLOWED_RANGES allows it)"
        return ""

    def _addresses(self, host: str, port: int) -> list[str]:
        """The distinct addresses ``host`` resolves to, in the resolver's order.

        Raises:
            OSError: it does not resolve (``socket.gaierror``), also when it is no valid host
                name: an empty label or one over 63 characters makes the IDNA encoding raise
                UnicodeError, which would otherwise escape the probe and fail its whole batch.
        """
        try:
            infos = self.resolver(host, port, type=socket.SOCK_STREAM)
        except UnicodeError:
            raise socket.gaierror(f"{host[:253]!r} is not a valid host name (empty label or one over "
                                  "63 characters)") from None
        seen: list[str] = []
        for info in infos:
            addr = info[4][0]
            if addr not in seen:
                seen.append(addr)
        return seen

    @staticmethod
    def _name(host: str) -> str:
        return host.strip().rstrip(".").lower()

    def endpoint_address(self, host: str, port: int, *, external: bool = True) -> str:
        """Resolve the endpoint ``host`` and return the address to connect to.

        Every address the name resolves to is checked; the first one is returned, and the
        caller connects to it (not to the name).  ``external`` (the default, the safe side)
        adds :attr:`external_denied`: pass ``False`` only for a Managed proxy's endpoint.

        Raises:
            DestinationDenied: the name is denied, or one of its addresses is in a denied range.
            OSError: the name does not resolve (``socket.gaierror``).
        """
        name = self._name(host)
        if name in DENIED_NAMES:
            raise DestinationDenied(f"endpoint {host} is a denied destination (cloud metadata server)")
        try:
            literal = ipaddress.ip_address(name.strip("[]").split("%", 1)[0])
        except ValueError:
            literal = None
        addresses = [str(literal)] if literal is not None else self._addresses(name, port)
        if not addresses:
            raise socket.gaierror(f"{host} resolves to no address")
        for addr in addresses:
            net = self.denied_range(addr, external=external)
            if net is not None:
                via = "" if literal is not None else f" resolves to {addr}, which is"
                raise DestinationDenied(f"endpoint {host}{via} in the denied range {net}{self._hint(net)}")
        return addresses[0]

    def check_url(self, url: str) -> None:
        """Refuse a health URL whose host is denied (see the module docstring for the rule).

        Raises:
            DestinationDenied: the host is a denied name, a literal in a denied range, or a
                name that resolves here to an address in a denied range.
        """
        for host, port, scheme in url_hosts(url):
            self._check_url_host(host, port, scheme)

    def _check_url_host(self, host: str, port: int | None, scheme: str) -> None:
        name = self._name(host)
        if not name:
            raise DestinationDenied(f"health URL host {host!r} is no host name")
        if name in DENIED_NAMES:
            raise DestinationDenied(f"health URL host {host} is a denied destination (cloud metadata server)")
        now = time.monotonic()
        with self._lock:
            hit = self._url_cache.get(name)
        if hit is not None and now - hit[0] < self.url_cache_seconds:
            verdict = hit[1]
        else:
            # Worded with the name the verdict is cached under, not this URL's spelling of it
            # (``Host.``, ``HOST``): a later URL answered from the cache names the same host.
            verdict = self._url_verdict(name, name, port or (443 if scheme == "https" else 80))
            with self._lock:
                if len(self._url_cache) > 4096:
                    self._url_cache.clear()
                self._url_cache[name] = (now, verdict)
        if verdict is not None:
            raise DestinationDenied(verdict)

    def _url_verdict(self, name: str, host: str, port: int) -> str | None:
        try:
            literal = ipaddress.ip_address(name.split("%", 1)[0])
        except ValueError:
            literal = None
        if literal is not None:
            net = self.denied_range(str(literal), external=True)
            return None if net is None else f"health URL host {host} is in the denied range {net}{self._hint(net)}"
        try:
            addresses = self._addresses(name, port)
        except OSError:
            return None  # the proxy resolves it in its own network; Squid's rules apply there
        for addr in addresses:
            net = self.denied_range(addr, external=True)
            if net is not None:
                return (f"health URL host {host} resolves to {addr}, which is in the denied range {net}"
                        f"{self._hint(net)}")
        return None


def url_hosts(url: str) -> list[tuple[str, int | None, str]]:
    """Return the ``(host, port, scheme)`` a health URL names, as every parser that handles it reads it.

    The probe's request line and CONNECT are written by urllib3, whose parser differs from
    :func:`urllib.parse.urlsplit` on some URLs (``http://10.0.0.1\\@name/`` is host ``name``
    to ``urlsplit`` and ``10.0.0.1`` to urllib3, which also decodes a percent-encoded host):
    the host urllib3 sends comes first, ``urlsplit``'s follows when it reads another one, and
    a check must pass all of them.  Hosts are lower-case, without IPv6 brackets.

    Raises:
        DestinationDenied: a parser refuses the URL, or it has no host.
    """
    where = f"health URL {url[:200]!r}"
    try:
        sent = urllib3.util.parse_url(url)
        parts = urlsplit(url)
        split_host, split_port = parts.hostname or "", parts.port
    except (ValueError, urllib3.exceptions.LocationParseError):
        raise DestinationDenied(f"{where} is malformed") from None
    host = (sent.host or "").strip("[]").lower()
    if not host or not split_host:
        raise DestinationDenied(f"{where} has no host")
    scheme = (sent.scheme or parts.scheme or "").lower()
    out = [(host, sent.port, scheme)]
    if split_host.strip("[]").lower() != host:
        out.append((split_host, split_port, scheme))
    return out


@functools.lru_cache(maxsize=16)
def policy(denied: tuple[str, ...] = (), allowed: tuple[str, ...] = (),
           external_denied: tuple[str, ...] = (), external_allowed: tuple[str, ...] = ()) -> DestinationPolicy:
    """Return this process's shared :class:`DestinationPolicy` for these range strings.

    Shared so that its health-URL cache serves every batch of the process.

    Raises:
        ValueError: a range does not parse (see :func:`parse_ranges`).
    """
    return DestinationPolicy(parse_ranges(denied, name="PROBE_DENIED_RANGES"),
                             parse_ranges(allowed, name="PROBE_ALLOWED_RANGES"),
                             external_denied=parse_ranges(external_denied, name="PROBE_EXTERNAL_DENIED_RANGES"),
                             external_allowed=parse_ranges(external_allowed, name="PROBE_EXTERNAL_ALLOWED_RANGES"))
