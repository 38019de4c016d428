"""``spec.spread.zones`` with the real kvm and gcp providers: spread across two KVM hosts (the
existing rig) and two GCP zones (the Compute fake).

The readiness of the zones comes from real provider checks, run as the ``providers.check`` /
``providers.check_host`` tasks run them (:func:`check_round`: ``check_one`` + ``record_target``
per KVM host, ``run_check`` + ``record_round`` for a provider checked as a whole, then the
ProviderHealth object published from the snapshot); the pool controller's pass
(:func:`app.pools.controller.run`) reads that snapshot in Redis, against the API fake with the
real CRDs; the members' creates run the reconcile create step (:func:`app.proxy.reconcile.create`)
with the real providers, so the instances land where the plan put them:

* kvm: the rig of tests/kvm (a real libvirtd reached over a real sshd on loopback) for host
  ``h1``, a second private libvirtd behind an sshd that is not running yet for ``h2``: each
  host's domains are counted on its own daemon.
* gcp: the Compute REST fake of tests/gcp and the real google-cloud-compute client.

Every test of this module runs in the kvm xdist group (``XDIST_GROUPS``, tests/conftest.py), so
a run starts one kvm rig per worker.
"""

from __future__ import annotations

import libvirt
import pytest

from app.serving import leases, view as serving
from app.store import keys as redis_keys
from app.config.providers import ProvidersConfig
from app.kube.gateway import KubernetesGateway
from app.pools import controller
from app.pools.controller import PoolRef
from app.providers.checks import (ProviderHealthWriter, check_one, expected_targets, publish_snapshot, record_round,
                                 record_target, run_check)
from app.providers.base import ShardedProvider
from app.providers.registry import build
from app.proxy.reconcile import Context, Ref, create
from app.providers.naming import instance_name
from app.resources import GROUP, PLURAL, POOL_PLURAL, VERSION, Proxy
from tests.kvm import harness
from tests.support.contexts import QUICK
from tests.support.kvm_rig import wipe_domains
from devcluster.loopback import reserve_port

NS = "crawl"


# -- shared helpers ------------------------------------------------------------------------------
from tests.pools.test_controller import api, cluster, custom  # noqa: E402,F401  (fixtures and helper)


def context(api, r, pc, constructor) -> Context:
    """The Context a worker builds: ``pc``'s provider (``constructor(pc)``) on the API fake and Redis."""
    registry = build(ProvidersConfig((pc,)), {pc.type: constructor})
    return Context(kube=KubernetesGateway(api), registry=registry, redis=r, settings=QUICK)


def check_round(ctx: Context, name: str) -> dict[str, tuple[bool, str]]:
    """One check round of provider ``name`` as the ``providers.check`` task runs it (a provider
    with hosts: ``providers.check_host`` per host), on the unwrapped provider; returns the
    ProviderHealth object's targets as ``{name: (ready, reason)}``."""
    pc = ctx.registry.configs[name]
    provider = ctx.registry.unwrapped[name]
    writer = ProviderHealthWriter(ctx.kube)
    if isinstance(provider, ShardedProvider):
        for host in provider.hosts():
            verdict, elapsed = check_one(lambda h=host: provider.check_host(h), host, pc.check_timeout)
            record_target(ctx.redis, name, verdict, elapsed=elapsed)
            publish_snapshot(ctx.redis, writer, pc)
    else:
        verdicts, elapsed, failed = run_check(provider, pc.check_timeout)
        record_round(ctx.redis, name, verdicts, elapsed=elapsed, failed=failed, targets=expected_targets(pc))
        publish_snapshot(ctx.redis, writer, pc)
    health = ctx.kube.get_provider_health(name)
    return {t["name"]: (t["ready"], t["reason"]) for t in health.status["targets"]}


def make_pool(api, template_spec: dict, zones: list[str], replicas: int, name: str = "spread") -> PoolRef:
    body = {"apiVersion": f"{GROUP}/{VERSION}", "kind": "ProxyPool", "metadata": {"name": name, "namespace": NS},
            "spec": {"replicas": replicas, "spread": {"zones": zones},
                     "template": {"metadata": {"labels": {"app": name}}, "spec": template_spec}}}
    obj = custom(api).create_namespaced_custom_object(GROUP, VERSION, NS, POOL_PLURAL, body)
    return PoolRef(NS, name, obj["metadata"]["uid"])


def scale(api, ref: PoolRef, replicas: int) -> None:
    custom(api).patch_namespaced_custom_object(GROUP, VERSION, NS, POOL_PLURAL, ref.name,
                                               {"spec": {"replicas": replicas}})


def pass_(ctx: Context, ref: PoolRef) -> controller.Outcome:
    """One ``pool.reconcile`` pass with the registry's configs, as the worker runs it."""
    out = controller.run(ctx.kube, ctx.redis, ctx.registry.configs, ref=ref, lock_timeout=30)
    assert out.state == "done", out
    return out


def members(api) -> list[Proxy]:
    return KubernetesGateway(api).list_proxies_in(NS)


def zones_of(api) -> dict[str, str]:
    return {p.name: p.spec.zone for p in members(api)}


