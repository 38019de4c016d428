"""The squid.conf every provider deploys (SPEC §9: the proxies themselves).

One renderer for every provider, so a Pod, a GCE VM and a KVM guest run the same policy:
clients only from allowed source ranges, CONNECT only to allowed ports (443 by default),
optional basic auth, ``Proxy-Authorization`` never forwarded to the origin, no caching,
logs to stdio.

Basic auth: :func:`generate_credentials` makes a user name and a random password,
:func:`htpasswd_entry` hashes them for Squid's ``basic_ncsa_auth`` helper (bcrypt, which the
helper accepts through the system's ``crypt(3)``), and :func:`credentials_secret` builds the
Kubernetes Secret that keeps all three (the password never goes anywhere else: not into
Redis, task arguments or logs).  Providers ship the ``htpasswd`` key into the instance at
:data:`DEFAULT_HTPASSWD_PATH`; crawlers and the health probes read ``username``/``password``.
"""

from __future__ import annotations

import base64
import ipaddress
import secrets
from dataclasses import dataclass, field

import bcrypt

from app.validation import Reader

#: RFC 1918 + loopback: the default client ranges when a provider sets none.
DEFAULT_ALLOWED_RANGES = ("10.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16", "127.0.0.0/8")
#: Where providers put the htpasswd file inside an instance when basic auth is on.
DEFAULT_HTPASSWD_PATH = "/etc/squid/proxy-operator.htpasswd"
#: Keys of the credentials Secret (:func:`credentials_secret`).
SECRET_USERNAME_KEY, SECRET_PASSWORD_KEY, SECRET_HTPASSWD_KEY = "username", "password", "htpasswd"


@dataclass(frozen=True)
class SquidPolicy:
    """What a proxy accepts.

    Attributes:
        allowed_ranges: client CIDRs allowed to use the proxy (anything else gets 403).
        connect_ports: ports CONNECT may reach (anything else gets 403).
        basic_auth_file: path of an htpasswd file inside the instance to require basic auth,
            or ``None`` for none.
        extra: directives appended after the policy (e.g. ``tcp_outgoing_address``).
    Raises:
        ValueError: a bad CIDR or a port outside 1..65535.
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
        # Source ranges first: a client outside them gets 403, never an auth challenge.
        "http_access deny !allowed_src",
        "http_access deny CONNECT !connect_ports",
    ]
    if policy.basic_auth_file:
        lines += [
            f"auth_param basic program /usr/lib/squid/basic_ncsa_auth {policy.basic_auth_file}",
            "auth_param basic realm proxy-operator",
            "auth_param basic credentialsttl 1 hour",
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


def generate_credentials(username: str = "crawler") -> tuple[str, str]:
    """Return ``(username, password)`` with a fresh random password (32 URL-safe characters).

    The password stays under bcrypt's 72-byte limit and contains no ``:`` (basic auth's
    separator).
    """
    return username, secrets.token_urlsafe(24)


def htpasswd_entry(username: str, password: str) -> str:
    """Return one htpasswd line ``user:$2b$...`` (bcrypt, cost 10) for ``basic_ncsa_auth``.

    Raises:
        ValueError: the user name is empty or contains ``:``, or the password is longer than
            72 bytes (bcrypt's limit; basic_ncsa_auth's man page says the same).
    """
    if not username or ":" in username:
        raise ValueError("basic auth user name must be non-empty and contain no ':'")
    if len(password.encode()) > 72:
        raise ValueError("basic auth password longer than 72 bytes (bcrypt limit)")
    hashed = bcrypt.hashpw(password.encode(), bcrypt.gensalt(rounds=10)).decode()
    return f"{username}:{hashed}"


def credentials_secret(name: str, namespace: str, username: str, password: str,
                       labels: dict[str, str] | None = None) -> dict:
    """Return a ``v1`` Secret manifest holding the proxy's basic-auth credentials.

    Keys: ``username``, ``password`` and ``htpasswd`` (the line for the instance).  Values are
    base64 in ``data`` (the API server's wire form).
    """
    def b64(text: str) -> str:
        return base64.b64encode(text.encode()).decode()

    return {
        "apiVersion": "v1", "kind": "Secret", "type": "Opaque",
        "metadata": {"name": name, "namespace": namespace,
                     "labels": {"app.kubernetes.io/managed-by": "proxy-operator", **(labels or {})}},
        "data": {SECRET_USERNAME_KEY: b64(username), SECRET_PASSWORD_KEY: b64(password),
                 SECRET_HTPASSWD_KEY: b64(htpasswd_entry(username, password) + "\n")},
    }


def parse_policy(r: Reader) -> SquidPolicy:
    """Read a ``squid:`` block of the providers config strictly into a :class:`SquidPolicy`.

    Shape (every key optional)::

        squid:
          allowedSourceRanges: [10.0.0.0/8]   # default: RFC 1918 + loopback
          connectPorts: [443]                  # default: [443]
          basicAuth: true                      # default: false; htpasswd at DEFAULT_HTPASSWD_PATH

    Raises:
        app.validation.ConfigError: an unknown key, a bad CIDR, a port outside 1..65535.
    """
    ranges = r.str_list("allowedSourceRanges", list(DEFAULT_ALLOWED_RANGES))
    for i, cidr in enumerate(ranges):
        try:
            ipaddress.ip_network(cidr, strict=False)
        except ValueError:
            raise r.error(f"allowedSourceRanges[{i}]", f"{cidr!r} is not a CIDR range") from None
    if not ranges:
        raise r.error("allowedSourceRanges", "must list at least one range")
    ports = r.raw("connectPorts", [443])
    if not isinstance(ports, list) or not ports:
        raise r.error("connectPorts", "must be a non-empty list of ports")
    for i, port in enumerate(ports):
        if isinstance(port, bool) or not isinstance(port, int) or not 1 <= port <= 65535:
            raise r.error(f"connectPorts[{i}]", f"must be a port number 1..65535, got {port!r}")
    basic = r.bool("basicAuth", False)
    r.done()
    return SquidPolicy(allowed_ranges=tuple(ranges), connect_ports=tuple(ports),
                       basic_auth_file=DEFAULT_HTPASSWD_PATH if basic else None)
