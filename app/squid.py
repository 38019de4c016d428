"""The squid.conf every provider deploys (SPEC §9: the proxies themselves).

One renderer for every provider, so a Pod, a GCE VM and a KVM guest run the same policy:
clients only from allowed source ranges, CONNECT only to allowed ports (443 by default),
``Proxy-Authorization`` never forwarded to the origin, no caching, logs to stdio.
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass, field

#: RFC 1918 + loopback: the default client ranges when a provider sets none.
DEFAULT_ALLOWED_RANGES = ("10.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16", "127.0.0.0/8")


@dataclass(frozen=True)
class SquidPolicy:
    """What a proxy accepts.

    Attributes:
        allowed_ranges: client CIDRs allowed to use the proxy.
        connect_ports: ports CONNECT may reach.
        basic_auth_file: path of an htpasswd file inside the instance to require basic auth,
            or ``None`` for none.
    """

    allowed_ranges: tuple[str, ...] = DEFAULT_ALLOWED_RANGES
    connect_ports: tuple[int, ...] = (443,)
    basic_auth_file: str | None = None
    extra: tuple[str, ...] = field(default_factory=tuple)

    def __post_init__(self) -> None:
        for cidr in self.allowed_ranges:
            ipaddress.ip_network(cidr, strict=False)  # raises ValueError naming the bad range
        for port in self.connect_ports:
            if not 1 <= int(port) <= 65535:
                raise ValueError(f"connect port out of range: {port}")


def render(port: int, policy: SquidPolicy | None = None, *, listen_address: str | None = None,
           overrides: tuple[str, ...] = ()) -> str:
    """Return a complete squid.conf.

    Args:
        port: TCP port Squid listens on.
        policy: :class:`SquidPolicy` (defaults when ``None``).
        listen_address: bind address (``None`` = all addresses).
        overrides: extra directives appended last (a test harness uses this for pid/log paths).
    Raises:
        ValueError: a bad CIDR or port in ``policy``.
    """
    policy = policy or SquidPolicy()
    listen = f"{listen_address}:{port}" if listen_address else str(port)
    lines = [
        "# rendered by proxy-operator (app/squid.py)",
        f"http_port {listen}",
        "acl allowed_src src " + " ".join(policy.allowed_ranges),
        "acl connect_ports port " + " ".join(str(p) for p in policy.connect_ports),
        "acl CONNECT method CONNECT",
        "http_access deny CONNECT !connect_ports",
    ]
    if policy.basic_auth_file:
        lines += [
            f"auth_param basic program /usr/lib/squid/basic_ncsa_auth {policy.basic_auth_file}",
            "auth_param basic realm proxy-operator",
            "acl authenticated proxy_auth REQUIRED",
            "http_access deny !authenticated",
        ]
    lines += [
        "http_access allow allowed_src",
        "http_access deny all",
        # Never pass the client's proxy credentials (or identity) on to the origin.
        "request_header_access Proxy-Authorization deny all",
        "forwarded_for delete",
        "via off",
        "cache deny all",
        "coredump_dir /tmp",
        "pid_filename /tmp/squid.pid",
        "cache_log stdio:/dev/stderr",
        "access_log stdio:/dev/stdout",
        *policy.extra,
        *overrides,
    ]
    return "\n".join(lines) + "\n"
