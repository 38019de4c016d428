"""Skip-cleanup outlives Redis: the abandoned mark lives on the instance (kubernetes provider).

Driven like the Celery tasks drive :mod:`app.proxy.reconcile`, against the API fake and the session
Redis.  The kvm cases here need no libvirt: a host that cannot be dialled is what a dead
hypervisor looks like from the operator (the real-libvirtd cases are in tests/kvm/).
"""

from __future__ import annotations

import pytest
from kubernetes import client as k8s

from app.providers import naming
from app.config.providers import ProviderConfig
from app.proxy.gc import collect
from app.kube.gateway import KubernetesGateway
from app.errors import NotFound
from app.providers.kubernetes.provider import (
    LABEL_ABANDONED,
    LABEL_MANAGED_BY,
    LABEL_PROXY_UID,
)
from app.proxy.reconcile import (
    ABANDONED_KEY,
    CREATE,
    DELETE,
    Context,
    Ref,
    create,
    delete,
    poll,
)
from app.resources import GROUP, PLURAL, VERSION, Proxy
from app.config.settings import Settings
from devcluster import loopback
from tests.support.contexts import k8s_provider
from tests.support.proxies import apply, read

NS = "default"
SETTINGS = Settings(poll_initial=5, poll_max=60, retry_initial=5, retry_max=300, quota_backoff=900)


@pytest.fixture()
def ctx(make_context):
    return make_context(k8s_provider(), settings=SETTINGS)


def release_with_skip_cleanup(api, ref: Ref) -> None:
    """What the user does: annotate skip-cleanup, then delete the Proxy."""
    custom = k8s.CustomObjectsApi(api)
    custom.patch_namespaced_custom_object(GROUP, VERSION, NS, PLURAL, ref.name,
                                          {"metadata": {"annotations": {"crawl.example.com/skip-cleanup": "true"}}})
    custom.delete_namespaced_custom_object(GROUP, VERSION, NS, PLURAL, ref.name)


def pods(api) -> dict[str, dict[str, str]]:
    items = k8s.CoreV1Api(api).list_pod_for_all_namespaces(label_selector=f"{LABEL_MANAGED_BY}=proxy-operator").items
    return {p.metadata.name: p.metadata.labels for p in items}


def events(api, reason: str) -> list:
    return [e for e in k8s.CoreV1Api(api).list_namespaced_event(NS).items if e.reason == reason]


def provisioned(proxy: Proxy) -> dict:
    return next(c for c in proxy.status["conditions"] if c["type"] == "Provisioned")


def all_proxies(api):
    """What GC reads after listing the instances: every existing Proxy."""
    return KubernetesGateway(api).list_proxies


def test_abandoned_pod_survives_a_redis_flush_and_gc(ctx, api, redis_client):
    ref = apply(api, "squid-keep", {"provider": "k8s-local"})
    create(ctx, ref)
    kept = read(api, ref).status["instanceName"]
    orphan = apply(api, "squid-orphan", {"provider": "k8s-local"})  # the control: deleted normally by GC
    create(ctx, orphan)
    orphan_pod = read(api, orphan).status["instanceName"]
    release_with_skip_cleanup(api, ref)

    assert delete(ctx, ref) is None
    assert read(api, ref) is None
    assert pods(api)[kept][LABEL_ABANDONED] == "true"
    assert [e.message for e in events(api, "SkipCleanup")] == [
        f"instance {NS}/{kept} left in place and marked abandoned (skip-cleanup)"]
    provider = ctx.registry.get("k8s-local")
    assert provider.get(f"{NS}/{kept}").tags[naming.TAG_ABANDONED] == "true"

    # The orphan's Proxy disappears without its finalizer running (a crash, a forced removal).
    k8s.CustomObjectsApi(api).patch_namespaced_custom_object(GROUP, VERSION, NS, PLURAL, orphan.name,
                                                             {"metadata": {"finalizers": []}})
    k8s.CustomObjectsApi(api).delete_namespaced_custom_object(GROUP, VERSION, NS, PLURAL, orphan.name)

    redis_client.flushall()
    abandoned_hint = set(redis_client.smembers(ABANDONED_KEY))
    assert abandoned_hint == set()
    report = collect("k8s-local", provider, all_proxies(api), abandoned=abandoned_hint, grace_seconds=0)

    assert report.deleted == [f"{NS}/{orphan_pod}"]
    assert set(pods(api)) == {kept}, "the abandoned Pod stays, whatever happened to Redis"
    # A second sweep changes nothing: exactly one Pod, nothing leaked, nothing duplicated.
    assert collect("k8s-local", provider, all_proxies(api), abandoned=set(), grace_seconds=0).deleted == []
    assert set(pods(api)) == {kept}


def test_abandon_is_idempotent_and_a_gone_pod_is_success(ctx, api):
    ref = apply(api, "squid-idem", {"provider": "k8s-local"})
    create(ctx, ref)
    pid = read(api, ref).status["providerID"]
    provider = ctx.registry.get("k8s-local")
    provider.abandon(pid)
    provider.abandon(pid)
    labels = pods(api)[pid.split("/")[1]]
    assert labels[LABEL_ABANDONED] == "true" and labels[LABEL_PROXY_UID] == ref.uid
    provider.delete(pid)
    provider.abandon(pid)  # already gone: success


