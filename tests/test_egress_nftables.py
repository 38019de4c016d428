"""The VM guests' egress rules (app/squid/egress.py) with the real nft, in a private network namespace.

The namespace carries the metadata address, a link-local address, a ``deniedDestinations``
range, an ordinary address and AWS's IPv6 metadata address, with an origin on each (and on
loopback).  The rules are loaded by the product's own install function
(:data:`app.squid.egress.INSTALL_EGRESS_SH`, the one the gcp startup script and the kvm vendor-data
script run) from :func:`app.squid.egress.nftables_rules`, the text both providers ship.  A client
running as Squid's user (``proxy``) is refused where the rules say, one running as ``nobody``
is not; a real Squid, running as ``proxy`` with a squid.conf that allows everything, cannot
fetch the metadata server or the denied range: no Squid ACL decides any more.
"""

from __future__ import annotations

import json
import os
import pwd
import shutil
import sys

import pytest

from app.squid import egress, conf as squid_conf
from tests.support.netns import NetNamespace, available
from devcluster.squid import SquidProcess
from tests.test_squid_destinations import CLIENT

NFT = shutil.which("nft", path="/usr/sbin:/usr/bin:/sbin")
SETPRIV = shutil.which("setpriv") or "/usr/bin/setpriv"
#: The system Python: a process switched to another user cannot read a Python under /root.
SYSTEM_PYTHON = "/usr/bin/python3"

pytestmark = [pytest.mark.timeout(120),
              pytest.mark.skipif(available() is not None, reason=str(available())),
              pytest.mark.skipif(NFT is None, reason="needs nftables (nft)"),
              pytest.mark.skipif(not os.path.exists(SYSTEM_PYTHON), reason="needs /usr/bin/python3")]

POLICY = squid_conf.SquidPolicy(denied_destinations=("10.77.0.0/24",),
                                allowed_destinations=("127.0.0.2/32", "169.254.169.254/32"))
ORIGINS = ("169.254.169.254:80", "169.254.169.254:53", "169.254.10.1:80", "10.77.0.2:80", "192.0.2.10:80",
           "127.0.0.1:80", "127.0.0.2:80", "[fd00:ec2::254]:80", "[2001:db8::10]:80")
#: Where Squid's user may connect under POLICY, and where not.
REACHABLE = {"192.0.2.10:80", "127.0.0.2:80", "[2001:db8::10]:80", "169.254.169.254:53"}
REFUSED = {"169.254.169.254:80", "169.254.10.1:80", "10.77.0.2:80", "127.0.0.1:80", "[fd00:ec2::254]:80"}

#: Runs as the user under test: GET / on each address:port, prints {target: status or error}.
CONNECT = r'''
import json, socket, sys
out = {}
for target in sys.argv[1:]:
    host, _, port = target.rpartition(":")
    try:
        with socket.create_connection((host.strip("[]"), int(port)), timeout=5) as s:
            s.sendall(b"GET / HTTP/1.0\r\n\r\n")
            out[target] = s.recv(64).split(b" ")[1].decode()
    except OSError as exc:
        out[target] = type(exc).__name__
print(json.dumps(out))
'''


@pytest.fixture()
def ns(tmp_path):
    """The namespace with its origins and the product's rules loaded by the product's install function."""
    with NetNamespace(["10.77.0.1/24", "10.77.0.2/24", "192.0.2.10/24", "169.254.10.1/16", "169.254.169.254/32",
                       "fd00:ec2::254/128", "2001:db8::10/64"]) as namespace:
        namespace.run("ip", "addr", "add", "127.0.0.2/8", "dev", "lo", check=False, capture_output=True)
        rules = tmp_path / "rules.nft"
        rules.write_text(egress.nftables_rules(POLICY))
        script = egress.INSTALL_EGRESS_SH + '\npkg_install() { return 1; }\ninstall_egress "$1"\n'
        env = {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin",
               "PROXY_OPERATOR_EGRESS_RULES": str(tmp_path / "etc/squid-egress.nft"),
               "PROXY_OPERATOR_SQUID_DROPIN_DIR": str(tmp_path / "squid.service.d")}
        out = namespace.run("/bin/sh", "-c", script, "install", str(rules), env=env, capture_output=True,
                            text=True, timeout=30)
        assert out.returncode == 0, out.stderr
        namespace.origin_proc = namespace.origin(*ORIGINS)
        namespace.tmp = tmp_path
        yield namespace


