"""Adversarial review of issue 10 ("Close the doors"), with real parts.

A hostile crawler, a hostile Proxy author and a Pod that got into Redis, each trying the doors
of docs/security.md another way: the real Squid with the product's squid.conf in a network
namespace, the real probe against real listeners, the Compute fake, the Kubernetes API fake
and real Redis.  Tests that pin a hole still open are ``xfail(strict=True)`` with the reason;
the others are regression tests (the hole they name was fixed alongside them, or the door held
and the test keeps it so).
"""

from __future__ import annotations

import socket
import threading

import pytest

from app.proxy import gc as gc_logic
from app.probes import probe as p
from app.probes.destinations import DestinationPolicy, parse_ranges
from app.kube.gateway import KubernetesGateway
from app.providers.naming import instance_name
from app.providers.base import CreateRequest
from app.errors import SpecNotAllowed
from app.config.validation import ConfigError
from tests.support.netns import available

pytestmark = pytest.mark.timeout(120)


# -- a hostile crawler against the real Squid ------------------------------------------------------
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


@pytest.mark.skipif(available() is not None, reason=str(available()))
def test_squid_refuses_every_other_spelling_of_loopback_link_local_and_metadata():
    from tests.support.netns import NetNamespace
    from devcluster.squid import SquidProcess
    from tests.test_squid_destinations import SQUID_ADDRESS, squid_block, statuses

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


# -- a hostile Proxy author: the probe as a banner grabber -------------------------------------------
class _Talker:
    """A TCP listener on loopback that answers every connection with ``reply`` and closes."""

    def __init__(self, reply: bytes) -> None:
        self.reply = reply
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        self._stop = False
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        while not self._stop:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            with conn:
                conn.settimeout(5)
                try:
                    conn.recv(65536)
                    conn.sendall(self.reply)
                except OSError:
                    pass

    def close(self) -> None:
        self._stop = True
        self.sock.close()


@pytest.fixture()
def talker():
    made: list[_Talker] = []

    def start(reply: bytes) -> _Talker:
        made.append(_Talker(reply))
        return made[-1]

    yield start
    for t in made:
        t.close()


BANNER = b"secret-banner-7f3a"
#: How the test suite lets probes reach loopback (production denies it; the point here is what
#: a reachable non-proxy service leaks, e.g. one in the cluster's ranges).
LOOPBACK_ALLOWED = DestinationPolicy(allowed=parse_ranges("127.0.0.0/8"))


@pytest.mark.parametrize("reply", [
    b"SSH-2.0-OpenSSH_9.2 " + BANNER + b"\r\n",             # not HTTP at all
    b"-NOAUTH Authentication required. " + BANNER + b"\r\n",  # Redis
    b"HTTP/1.1 400 " + BANNER + b"\r\nX-Squid-Error: " + BANNER + b"\r\nContent-Length: 0\r\n\r\n",
])
@pytest.mark.parametrize("url", ["http://192.0.2.1/generate_204", "https://192.0.2.1/generate_204"])
def test_the_probe_never_copies_what_a_non_proxy_service_says_into_the_condition(talker, reply, url):
    """An External Proxy's endpoint pointed at any TCP service the health worker reaches (Redis, an
    SSH daemon, an internal web app): the probe's message (the Healthy condition, readable by the
    Proxy author) used to carry the service's first line, a reason phrase or a header of its
    choice: a banner grabber.  Now only the reason, the status code and Squid's own error codes."""
    server = talker(reply)
    result = p.probe(p.ProbeTarget("uid-banner", "127.0.0.1", server.port, url, timeout=5), policy=LOOPBACK_ALLOWED)
    assert not result.ok
    assert BANNER.decode() not in result.message, result.message
    assert "secret" not in result.message


def test_squid_error_codes_and_standard_phrases_are_still_shown(talker):
    squid_like = talker(b"HTTP/1.1 403 Forbidden\r\nX-Squid-Error: ERR_ACCESS_DENIED 0\r\nContent-Length: 0\r\n\r\n")
    plain = p.probe(p.ProbeTarget("u1", "127.0.0.1", squid_like.port, "http://192.0.2.1/", timeout=5),
                    policy=LOOPBACK_ALLOWED)
    assert plain.reason == p.UNEXPECTED_STATUS and "ERR_ACCESS_DENIED 0" in plain.message, plain.message
    tunnel = p.probe(p.ProbeTarget("u2", "127.0.0.1", squid_like.port, "https://192.0.2.1/", timeout=5),
                     policy=LOOPBACK_ALLOWED)
    assert tunnel.reason == p.TUNNEL_FAILED and tunnel.message.endswith("403 Forbidden"), tunnel.message


@pytest.mark.parametrize("host", ["metadata.goog", "METADATA.GOOG.", "metadata.google.internal."])
def test_the_probe_refuses_every_metadata_name_squid_refuses(host):
    """``metadata.goog`` was refused by Squid but not by the probe's policy (which only denies it
    when it resolves here to a link-local address)."""
    from app.probes.destinations import DestinationDenied

    with pytest.raises(DestinationDenied, match="metadata"):
        DestinationPolicy().endpoint_address(host, 80)
    with pytest.raises(DestinationDenied, match="metadata"):
        DestinationPolicy().check_url(f"http://{host}/computeMetadata/v1/")


# -- a hostile Proxy author: the gcp firewall opt-in as a port opener --------------------------------
FIREWALL = {"ensure": True, "sourceRanges": ["0.0.0.0/0"]}