def conditions(api, ref: PoolRef) -> dict[str, tuple[str, str, str]]:
    status = custom(api).get_namespaced_custom_object(GROUP, VERSION, NS, POOL_PLURAL, ref.name)["status"]
    return {c["type"]: (c["status"], c["reason"], c["message"]) for c in status["conditions"]}


def leasable(api, r, proxy: Proxy) -> None:
    """What the health engine does for a member whose probe passes: Ready, published healthy."""
    custom(api).patch_namespaced_custom_object_status(GROUP, VERSION, NS, PLURAL, proxy.name,
                                                      {"status": {"phase": "Ready"}})
    serving.publish(r, proxy, address=proxy.status.get("address") or "203.0.113.9", port=3128, phase="Ready")
    r.hset(redis_keys.proxy(proxy.uid), mapping={"health": "healthy", "healthy": "1"})
    leases.reindex(r, proxy.uid)


def create_members(ctx: Context, api, names) -> None:
    """Run the reconcile create step of each member named (as the ``proxy.create`` task would)."""
    for p in members(api):
        if p.name in names:
            create(ctx, Ref(p.namespace, p.name, p.uid))


# -- kvm: two hosts, one down ----------------------------------------------------------------
def _domains(socket_path) -> set[str]:
    conn = libvirt.open(f"qemu+unix:///system?socket={socket_path}")
    try:
        return {d.name() for d in conn.listAllDomains(0)}
    finally:
        conn.close()


@pytest.fixture()
def two_hosts(rig, second_daemon, image, tmp_path):
    """A kvm provider entry with ``h1`` (the rig: its sshd, its daemon) and ``h2`` (the second
    daemon behind an sshd on port ``h2_port`` that nobody listens on yet), and a starter for
    that sshd.  Every domain either daemon holds afterwards is removed."""
    _, url, sha, _ = image()
    reservation = reserve_port()  # h2's port stays ours (refusing connects) until its sshd starts
    h2_port = reservation.getsockname()[1]
    known = tmp_path / "known_hosts"
    known.write_text(harness.known_hosts_line("127.0.0.1", rig.sshd.port, rig.keys.host_pub)
                     + harness.known_hosts_line("127.0.0.1", h2_port, rig.keys.host_pub))
    entry = rig.entry(hosts=[rig.host("h1"),
                             rig.host("h2", port=h2_port, libvirtSocket=str(second_daemon.socket))],
                      known_hosts_file=known, images={"tiny": {"url": url, "sha256": sha, "firmware": "bios"}})
    started = []

    def start_h2() -> None:
        started.append(harness.Sshd(tmp_path / "sshd-h2", rig.keys.host_key, rig.keys.client_pub,
                                    port=h2_port).start())
        reservation.close()

    yield entry, start_h2
    reservation.close()
    for s in started:
        s.stop()
    for socket_path in (rig.daemon.socket, second_daemon.socket):
        wipe_domains(socket_path)


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_kvm_spread_skips_a_host_that_is_down_until_a_check_says_it_is_back(two_hosts, api, redis_client,
                                                                             rig, second_daemon):
    from app.providers.kvm.provider import KvmProvider

    entry, start_h2 = two_hosts
    pc = harness.provider_config(entry)
    assert pc.check_interval > 0  # checks on: the controller reads their verdicts
    ctx = context(api, redis_client, pc, KvmProvider)
    try:
        # the real check round: h1 answers over SSH, h2's sshd port refuses the connection
        targets = check_round(ctx, pc.name)
        assert targets["h1"] == (True, "Ready")
        assert targets["h2"][0] is False and targets["h2"][1] == "HostUnreachable", targets

        template = {"provider": pc.name, "maxLeases": 2, "placement": {"image": "tiny", "machineType": "small"}}
        ref = make_pool(api, template, ["h1", "h2"], replicas=4)
        out = pass_(ctx, ref)
        assert [c.zone for c in out.plan.creates] == ["h1"] * 4
        placed = zones_of(api)
        assert sorted(placed.values()) == ["h1"] * 4
        # what the pool says: it is scaling up on the Ready zone, and h2 is skipped for the
        # reason its ProviderHealth target gives (the real check's verdict)
        conds = conditions(api, ref)
        assert conds["Progressing"][:2] == ("True", "ScalingUp"), conds
        assert conds["Available"][:2] == ("False", "TooFewLeasable")
        health = ctx.kube.get_provider_health(pc.name)
        ready_cond = next(c for c in health.status["conditions"] if c["type"] == "Ready")
        assert ready_cond["status"] == "False" and "h2" in ready_cond["message"]
        h2 = next(t for t in health.status["targets"] if t["name"] == "h2")
        assert conds["ZonesReady"][:2] == ("False", "ZonesNotReady")
        assert f"h2 ({h2['reason']}" in conds["ZonesReady"][2], conds
        skipped = custom(api).get_namespaced_custom_object(GROUP, VERSION, NS, POOL_PLURAL, ref.name)["status"][
            "skippedZones"]
        assert [(z["zone"], z["reason"]) for z in skipped] == [("h2", "HostUnreachable")]

        # the members' creates, with the real provider: 4 domains on h1's daemon, none on h2's
        create_members(ctx, api, placed)
        first = set(placed)
        wanted = {instance_name(p.uid): p.spec.zone for p in members(api)}
        assert set(wanted) <= _domains(rig.daemon.socket)
        assert not set(wanted) & _domains(second_daemon.socket)
        assert pass_(ctx, ref).plan.actions == 0  # nothing moves, nothing more is made

        # h2 comes back; until a check round says so, growth still goes to h1
        start_h2()
        scale(api, ref, 5)
        out = pass_(ctx, ref)
        assert [c.zone for c in out.plan.creates] == ["h1"]
        targets = check_round(ctx, pc.name)
        assert targets == {"h1": (True, "Ready"), "h2": (True, "Ready")}
        pass_(ctx, ref)
        assert conditions(api, ref)["ZonesReady"][:2] == ("True", "AllZonesReady")

        # the pool grows: the new members go to h2 (the emptiest Ready zone); none is moved
        scale(api, ref, 7)
        out = pass_(ctx, ref)
        assert [c.zone for c in out.plan.creates] == ["h2", "h2"]
        assert out.plan.drains == () and out.plan.deletes == ()
        placed = zones_of(api)
        assert sorted(placed.values()) == ["h1"] * 5 + ["h2"] * 2
        create_members(ctx, api, set(placed) - first)
        on_h1, on_h2 = _domains(rig.daemon.socket), _domains(second_daemon.socket)
        by_zone = {p.spec.zone: set() for p in members(api)}
        for p in members(api):
            by_zone[p.spec.zone].add(instance_name(p.uid))
        assert by_zone["h1"] <= on_h1 and not by_zone["h1"] & on_h2
        assert by_zone["h2"] <= on_h2 and not by_zone["h2"] & on_h1
        assert len(by_zone["h1"]) == 5 and len(by_zone["h2"]) == 2
    finally:
        for p in ctx.registry.unwrapped.values():
            p.close()


