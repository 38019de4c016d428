"""The squid.conf every provider deploys (the proxies themselves).

One renderer for every provider, so a Pod, a GCE VM and a KVM guest run the same policy:
clients only from allowed source ranges, CONNECT only to allowed ports (443 by default),
plain HTTP only to allowed ports (80 and 443 by default), never to the instance's own
loopback, link-local addresses (the cloud metadata server), the metadata server's names or
operator-listed ranges (cluster, VPC), optional basic auth, ``Proxy-Authorization`` never
forwarded to the origin, no caching, logs to stdio.

Destination policy (docs/security.md):

* :data:`METADATA_NAME_PATTERNS` (``metadata.google.internal``, ``metadata.goog``, ``metadata``,
  any case, with or without the trailing dot) are refused by name, before any ACL that needs
  DNS, and :data:`METADATA_ADDRESSES` by address; neither can be exempted.
* :data:`DEFAULT_DENIED_DESTINATIONS` (loopback, link-local, "this host") plus the configured
  ``deniedDestinations`` are refused by address after DNS resolution (Squid's ``dst`` ACL
  matches when *any* address of the name is in a range, so a name that resolves to
  ``127.0.0.1`` is refused as well); ``allowedDestinations`` exempts ranges from both lists
  (a test origin on loopback, an on-purpose internal service).
* ``forwarded_for delete`` stays: GCE's metadata server refuses requests that carry
  ``X-Forwarded-For`` (https://cloud.google.com/compute/docs/metadata/querying-metadata), but
  sending the header would give every origin the crawler's address (``on``) or mark every
  request as proxied (``off`` sends ``unknown``).  The ACLs above are what keeps the
  metadata server out of reach; docs/security.md records the trade-off.

Squid ACL reference: https://www.squid-cache.org/Doc/config/acl/ and
https://www.squid-cache.org/Doc/config/http_access/.

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

from app.config.validation import Reader

#: Reply header the proxy adds to every error reply it generates itself: Squid's error code
#: (``ERR_ACCESS_DENIED``), so a client tells the proxy's refusal from the site's answer (a
#: site's own header of that name is removed).
ERROR_HEADER = "X-Proxy-Operator-Error"
#: Reply header the proxy adds when one of its ``http_access`` rules refused the request: the
#: rule's class, a key of :data:`DENY_RULES` (a site's own header of that name is removed).
DENIED_HEADER = "X-Proxy-Operator-Denied"
#: The classes of ``http_access deny`` rules :func:`render` writes and what each refuses.  The
#: basic-auth rule has none: it answers ``407`` (Squid challenges only when the auth ACL ends
#: the rule, https://www.squid-cache.org/Doc/config/http_access/).
DENY_RULES = {
    "source": "the client's address is outside the proxy's allowedSourceRanges",
    "manager": "Squid's cache manager",
    "connect-port": "a CONNECT to a port outside connectPorts",
    "http-port": "a plain-HTTP request to a port outside httpPorts",
    "metadata-name": "a cloud metadata server's name",
    "unresolved": "a destination name that does not resolve when the request is checked",
    "metadata-address": "a cloud metadata server's address",
    "destination": "a denied destination address (loopback, link-local or deniedDestinations)",
    "default": "no rule allowed the request",
}
#: Squid's errors (the ``ERR_*`` names of Squid 5.7's ``errors/templates`` its ``squid_error``
#: ACL accepts, which Squid 6 keeps): the replies :data:`ERROR_HEADER` marks.
SQUID_ERRORS = (
    "ERR_ACCESS_DENIED", "ERR_CACHE_ACCESS_DENIED", "ERR_CACHE_MGR_ACCESS_DENIED", "ERR_CANNOT_FORWARD",
    "ERR_CONFLICT_HOST",
    "ERR_CONNECT_FAIL", "ERR_DIR_LISTING", "ERR_DNS_FAIL", "ERR_ESI", "ERR_FORWARDING_DENIED",
    "ERR_FTP_DISABLED", "ERR_FTP_FAILURE", "ERR_FTP_FORBIDDEN", "ERR_FTP_NOT_FOUND", "ERR_FTP_PUT_CREATED",
    "ERR_FTP_PUT_ERROR", "ERR_FTP_PUT_MODIFIED", "ERR_FTP_UNAVAILABLE", "ERR_GATEWAY_FAILURE",
    "ERR_ICAP_FAILURE", "ERR_INVALID_REQ", "ERR_INVALID_RESP", "ERR_INVALID_URL", "ERR_LIFETIME_EXP",
    "ERR_NO_RELAY", "ERR_ONLY_IF_CACHED_MISS", "ERR_PRECONDITION_FAILED", "ERR_PROTOCOL_UNKNOWN",
    "ERR_READ_ERROR", "ERR_READ_TIMEOUT", "ERR_SECURE_CONNECT_FAIL", "ERR_SHUTTING_DOWN",
    "ERR_SOCKET_FAILURE", "ERR_TOO_BIG", "ERR_UNSUP_HTTPVERSION", "ERR_UNSUP_REQ", "ERR_URN_RESOLVE",
    "ERR_WRITE_ERROR", "ERR_ZERO_SIZE_OBJECT",
)

#: RFC 1918 + loopback: the default client ranges when a provider sets none.
DEFAULT_ALLOWED_RANGES = ("10.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16", "127.0.0.0/8")
#: Destination ports of plain-HTTP requests (``http://`` and ``https://`` URLs sent as GET,
#: POST, ...) when a provider sets no ``httpPorts``.  CONNECT has its own list (``connectPorts``).
DEFAULT_HTTP_PORTS: tuple[int | str, ...] = (80, 443)
#: Destinations every proxy refuses unless ``allowedDestinations`` exempts them: the
#: instance's own loopback, "this host" (``0.0.0.0`` reaches local listeners on Linux) and
#: link-local addresses (cloud metadata servers live at 169.254.169.254).
DEFAULT_DENIED_DESTINATIONS = ("127.0.0.0/8", "0.0.0.0/8", "169.254.0.0/16", "::1/128", "::/128", "fe80::/10")
#: Metadata-server addresses, refused whatever ``allowedDestinations`` says: GCE/AWS/Azure
#: IPv4 and AWS's IPv6 instance metadata endpoint.
METADATA_ADDRESSES = ("169.254.169.254/32", "fd00:ec2::254/128")
#: Metadata-server names (Squid ``dstdom_regex``, case-insensitive, no reverse DNS), refused
#: whatever ``allowedDestinations`` says, before any rule that needs DNS.
METADATA_NAME_PATTERNS = (r"(^|\.)metadata\.google\.internal\.?$", r"(^|\.)metadata\.goog\.?$", r"^metadata\.?$")
#: Where providers put the htpasswd file inside an instance when basic auth is on: a file of its
#: own directory, so that the kubernetes provider mounts the Secret volume on the directory (no
#: ``subPath``: the kubelet updates it when the Secret changes, and ``basic_ncsa_auth`` re-reads
#: a file whose modification time changed).
DEFAULT_HTPASSWD_PATH = "/etc/squid/proxy-operator-auth/htpasswd"
#: Default seconds Squid trusts a user:password pair its helper accepted (``credentialsttl``):
#: after a password rotation the old one keeps working at most this long once the instance's
#: htpasswd file has changed.
DEFAULT_CREDENTIALS_TTL = 60
#: Keys of the credentials Secret (:func:`credentials_secret`).
SECRET_USERNAME_KEY, SECRET_PASSWORD_KEY, SECRET_HTPASSWD_KEY = "username", "password", "htpasswd"


@dataclass(frozen=True)
class SquidPolicy:
    """What a proxy accepts.

    Attributes:
        allowed_ranges: client CIDRs allowed to use the proxy (anything else gets 403).
        connect_ports: ports CONNECT may reach (anything else gets 403): numbers, or
            ``"low-high"`` ranges (Squid's ``port`` ACL syntax).
        basic_auth_file: path of an htpasswd file inside the instance to require basic auth,
            or ``None`` for none.
        extra: directives appended after the policy (e.g. ``tcp_outgoing_address``).
        http_ports: ports a plain-HTTP request may reach (anything else gets 403); same forms
            as ``connect_ports``.
        denied_destinations: CIDRs refused in addition to :data:`DEFAULT_DENIED_DESTINATIONS`
            (the cluster's Pod and Service ranges, the VPC).
        allowed_destinations: CIDRs exempted from :data:`DEFAULT_DENIED_DESTINATIONS` and
            ``denied_destinations`` (never from :data:`METADATA_ADDRESSES` or
            :data:`METADATA_NAME_PATTERNS`): a loopback origin in tests, an internal service a
            proxy must reach on purpose.
        credentials_ttl: seconds Squid trusts a pair its basic-auth helper accepted
            (``auth_param basic credentialsttl``; 1..3600): the bound on an old password after
            a rotation reached the instance.
    Raises:
        ValueError: a bad CIDR, a port outside 1..65535 or a malformed port range.
    """

    allowed_ranges: tuple[str, ...] = DEFAULT_ALLOWED_RANGES
    connect_ports: tuple[int | str, ...] = (443,)
    basic_auth_file: str | None = None
    extra: tuple[str, ...] = field(default_factory=tuple)
    http_ports: tuple[int | str, ...] = DEFAULT_HTTP_PORTS
    denied_destinations: tuple[str, ...] = ()
    allowed_destinations: tuple[str, ...] = ()
    credentials_ttl: int = DEFAULT_CREDENTIALS_TTL

    def __post_init__(self) -> None:
        if not 1 <= int(self.credentials_ttl) <= 3600:
            raise ValueError(f"credentials TTL must be 1..3600 seconds, got {self.credentials_ttl}")
        for cidr in (*self.allowed_ranges, *self.denied_destinations, *self.allowed_destinations):
            ipaddress.ip_network(cidr, strict=False)  # raises ValueError naming the bad range
        for port in (*self.connect_ports, *self.http_ports):
            port_spec(port)


def port_spec(port: int | str) -> str:
    """Return ``port`` as a Squid ``port`` ACL value: ``"443"`` or ``"1024-65535"``.

    Args:
        port: a number 1..65535 or a string ``"low-high"`` with 1 <= low <= high <= 65535.
    Raises:
        ValueError: anything else.
    """
    if isinstance(port, bool):
        raise ValueError(f"not a port: {port!r}")
    if isinstance(port, int):
        if not 1 <= port <= 65535:
            raise ValueError(f"port out of range: {port}")
        return str(port)
    if isinstance(port, str):
        low, sep, high = port.partition("-")
        if low.isdigit() and (not sep or high.isdigit()):
            lo, hi = int(low), int(high) if sep else int(low)
            if 1 <= lo <= hi <= 65535:
                return f"{lo}-{hi}" if sep else str(lo)
    raise ValueError(f"not a port or a low-high port range within 1..65535: {port!r}")


def render(port: int, policy: SquidPolicy | None = None, *, listen_address: str | None = None,
           overrides: tuple[str, ...] = ()) -> str:
    """Return a complete squid.conf.

    Rule order (first match wins, https://www.squid-cache.org/Doc/config/http_access/): clients
    outside the source ranges; the cache manager; CONNECT and plain-HTTP ports; metadata names
    (``dstdom_regex -n``: no reverse DNS, so an IP-literal request never waits on DNS);
    authentication; then the address rules (``dst``: resolves the name, after authentication
    so an unauthenticated client cannot make the proxy resolve names), the first of which
    refuses (403, Squid's ``ERR_DNS_FAIL`` page) a name that does not resolve now, so a
    failed lookup never lets a request past the address rules.  Every error reply of the
    proxy's own carries :data:`ERROR_HEADER`, and a refusal by a deny rule :data:`DENIED_HEADER`
    (the rule's class, :data:`DENY_RULES`).

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
    denied = (*DEFAULT_DENIED_DESTINATIONS, *policy.denied_destinations)
    lines = [
        "# rendered by proxy-operator (app/squid/conf.py)",
        f"http_port {listen}",
        "acl allowed_src src " + " ".join(policy.allowed_ranges),
        "acl connect_ports port " + " ".join(port_spec(p) for p in policy.connect_ports),
        "acl http_ports port " + " ".join(port_spec(p) for p in policy.http_ports),
        "acl CONNECT method CONNECT",
        "acl metadata_names dstdom_regex -n -i " + " ".join(METADATA_NAME_PATTERNS),
        "acl metadata_dst dst " + " ".join(METADATA_ADDRESSES),
        "acl denied_dst dst " + " ".join(denied),
        # Matches once the name resolved to any address: Squid 5.7 evaluates a ``dst`` ACL
        # whose lookup failed as "no match" (DestinationIp.cc: "can't yet compare"), so
        # without this rule a resolver outage turned every deny rule below into a no-op and
        # the request went on to be resolved again when forwarded.
        "acl dst_resolved dst all",
    ]
    if policy.allowed_destinations:
        lines.append("acl allowed_dst dst " + " ".join(policy.allowed_destinations))
    # Each deny rule ends with an ACL that always matches and annotates the transaction with the
    # rule's class (Squid's annotate_transaction, evaluated only once the rule's other ACLs
    # matched); the reply then carries it (DENIED_HEADER), and every error page Squid makes its
    # code (ERROR_HEADER).
    lines += [f"acl rule_{name.replace('-', '_')} annotate_transaction proxy_operator_rule={name}"
              for name in DENY_RULES]
    lines.append("deny_info ERR_DNS_FAIL rule_unresolved")  # the last ACL of a deny line names its page
    lines += [
        "acl proxy_operator_denied note proxy_operator_rule",
        "acl proxy_operator_error squid_error " + " ".join(SQUID_ERRORS),
        # Source ranges first: a client outside them gets 403, never an auth challenge.
        "http_access deny !allowed_src rule_source",
        "http_access deny manager rule_manager",
        "http_access deny CONNECT !connect_ports rule_connect_port",
        "http_access deny !CONNECT !http_ports rule_http_port",
        "http_access deny metadata_names rule_metadata_name",
    ]
    if policy.basic_auth_file:
        lines += [
            f"auth_param basic program /usr/lib/squid/basic_ncsa_auth {policy.basic_auth_file}",
            "auth_param basic realm proxy-operator",
            f"auth_param basic credentialsttl {int(policy.credentials_ttl)} seconds",
            "acl authenticated proxy_auth REQUIRED",
            "http_access deny !authenticated",
        ]
    lines += [
        "http_access deny !dst_resolved rule_unresolved",
        "http_access deny metadata_dst rule_metadata_address",
        ("http_access deny denied_dst !allowed_dst rule_destination" if policy.allowed_destinations
         else "http_access deny denied_dst rule_destination"),
        "http_access allow allowed_src",
        "http_access deny all rule_default",
        # The proxy's own marks: never a site's headers of those names.
        f"reply_header_access {ERROR_HEADER} deny all",
        f"reply_header_access {DENIED_HEADER} deny all",
        f'reply_header_add {ERROR_HEADER} "%err_code" proxy_operator_error',
        f'reply_header_add {DENIED_HEADER} "%{{proxy_operator_rule}}note" proxy_operator_denied',
        # Never pass the client's proxy credentials (or identity) on to the origin.
        "request_header_access Proxy-Authorization deny all",
        "forwarded_for delete",
        "via off",
        "cache deny all",
        # No ICMP pinger: Squid talks to it over a UDP socket on loopback, which the guests'
        # egress rules refuse to Squid's user (app/squid/egress.py), and Squid then never starts
        # ("ipcCreate: CHILD: hello write test failed"); nothing here uses its measurements.
        "pinger_enable off",
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


def credentials_secret(name: str, namespace: str, *, username: str, password: str,
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


#: Marks a value the operator must replace (deploy/default/providers.yaml ships
#: ``deniedDestinations`` as placeholders: the cluster's ranges differ from cluster to cluster).
PLACEHOLDER_WORD = "PLACEHOLDER"


def _cidrs(r: Reader, key: str, default: list[str] | None = None) -> list[str]:
    values = r.str_list(key, default)
    for i, cidr in enumerate(values):
        if PLACEHOLDER_WORD in str(cidr).upper():
            raise r.error(f"{key}[{i}]", f"{cidr!r} is a placeholder: replace it with a CIDR range "
                                         "(for deniedDestinations: this cluster's Pod and Service ranges, the VPC)")
        try:
            ipaddress.ip_network(cidr, strict=False)
        except ValueError:
            raise r.error(f"{key}[{i}]", f"{cidr!r} is not a CIDR range") from None
    return values


def _ports(r: Reader, key: str, default: list[int | str]) -> list[int | str]:
    ports = r.raw(key, default)
    if not isinstance(ports, list) or not ports:
        raise r.error(key, "must be a non-empty list of ports")
    for i, port in enumerate(ports):
        try:
            port_spec(port)
        except ValueError:
            raise r.error(f"{key}[{i}]", "must be a port number 1..65535 or a \"low-high\" range, "
                                         f"got {port!r}") from None
    return ports


def parse_policy(r: Reader) -> SquidPolicy:
    """Read a ``squid:`` block of the providers config strictly into a :class:`SquidPolicy`.

    Shape (every key optional)::

        squid:
          allowedSourceRanges: [10.0.0.0/8]   # default: RFC 1918 + loopback
          connectPorts: [443]                  # default: [443]
          httpPorts: [80, 443]                 # default: [80, 443]; "low-high" ranges allowed
          deniedDestinations: [10.0.0.0/8]     # added to loopback + link-local (always denied)
          allowedDestinations: [127.0.0.1/32]  # exempt from the denial (never the metadata server)
          basicAuth: true                      # default: false; htpasswd at DEFAULT_HTPASSWD_PATH
          credentialsTTL: 60s                  # default 60s (1s..1h): how long an old password
                                               # outlives a rotation that reached the instance

    Raises:
        app.config.validation.ConfigError: an unknown key, a bad CIDR, a port outside 1..65535 or a
            malformed port range, naming the file, the provider and the field
            (``squid.deniedDestinations[1]``).
    """
    ranges = _cidrs(r, "allowedSourceRanges", list(DEFAULT_ALLOWED_RANGES))
    if not ranges:
        raise r.error("allowedSourceRanges", "must list at least one range")
    connect = _ports(r, "connectPorts", [443])
    http = _ports(r, "httpPorts", list(DEFAULT_HTTP_PORTS))
    denied = _cidrs(r, "deniedDestinations")
    allowed = _cidrs(r, "allowedDestinations")
    basic = r.bool("basicAuth", False)
    ttl = r.duration("credentialsTTL", float(DEFAULT_CREDENTIALS_TTL))
    if not 1 <= ttl <= 3600 or ttl != int(ttl):
        raise r.error("credentialsTTL", "must be whole seconds between 1s and 1h")
    r.done()
    return SquidPolicy(allowed_ranges=tuple(ranges), connect_ports=tuple(connect),
                       basic_auth_file=DEFAULT_HTPASSWD_PATH if basic else None, http_ports=tuple(http),
                       denied_destinations=tuple(denied), allowed_destinations=tuple(allowed),
                       credentials_ttl=int(ttl))