def connect_as(ns, user: str, targets) -> dict[str, str]:
    entry = pwd.getpwnam(user)
    out = ns.run(SETPRIV, f"--reuid={entry.pw_uid}", f"--regid={entry.pw_gid}", "--clear-groups", SYSTEM_PYTHON,
                 "-c", CONNECT,
                 *targets, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


def test_squids_user_cannot_connect_to_denied_addresses_but_other_users_can(ns):
    as_squid = connect_as(ns, "proxy", ORIGINS)
    assert {t for t, r in as_squid.items() if r == "200"} == REACHABLE, as_squid
    assert {t: as_squid[t] for t in REFUSED} == {t: "ConnectionRefusedError" for t in REFUSED}, as_squid
    assert connect_as(ns, "nobody", ORIGINS) == {t: "200" for t in ORIGINS}
    # What the guest keeps: the rules with Squid's uid, and the drop-in that loads them before Squid.
    uid = pwd.getpwnam("proxy").pw_uid
    installed = ns.tmp / "etc/squid-egress.nft"
    assert installed.read_text() == f"define squid_uid = {uid}\n" + egress.nftables_rules(POLICY)
    assert (ns.tmp / "squid.service.d/proxy-operator-egress.conf").read_text() == \
        f"[Service]\nExecStartPre={NFT} -f {installed}\n"
    listed = ns.run(NFT, "list", "table", "inet", egress.TABLE, capture_output=True, text=True, check=True).stdout
    assert f"meta skuid != {uid} accept" in listed or "meta skuid != proxy accept" in listed, listed


def test_loading_twice_replaces_the_table(ns):
    before = ns.run(NFT, "list", "ruleset", capture_output=True, text=True, check=True).stdout
    ns.run(NFT, "-f", str(ns.tmp / "etc/squid-egress.nft"), check=True)
    assert ns.run(NFT, "list", "ruleset", capture_output=True, text=True, check=True).stdout == before


def test_a_squid_whose_acls_allow_everything_still_cannot_reach_denied_addresses(ns):
    # The stand-in for any Squid ACL quirk: a squid.conf with no destination rule at all.
    conf = "http_port 3128\nhttp_access allow all\ncache deny all\n"
    squid = SquidProcess("10.77.0.1", 3128, conf, netns=ns.name).start()
    try:
        targets = ["http://169.254.169.254/computeMetadata/v1/", "http://10.77.0.2/", "http://169.254.10.1/",
                   "http://192.0.2.10/"]
        out = ns.run(sys.executable, "-c", CLIENT, "10.77.0.1", json.dumps([[3128, "GET", t] for t in targets]),
                     capture_output=True, text=True, timeout=60)
        assert out.returncode == 0, out.stderr
        statuses = {t: r[0] for t, r in zip(targets, json.loads(out.stdout))}
    finally:
        squid.stop()
    assert statuses.pop("http://192.0.2.10/") == 200, statuses  # Squid's replies to its clients pass
    assert all(code in (502, 503) for code in statuses.values()), statuses
    ns.stop(ns.origin_proc)
    hits = [line.split()[1] for line in ns.origin_proc.stdout.read().splitlines() if line.startswith("HIT")]
    assert hits == ["192.0.2.10:80"], hits


def test_the_products_squid_starts_under_the_rules(ns):
    """Squid as a guest's systemd unit starts it (``--foreground -sYC``, its kid processes and
    helpers) with the product's squid.conf, basic auth included, while the rules are loaded: a
    helper Squid reaches over loopback (its ICMP pinger) would leave it hanging before it ever
    listens (the real-guest test saw the unit time out)."""
    import pathlib
    import subprocess
    import tempfile
    import time

    work = pathlib.Path(tempfile.mkdtemp(prefix="squid-egress-"))  # (pytest's tmp_path: root only)
    os.chmod(work, 0o777)
    (work / "htpasswd").write_text(squid_conf.htpasswd_entry("crawler", "secret") + "\n")
    os.chmod(work / "htpasswd", 0o644)
    policy = squid_conf.SquidPolicy(basic_auth_file=str(work / "htpasswd"),
                                    denied_destinations=POLICY.denied_destinations)
    conf = squid_conf.render(3128, policy, overrides=(f"pid_filename {work}/squid.pid",
                                                      f"cache_log {work}/cache.log", "access_log none"))
    (work / "squid.conf").write_text(conf)
    proc = subprocess.Popen(["ip", "netns", "exec", ns.name, "/usr/sbin/squid", "--foreground", "-sYC", "-f",
                             str(work / "squid.conf")], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline, log = time.monotonic() + 30, ""
        while time.monotonic() < deadline and "Accepting HTTP Socket connections" not in log:
            time.sleep(0.3)
            log = (work / "cache.log").read_text() if (work / "cache.log").exists() else ""
        assert "Accepting HTTP Socket connections" in log, log
        assert "hello write test failed" not in log, log
    finally:
        proc.terminate()
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            proc.kill()
        shutil.rmtree(work, ignore_errors=True)