def test_a_failed_mark_keeps_the_proxy_and_retries_with_backoff(ctx, api, fake):
    ref = apply(api, "squid-retry", {"provider": "k8s-local"})
    create(ctx, ref)
    pod = read(api, ref).status["instanceName"]
    release_with_skip_cleanup(api, ref)
    fake.fail_next("patch", "pods", code=503, times=2)

    first = delete(ctx, ref)
    assert first.action == DELETE and first.attempt == 1 and 2.5 <= first.delay <= 5
    proxy = read(api, ref)
    assert proxy is not None and proxy.phase == "Terminating"
    cond = provisioned(proxy)
    assert cond["status"] == "False" and cond["reason"] == "Transient"
    assert "cannot mark instance" in cond["message"] and "retrying" in cond["message"]
    assert len(events(api, "AbandonFailed")) == 1

    second = delete(ctx, ref, first.attempt)
    assert second.attempt == 2 and 5 <= second.delay <= 10
    assert len(events(api, "AbandonFailed")) == 1, "one warning, not one per retry"

    assert delete(ctx, ref, second.attempt) is None
    assert read(api, ref) is None
    assert pods(api)[pod][LABEL_ABANDONED] == "true"


def test_an_ended_pod_is_recreated_not_started(ctx, api):
    """A Pod never runs again once Failed/Succeeded: Terminated, so the poll recreates it."""
    ref = apply(api, "squid-ended", {"provider": "k8s-local"})
    create(ctx, ref)
    pod = read(api, ref).status["instanceName"]
    k8s.CoreV1Api(api).patch_namespaced_pod_status(pod, NS, {"status": {"phase": "Failed"}})

    followup = poll(ctx, ref)

    assert followup.action == CREATE
    assert provisioned(read(api, ref))["reason"] == "InstanceLost"
    assert pods(api) == {}
    create(ctx, ref)
    assert set(pods(api)) == {pod}


def test_kubernetes_start_leaves_a_live_pod_and_deletes_an_ended_one(ctx, api):
    ref = apply(api, "squid-start", {"provider": "k8s-local"})
    create(ctx, ref)
    proxy = read(api, ref)
    pid, pod = proxy.status["providerID"], proxy.status["instanceName"]
    provider = ctx.registry.get("k8s-local")
    provider.start(pid)  # pending: the kubelet runs it, nothing to do
    assert set(pods(api)) == {pod}
    k8s.CoreV1Api(api).patch_namespaced_pod_status(pod, NS, {"status": {"phase": "Succeeded"}})
    with pytest.raises(NotFound, match="cannot be started again"):
        provider.start(pid)
    assert pods(api) == {}
    with pytest.raises(NotFound):
        provider.start(pid)


# -- a dead KVM host (no libvirt needed: the host cannot be dialled) -----------------------------
def kvm_config(tmp_path, hosts: list[str]) -> ProviderConfig:
    """A kvm provider whose hosts are down: valid SSH material, but nothing listens on the port."""
    import shutil

    from tests.kvm.harness import (
        known_hosts_line,
        kvm_entry,
        make_keys,
        provider_config,
    )

    if shutil.which("ssh-keygen") is None:
        pytest.skip("ssh-keygen is missing")
    directory = tmp_path / ("hosts-" + "-".join(hosts))
    keys = make_keys(directory / "keys")
    # An address of a block this process holds: no other test run can be listening there.
    address = loopback.block("dead-hosts").host(1)
    port = loopback.free_port(address)
    known_hosts = directory / "known_hosts"
    known_hosts.write_text(known_hosts_line(address, port, keys.host_pub))
    entry = kvm_entry(user="proxyop", port=port, key_file=keys.client_key, known_hosts_file=known_hosts,
                      name="kvm-lab", hosts=[{"name": h, "address": address, "port": port} for h in hosts])
    return provider_config(entry)


def kvm_ctx(make_context, pc: ProviderConfig) -> Context:
    pytest.importorskip("libvirt")
    from app.providers.kvm.provider import KvmProvider

    return make_context(k8s_provider(), pc, settings=SETTINGS, factories={"kvm": KvmProvider})


def test_dead_kvm_host_keeps_the_proxy_until_the_host_is_removed_from_the_config(api, make_context, tmp_path):
    dead = kvm_ctx(make_context, kvm_config(tmp_path, ["h1"]))
    ref = apply(api, "squid-kvm", {"provider": "kvm-lab", "placement": {"zone": "h1"}})
    kube = KubernetesGateway(api)
    proxy = kube.add_finalizer(read(api, ref))
    pid = f"hosts/h1/domains/{naming.instance_name(ref.uid)}"
    kube.patch_status(proxy, {"phase": "Running", "providerID": pid, "observedGeneration": 1})
    release_with_skip_cleanup(api, ref)

    for attempt in range(3):
        followup = delete(dead, ref, attempt)
        assert followup.action == DELETE and followup.attempt == attempt + 1
        proxy = read(api, ref)
        assert proxy is not None, "unmarked, the Proxy itself is what keeps GC off the domain"
        cond = provisioned(proxy)
        assert cond["reason"] == "HostUnreachable" and pid in cond["message"] and "TCP" in cond["message"]
        assert "remove it from the providers config" in cond["message"]
    assert len(events(api, "AbandonFailed")) == 1

    # The host is gone for good: the admin removes it from the config (the provider keeps h2).
    # A host not in the config is never listed by GC, so there is nothing left to mark.
    removed = kvm_ctx(make_context, kvm_config(tmp_path, ["h2"]))
    assert delete(removed, ref, 3) is None
    assert read(api, ref) is None