def _gce_request(uid: str, port: int) -> CreateRequest:
    from app.providers.naming import tags_for

    return CreateRequest(name=instance_name(uid), tags=tags_for(uid), namespace="crawl", zone="europe-west1-b",
                         port=port)


def test_a_proxy_author_cannot_open_any_port_on_every_proxy_vm():
    """``spec.endpoint.port`` is the Proxy author's; with ``gcp.firewall.ensure`` every create used
    to ensure an ingress rule for that port from ``sourceRanges`` to *every* instance carrying the
    network tag: ``port: 22`` opened SSH on all proxy VMs, and each new port added one more rule
    (never removed).  Now only ``gcp.firewall.ports`` (default ``[3128]``); anything else is
    refused naming the field, before any call."""
    from app.providers.gcp.provider import GcpProvider
    from tests.gcp.conftest import gcp_config
    from tests.gcp.fake_compute import FakeCompute

    with FakeCompute() as compute:
        provider = GcpProvider(gcp_config(compute, firewall=FIREWALL))
        for port in (22, 10250, 6379):
            with pytest.raises(SpecNotAllowed) as info:
                provider.create(_gce_request(f"uid-port-{port}", port))
            assert info.value.field == "spec.endpoint.port" and "gcp.firewall.ports: 3128" in str(info.value)
        assert compute.requests == [], "nothing reached the API"
        provider.create(_gce_request("uid-port-ok", 3128))
        assert sorted(name for _, name in compute.firewalls) == ["proxy-operator-gcp-test-3128"]

        listed = GcpProvider(gcp_config(compute, name="gcp-listed", firewall=dict(FIREWALL, ports=[3128, 8080])))
        listed.create(_gce_request("uid-port-8080", 8080))
        assert "proxy-operator-gcp-listed-8080" in {name for _, name in compute.firewalls}
        # Without the opt-in the port opens nothing, so it is not restricted.
        GcpProvider(gcp_config(compute, name="gcp-nofw")).create(_gce_request("uid-port-any", 2222))


@pytest.mark.parametrize("ports, field", [([], "ports"), ([0], "ports[0]"), (["22"], "ports[0]"), ([True], "ports[0]"),
                                          (3128, "ports")])
def test_firewall_ports_are_parsed_strictly(ports, field):
    from tests.gcp.conftest import gcp_config
    from tests.gcp.fake_compute import FakeCompute

    import re

    with FakeCompute() as compute, pytest.raises(ConfigError, match=re.escape(f"gcp.firewall.{field}")):
        gcp_config(compute, firewall=dict(FIREWALL, ports=ports))


# -- a Pod that got into Redis: forged gc.delete messages --------------------------------------------
def test_a_forged_gc_delete_cannot_take_a_live_proxys_pod(api, redis_client, make_context):
    """What the gc.delete task runs (app.proxy.gc.verify_and_delete) re-reads the instance and judges it
    by GC's rules: a live Proxy's current Pod is kept whatever the message says; a real orphan past
    the grace period is still collected."""
    from app.providers.naming import tags_for
    from app.providers.base import CreateRequest
    from tests.test_issue9_adversarial import apply, k8s_provider, pods, read, settle

    ctx = make_context(k8s_provider())
    ref = apply(api, "live-1", {"provider": "k8s-local"})
    settle(ctx, api, ref)
    live = read(api, ref)
    assert live.phase == "Running"
    provider = ctx.registry.get("k8s-local")
    assert not gc_logic.verify_and_delete(provider, "k8s-local", live.status["providerID"], redis=redis_client,
                                          list_proxies=KubernetesGateway(api).list_proxies, grace_seconds=0)
    assert [x.metadata.name for x in pods(api)] == [instance_name(ref.uid)], "the live Proxy's Pod was deleted"
    # A Pod of a Proxy that no longer exists is an orphan: collected (grace 0).
    gone_uid = "00000000-0000-4000-8000-00000000dead"
    orphan = provider.create(CreateRequest(name=instance_name(gone_uid), tags=tags_for(gone_uid), namespace="default"))
    assert gc_logic.verify_and_delete(provider, "k8s-local", orphan.provider_id, redis=redis_client,
                                      list_proxies=KubernetesGateway(api).list_proxies, grace_seconds=0)
    assert [x.metadata.name for x in pods(api)] == [instance_name(ref.uid)]


def test_a_forged_retire_cannot_take_a_live_proxys_pod(api, make_context):
    """instance.retire's arguments come from Redis too: an instance whose Proxy-UID tag is not the
    message's, or that its Proxy names, is kept."""
    from app.proxy.reconcile import Ref, retire_instance
    from tests.test_issue9_adversarial import apply, k8s_provider, pods, read, settle

    ctx = make_context(k8s_provider())
    ref = apply(api, "live-2", {"provider": "k8s-local"})
    settle(ctx, api, ref)
    pod_id = read(api, ref).status["providerID"]
    # Another Proxy's UID (and a name that does not exist) in the message.
    assert not retire_instance(ctx, "k8s-local", pod_id, ref=Ref("default", "nobody", "00000000-forged-uid"))
    # The right Proxy: its status still names the Pod, so the Pod is kept.
    assert not retire_instance(ctx, "k8s-local", pod_id, ref=Ref("default", "live-2", ref.uid))
    assert [x.metadata.name for x in pods(api)] == [instance_name(ref.uid)]