# -- gcp: two zones of one project ---------------------------------------------------------------
ZONES = ["europe-west1-b", "europe-west1-c"]


@pytest.mark.timeout(120)
def test_gcp_spread_puts_two_instances_in_each_zone_and_the_project_target_decides(compute, api, redis_client):
    from app.providers.gcp.provider import GcpProvider
    from tests.gcp.conftest import PROJECT, gcp_config

    pc = gcp_config(compute)
    assert pc.check_interval > 0 and expected_targets(pc) == [PROJECT]
    ctx = context(api, redis_client, pc, GcpProvider)
    # the real check round: one target, the project; no zone is a target of its own
    assert check_round(ctx, pc.name) == {PROJECT: (True, "Ready")}

    ref = make_pool(api, {"provider": pc.name, "maxLeases": 2}, ZONES, replicas=4)
    out = pass_(ctx, ref)
    assert sorted(c.zone for c in out.plan.creates) == sorted(ZONES * 2)
    placed = zones_of(api)
    assert sorted(placed.values()) == sorted(ZONES * 2)

    # the members' creates with the real SDK client: 2 instances in each zone of the fake
    create_members(ctx, api, placed)
    by_zone = {z: sorted(n for (proj, zone, n) in compute.instances if proj == PROJECT and zone == z) for z in ZONES}
    assert by_zone == {z: sorted(instance_name(p.uid) for p in members(api) if p.spec.zone == z) for z in ZONES}
    assert all(len(names) == 2 for names in by_zone.values()) and len(compute.instances) == 4
    assert {p.phase for p in members(api)} == {"Running"}
    for p in members(api):  # what the health engine does for a member that passes its probe
        leasable(api, redis_client, p)
    pass_(ctx, ref)
    assert conditions(api, ref)["Progressing"][:2] == ("True", "PoolComplete")

    # the project's target goes not Ready (the Compute API refuses the check): every zone of
    # the provider is held back, so the pool says NoReadyZone and makes nothing; its leasable
    # members stay (only members that take no leases leave a zone that is not Ready)
    compute.fail("GET", r"/aggregated/instances", 503, "backendError", times=10)
    targets = check_round(ctx, pc.name)
    assert targets[PROJECT][0] is False, targets
    scale(api, ref, 6)
    out = pass_(ctx, ref)
    assert out.plan.creates == () and out.plan.drains == ()
    conds = conditions(api, ref)
    assert conds["Progressing"][:2] == ("False", "NoReadyZone")
    for zone in ZONES:  # a GCE zone follows the project's target
        assert f"{zone} (target {PROJECT}: {targets[PROJECT][1]}" in conds["Progressing"][2], conds
    compute.faults.clear()

    # back: the next members are spread again, one per zone
    assert check_round(ctx, pc.name) == {PROJECT: (True, "Ready")}
    out = pass_(ctx, ref)
    assert sorted(c.zone for c in out.plan.creates) == ZONES
    create_members(ctx, api, set(zones_of(api)) - set(placed))
    assert sorted(zone for (_, zone, _) in compute.instances) == sorted(ZONES * 3)
