"""A resolver outage never lets a request past Squid's destination rules.

Real Squid (the product's squid.conf) in a private network namespace whose resolver is
:mod:`tests.support.flaky_dns` at the namespace's 127.0.0.1:53 (the test harness pins Squid's
``dns_nameservers`` there).  Names resolve to the metadata address, loopback, ``0.0.0.0``,
link-local, a ``deniedDestinations`` range and AWS's IPv6 metadata address, each of which has
an origin answering 200 in the namespace.  Squid 5.7 evaluated a ``dst`` ACL whose lookup
failed as "no match", so with the resolver failing the deny rules did nothing and the request
was forwarded (and resolved again).  The resolver fails, then flaps (fails each name's first
lookups, answers the next), then comes back: a denied name is refused by Squid every time and
its origin never sees a request.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from app.squid import conf as squid_conf
from devcluster.squid import SquidProcess
from tests.support.netns import NetNamespace, available
from tests.test_squid_destinations import CLIENT

pytestmark = [pytest.mark.timeout(180),
              pytest.mark.skipif(available() is not None, reason=str(available()))]

SQUID_ADDRESS = "10.77.0.1"
#: name -> the address it resolves to: every one is refused by the product's policy below.
DENIED_NAMES = {"metadata-ip.test": "169.254.169.254", "loopback.test": "127.0.0.1", "zero.test": "0.0.0.0",
                "link-local.test": "169.254.10.1", "internal.test": "10.77.0.2",
                "metadata-v6.test": "fd00:ec2::254"}
ORIGINS = ("169.254.169.254:80", "127.0.0.1:80", "169.254.10.1:80", "10.77.0.2:80",
           "[fd00:ec2::254]:80", "192.0.2.10:80")
POLICY = squid_conf.SquidPolicy(denied_destinations=("10.77.0.0/24",))


@pytest.fixture()
def rig(tmp_path):
    """The namespace, its origins, the flaky resolver (state file ``up``) and the product's Squid."""
    with NetNamespace(["10.77.0.1/24", "10.77.0.2/24", "192.0.2.10/24", "169.254.10.1/16",
                       "169.254.169.254/32", "fd00:ec2::254/128"]) as ns:
        state = tmp_path / "resolver-state"
        state.write_text("up")
        records = {**{f"{prefix}-{name}": addr for prefix in ("down", "flap", "back")
                      for name, addr in DENIED_NAMES.items()},
                   "ok.test": "192.0.2.10", "back-ok.test": "192.0.2.10"}
        resolver = ns.popen(sys.executable, "-m", "tests.support.flaky_dns", "127.0.0.1", json.dumps(records),
                            str(state), stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
                            cwd=str(__import__("pathlib").Path(__file__).resolve().parents[1]))
        assert resolver.stdout.readline().strip() == "READY"
        origin = ns.origin(*ORIGINS)
        squid = SquidProcess(SQUID_ADDRESS, 3128, squid_conf.render(3128, POLICY), netns=ns.name).start()
        try:
            yield ns, state, origin, resolver
        finally:
            squid.stop()


def get(ns, *urls: str) -> dict[str, tuple[int, str]]:
    """GET each URL through the Squid; return url -> (status, Squid's error page name or "")."""
    out = ns.run(sys.executable, "-c", CLIENT, SQUID_ADDRESS, json.dumps([[3128, "GET", u] for u in urls]),
                 capture_output=True, text=True, timeout=150)
    assert out.returncode == 0, out.stderr
    result = {}
    for url, (status, body) in zip(urls, json.loads(out.stdout)):
        page = next((w for w in body.replace("<", " ").replace(">", " ").split() if w.startswith("ERR_")), "")
        result[url] = (status, page)
    return result


def test_a_failing_resolver_never_opens_denied_destinations(rig):
    ns, state, origin, resolver = rig
    outcomes = {}
    # The resolver is down: every lookup fails.
    state.write_text("down")
    outcomes.update(get(ns, *(f"http://down-{name}/" for name in DENIED_NAMES)))
    # It flaps: each name's first lookups fail, the ones after are answered.
    state.write_text("flap 3")
    outcomes.update(get(ns, *(f"http://flap-{name}/" for name in DENIED_NAMES)))
    # It is back.
    state.write_text("up")
    back = get(ns, *(f"http://back-{name}/" for name in DENIED_NAMES), "http://back-ok.test/",
               *(f"http://down-{name}/" for name in DENIED_NAMES))
    ns.stop(origin)
    hits = [line.split()[1] for line in origin.stdout.read().splitlines() if line.startswith("HIT")]
    ns.stop(resolver)
    queries = resolver.stdout.read()

    assert back.pop("http://back-ok.test/")[0] == 200, "a normal name must still work once the resolver is back"
    outcomes.update(back)
    assert {url: o for url, o in outcomes.items() if o[0] != 403} == {}, (outcomes, queries)
    # A name that resolves is refused by the address rules (access denied); one that does not,
    # with Squid's DNS error page (Squid may remember the failure for negative_dns_ttl).
    assert {o[1] for url, o in back.items() if "//back-" in url} == {"ERR_ACCESS_DENIED"}, back
    assert {o[1] for o in outcomes.values()} <= {"ERR_ACCESS_DENIED", "ERR_DNS_FAIL"}, outcomes
    assert hits == ["192.0.2.10:80"], hits
    assert "SERVFAIL" in queries and "answer" in queries, queries
