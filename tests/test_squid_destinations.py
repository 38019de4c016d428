"""What a proxy may reach (docs/security.md), with the real Squid and the product's squid.conf.

Everything runs in a private network namespace (:mod:`tests.support.netns`): a dummy interface
carries an RFC 1918 address (Squid listens there; the client connects from it), a "normal"
origin at 10.77.0.2 and 192.0.2.10, a link-local address 169.254.10.1 and the metadata
address 169.254.169.254; a tiny origin answers on all of them and on the namespace's own
loopback.  Squid runs in the namespace with the squid.conf ``app.squid.conf.render`` makes from a
providers-config ``squid:`` block parsed by the real config loader; the client is a raw HTTP
client run inside the namespace, so every status is Squid's own answer.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from app.squid import conf as squid_conf
from app.wiring import parse_config as parse
from devcluster.squid import SQUID_BIN, SquidProcess
from tests.support.netns import NetNamespace, available

pytestmark = [pytest.mark.timeout(120),
              pytest.mark.skipif(available() is not None, reason=str(available()))]

SQUID_ADDRESS = "10.77.0.1"
ORIGINS = ("127.0.0.1:80", "10.77.0.2:80", "10.77.0.2:8080", "192.0.2.10:80", "169.254.10.1:80",
           "169.254.169.254:80")

#: Runs inside the namespace: sends each request of argv[1] (JSON list of [port, method,
#: target]) to Squid at SQUID_ADDRESS, prints a JSON list of [status, body].
CLIENT = r'''
import json, socket, sys
from urllib.parse import urlsplit
out = []
for port, method, target in json.loads(sys.argv[2]):
    s = socket.create_connection((sys.argv[1], port), timeout=15)
    if method == "CONNECT":
        head = f"CONNECT {target} HTTP/1.1\r\nHost: {target}\r\n\r\n"
    else:
        head = f"{method} {target} HTTP/1.1\r\nHost: {urlsplit(target).netloc}\r\nConnection: close\r\n\r\n"
    s.sendall(head.encode())
    data = b""
    while b"\r\n\r\n" not in data or method != "CONNECT":
        chunk = s.recv(65536)
        if not chunk:
            break
        data += chunk
    s.close()
    status = int(data.split(b" ", 2)[1]) if data.startswith(b"HTTP/") else 0
    out.append([status, data.partition(b"\r\n\r\n")[2].decode("utf-8", "replace")])
print(json.dumps(out))
'''


def squid_block(port: int, block: dict) -> str:
    """Render a squid.conf from a providers-config ``squid:`` block, through the real loader."""
    config = parse({"providers": [{"name": "k8s", "type": "kubernetes", "squid": block}]}, "providers.yaml")
    return squid_conf.render(port, config.providers[0].squid)


@pytest.fixture(scope="module")
def ns():
    with NetNamespace(["10.77.0.1/24", "10.77.0.2/24", "192.0.2.10/24", "169.254.10.1/16",
                       "169.254.169.254/32"]) as namespace:
        yield namespace


@pytest.fixture()
def origin(ns):
    """The origin on every address of :data:`ORIGINS`, fresh for each test (its stdout logs the hits)."""
    proc = ns.origin(*ORIGINS)
    yield proc
    ns.stop(proc)


def hits(ns, origin) -> list[str]:
    """Stop ``origin``; return the ``address:port`` of every request it served, in order."""
    ns.stop(origin)
    return [line.split()[1] for line in origin.stdout.read().splitlines() if line.startswith("HIT")]


@pytest.fixture(scope="module")
def squids(ns):
    """Three Squids in the namespace: the product default, one with exemptions, one denying 10.77.0.0/24."""
    blocks = {3128: {},
              3129: {"allowedDestinations": ["169.254.10.1/32", "127.0.0.1/32", "169.254.169.254/32"],
                     "httpPorts": [80, 8080]},
              3130: {"deniedDestinations": ["10.77.0.0/24"]}}
    started = []
    try:
        for port, block in blocks.items():
            started.append(SquidProcess(SQUID_ADDRESS, port, squid_block(port, block), netns=ns.name).start())
        yield {s.port: s for s in started}
    finally:
        for s in started:
            s.stop()


def through(ns, *requests: tuple[int, str, str]) -> list[tuple[int, str]]:
    """Send ``(squid port, method, target)`` requests from inside the namespace; return ``(status, body)``."""
    out = ns.run(sys.executable, "-c", CLIENT, SQUID_ADDRESS, json.dumps(requests),
                 capture_output=True, text=True, timeout=90)
    assert out.returncode == 0, out.stderr
    return [tuple(r) for r in json.loads(out.stdout)]


def statuses(ns, port: int, targets: list[str], method: str = "GET") -> dict[str, int]:
    return {t: status for t, (status, _) in zip(targets, through(ns, *[(port, method, t) for t in targets]))}


DENIED_BY_DEFAULT = [
    "http://127.0.0.1/", "http://localhost/", "http://127.1/", "http://[::ffff:127.0.0.1]/", "http://0.0.0.0/",
    "http://[::1]/", "http://169.254.10.1/", "http://169.254.169.254/computeMetadata/v1/",
    "http://metadata.google.internal/computeMetadata/v1/", "http://METADATA.GOOGLE.INTERNAL./",
    "http://metadata/computeMetadata/v1/", "http://metadata.goog/", "http://10.77.0.2:8080/",
    f"http://{SQUID_ADDRESS}:3128/squid-internal-mgr/info",
]


def test_the_default_policy_refuses_loopback_link_local_metadata_and_other_ports(ns, origin, squids):
    got = statuses(ns, 3128, DENIED_BY_DEFAULT)
    assert got == {t: 403 for t in DENIED_BY_DEFAULT}
    connects = statuses(ns, 3128, ["169.254.169.254:443", "127.0.0.1:443", "169.254.10.1:443"], "CONNECT")
    assert set(connects.values()) == {403}, connects


def test_a_normal_origin_still_works_and_learns_nothing_about_the_client(ns, origin, squids):
    [(status, body), (status2, body2)] = through(ns, (3128, "GET", "http://10.77.0.2/page"),
                                                (3128, "GET", "http://192.0.2.10/page"))
    assert (status, status2) == (200, 200)
    seen = json.loads(body)
    assert seen["server"] == "10.77.0.2:80" and json.loads(body2)["server"] == "192.0.2.10:80"
    headers = {k.lower() for k in seen["headers"]}
    assert "x-forwarded-for" not in headers and "via" not in headers  # forwarded_for delete, via off


def test_allowed_destinations_exempt_on_purpose_but_never_the_metadata_server(ns, origin, squids):
    # Everything here happens inside the test's own network namespace (fixed ports and
    # addresses cannot collide with another run); 127.0.0.2 is refused without a connection.
    got = statuses(ns, 3129, ["http://169.254.10.1/", "http://127.0.0.1/", "http://10.77.0.2:8080/",
                              "http://169.254.169.254/computeMetadata/v1/", "http://metadata.google.internal/",
                              "http://127.0.0.2/", "http://10.77.0.2:443/"])
    assert got == {"http://169.254.10.1/": 200, "http://127.0.0.1/": 200, "http://10.77.0.2:8080/": 200,
                   "http://169.254.169.254/computeMetadata/v1/": 403, "http://metadata.google.internal/": 403,
                   "http://127.0.0.2/": 403, "http://10.77.0.2:443/": 403}


def test_denied_destinations_add_cluster_and_vpc_ranges(ns, origin, squids):
    got = statuses(ns, 3130, ["http://10.77.0.2/", "http://192.0.2.10/"])
    assert got == {"http://10.77.0.2/": 403, "http://192.0.2.10/": 200}


def test_refused_requests_never_reach_their_origin(ns, origin, squids):
    statuses(ns, 3128, DENIED_BY_DEFAULT)
    statuses(ns, 3129, ["http://169.254.169.254/computeMetadata/v1/", "http://metadata.google.internal/"])
    assert through(ns, (3128, "GET", "http://10.77.0.2/marker"))[0][0] == 200
    assert hits(ns, origin) == ["10.77.0.2:80"], "only the allowed request reached an origin"


def test_the_rendered_rules_parse_and_deny_names_before_any_dns_rule(tmp_path):
    conf = squid_block(3128, {"deniedDestinations": ["10.0.0.0/8", "fd00::/8"],
                              "allowedDestinations": ["127.0.0.1/32"], "httpPorts": [80, "8000-8999"]})
    lines = conf.splitlines()
    # Names first (no DNS: -n), then the address rules, which resolve names.
    assert (lines.index("http_access deny metadata_names rule_metadata_name")
            < lines.index("http_access deny metadata_dst rule_metadata_address"))
    assert "acl metadata_names dstdom_regex -n -i" in conf
    assert "acl http_ports port 80 8000-8999" in conf
    assert ("acl denied_dst dst 127.0.0.0/8 0.0.0.0/8 169.254.0.0/16 ::1/128 ::/128 fe80::/10 "
            "10.0.0.0/8 fd00::/8") in conf
    assert "http_access deny denied_dst !allowed_dst" in conf
    path = tmp_path / "squid.conf"
    path.write_text(conf.replace("pid_filename /tmp/squid.pid", f"pid_filename {tmp_path}/squid.pid"))
    out = subprocess.run([SQUID_BIN, "-k", "parse", "-f", str(path)], capture_output=True, text=True, timeout=30)
    assert out.returncode == 0, out.stderr
    # (Squid's complaints start "ERROR:"; the error names the config lists, ERR_READ_ERROR..., do not)
    assert "ERROR:" not in out.stderr and "FATAL" not in out.stderr


# -- every other spelling of loopback, link-local and the metadata server ------------------------
# Every alternative spelling of loopback, link-local and the metadata server that glibc or Squid
# accepts, IPv4-mapped IPv6 forms, other schemes and the cache manager: the door held (403 for
# each, nothing reached an origin); these pin it.
ALTERNATIVE_SPELLINGS = [
    "http://2130706433/", "http://0x7f000001/", "http://0177.0.0.1/", "http://0x7f.1/", "http://127.0.0.1./",
    "http://[::ffff:7f00:1]/", "http://[0:0:0:0:0:ffff:127.0.0.1]/", "http://[::ffff:0.0.0.0]/", "http://0/",
    "http://2852039166/", "http://0xa9fea9fe/", "http://169.254.43518/", "http://0251.0376.0251.0376/",
    "http://[::ffff:a9fe:a9fe]/", "http://[::ffff:169.254.169.254]/", "http://[fd00:ec2::254]/",
    "http://metadata.google.internal:80/", "http://user@127.0.0.1/", "http://localhost./", "http://LOCALHOST/",
    "cache_object://10.77.0.1/info", "cache_object://127.0.0.1/info", "http://10.77.0.1:3128/squid-internal-mgr/menu",
    "ftp://127.0.0.1/", "ftp://169.254.169.254:80/", "whois://127.0.0.1:80/", "https://127.0.0.1:443/",
]
ALTERNATIVE_CONNECTS = ["2130706433:443", "127.1:443", "[::ffff:7f00:1]:443", "[::1]:443", "[::ffff:a9fe:a9fe]:443",
                        "metadata.google.internal.:443", "10.77.0.1:3128"]


def test_squid_refuses_every_other_spelling_of_loopback_link_local_and_metadata():
    with NetNamespace(["10.77.0.1/24", "10.77.0.2/24", "169.254.10.1/16", "169.254.169.254/32",
                       "fd00:ec2::254/128"]) as ns:
        origin = ns.origin("127.0.0.1:80", "10.77.0.2:80", "169.254.169.254:80", "[::1]:80", "[fd00:ec2::254]:80")
        with SquidProcess(SQUID_ADDRESS, 3128, squid_block(3128, {}), netns=ns.name):
            got = statuses(ns, 3128, ALTERNATIVE_SPELLINGS)
            connects = statuses(ns, 3128, ALTERNATIVE_CONNECTS, "CONNECT")
            normal = statuses(ns, 3128, ["http://10.77.0.2/marker"])
        ns.stop(origin)
        seen = [line.split()[1] for line in origin.stdout.read().splitlines() if line.startswith("HIT")]
    assert got == {t: 403 for t in ALTERNATIVE_SPELLINGS}
    assert connects == {t: 403 for t in ALTERNATIVE_CONNECTS}
    assert normal == {"http://10.77.0.2/marker": 200}
    assert seen == ["10.77.0.2:80"], "only the allowed request reached an origin"
