"""Reconcile steps on the kubernetes provider, in-process, against the API fake and real Redis.

The tests drive :mod:`app.proxy.reconcile` the way the Celery tasks do and play the kubelet by
writing Pod status through the API, so every reconcile rule is pinned without a broker.
"""

from __future__ import annotations

import pytest
from kubernetes import client as k8s

from app.serving import view as serving
from app.config.providers import ProvidersConfig
from app.providers.kubernetes.config import DEFAULT_IMAGE
from app.providers.kubernetes.provider import LABEL_PROXY_UID
from app.providers.registry import build
from app.proxy.reconcile import (
    ABANDONED_KEY,
    CREATE,
    POLL,
    Context,
    create,
    decide,
    delete,
    poll,
)
from app.resources import FINALIZER, GROUP, PLURAL, VERSION
from app.config.settings import Settings
from tests.support.contexts import k8s_provider
from tests.support.proxies import apply, kubelet_runs, pods, read

NS = "default"


@pytest.fixture()
def ctx(make_context):
    # the images the spec-change tests switch to are allowed, as an operator would list them
    settings = Settings(poll_initial=5, poll_max=60, retry_initial=5, retry_max=300, quota_backoff=900)
    return make_context(k8s_provider(images=("example/squid:6", "example/squid:7")), settings=settings)


def test_create_poll_running_then_delete(ctx, api, redis_client):
    ref = apply(api, "squid-1", {"provider": "k8s-local", "endpoint": {"port": 3130}})
    assert decide(read(api, ref)) == CREATE

    followup = create(ctx, ref)
    assert followup.action == POLL and followup.delay == 5
    proxy = read(api, ref)
    assert FINALIZER in proxy.finalizers
    assert proxy.phase == "Provisioning"
    pod_name = proxy.status["instanceName"]
    assert proxy.status["providerID"] == f"{NS}/{pod_name}"
    assert proxy.status["specHash"] == proxy.spec_hash and proxy.status["observedGeneration"] == 1
    [pod] = pods(api)
    assert pod.metadata.labels[LABEL_PROXY_UID] == ref.uid
    container = pod.spec.containers[0]
    assert container.image == DEFAULT_IMAGE and container.ports[0].container_port == 3130
    squid_conf = next(e.value for e in container.env if e.name == "SQUID_CONF")
    assert "http_port 3130" in squid_conf and "request_header_access Proxy-Authorization deny all" in squid_conf

    # Pod not running yet: poll backs off 5 -> 10 s.
    assert poll(ctx, ref, 0).delay == 10
    kubelet_runs(api, pod_name, "10.1.2.3")
    assert poll(ctx, ref, 1) is None
    proxy = read(api, ref)
    assert proxy.phase == "Running" and proxy.status["address"] == "10.1.2.3" and proxy.status["port"] == 3130
    provisioned = next(c for c in proxy.status["conditions"] if c["type"] == "Provisioned")
    assert provisioned["status"] == "True"
    assert serving.get(redis_client, ref.uid)["address"] == "10.1.2.3"
    events = k8s.CoreV1Api(api).list_namespaced_event(NS).items
    assert {"Provisioning", "Running"} <= {e.reason for e in events}

    k8s.CustomObjectsApi(api).delete_namespaced_custom_object(GROUP, VERSION, NS, PLURAL, "squid-1")
    assert decide(read(api, ref)) == "delete"
    assert delete(ctx, ref) is None
    assert pods(api) == []
    assert read(api, ref) is None
    assert serving.get(redis_client, ref.uid) is None


def test_create_is_idempotent(ctx, api):
    ref = apply(api, "squid-2", {"provider": "k8s-local"})
    create(ctx, ref)
    # A redelivered create (status already written) and a create whose status write was lost
    # both leave exactly one Pod.
    create(ctx, ref)
    k8s.CustomObjectsApi(api).patch_namespaced_custom_object_status(
        GROUP, VERSION, NS, PLURAL, "squid-2", {"status": {"providerID": None, "specHash": None}})
    create(ctx, ref)
    assert len(pods(api)) == 1
    assert read(api, ref).phase == "Provisioning"


def test_skip_cleanup_releases_the_proxy_and_keeps_the_pod(ctx, api, redis_client):
    ref = apply(api, "squid-3", {"provider": "k8s-local"})
    create(ctx, ref)
    k8s.CustomObjectsApi(api).patch_namespaced_custom_object(
        GROUP, VERSION, NS, PLURAL, "squid-3",
        {"metadata": {"annotations": {"crawl.example.com/skip-cleanup": "true"}}})
    k8s.CustomObjectsApi(api).delete_namespaced_custom_object(GROUP, VERSION, NS, PLURAL, "squid-3")
    delete(ctx, ref)
    assert read(api, ref) is None
    assert len(pods(api)) == 1
    assert redis_client.sismember(ABANDONED_KEY, ref.uid)


def test_unknown_provider_fails_once_and_recovers_on_a_spec_change(ctx, api):
    ref = apply(api, "squid-4", {"provider": "nope"})
    assert create(ctx, ref) is None
    proxy = read(api, ref)
    assert proxy.phase == "Failed"
    cond = next(c for c in proxy.status["conditions"] if c["type"] == "Provisioned")
    assert cond["reason"] == "UnknownProvider" and "nope" in cond["message"]
    assert decide(proxy) is None and decide(proxy, resync=True) is None  # no retry storm
    # The user fixes the provider name? Immutable: the CRD forbids it.  A new generation (any spec
    # change) is what re-enables work; here maxLeases.
    k8s.CustomObjectsApi(api).patch_namespaced_custom_object(GROUP, VERSION, NS, PLURAL, "squid-4",
                                                             {"spec": {"maxLeases": 2}})
    assert decide(read(api, ref)) == CREATE


def test_delete_with_unknown_provider_keeps_finalizer_until_skip_cleanup(ctx, api):
    ref = apply(api, "squid-5", {"provider": "k8s-local"})
    create(ctx, ref)
    # The provider disappears from the config (simulated by a context without providers).
    empty = Context(kube=ctx.kube, registry=build(ProvidersConfig(()), {}), redis=ctx.redis, settings=ctx.settings)
    k8s.CustomObjectsApi(api).delete_namespaced_custom_object(GROUP, VERSION, NS, PLURAL, "squid-5")
    followup = delete(empty, ref)
    assert followup.action == "delete" and followup.delay == ctx.settings.quota_backoff
    proxy = read(api, ref)
    assert proxy is not None and "skip-cleanup" in next(
        c["message"] for c in proxy.status["conditions"] if c["type"] == "Provisioned")
    k8s.CustomObjectsApi(api).patch_namespaced_custom_object(
        GROUP, VERSION, NS, PLURAL, "squid-5",
        {"metadata": {"annotations": {"crawl.example.com/skip-cleanup": "true"}}})
    assert delete(empty, ref) is None
    assert read(api, ref) is None


def test_lost_instance_is_recreated(ctx, api):
    ref = apply(api, "squid-6", {"provider": "k8s-local"})
    create(ctx, ref)
    pod_name = read(api, ref).status["instanceName"]
    kubelet_runs(api, pod_name, "10.1.2.4")
    poll(ctx, ref)
    assert read(api, ref).phase == "Running"
    k8s.CoreV1Api(api).delete_namespaced_pod(pod_name, NS)
    followup = poll(ctx, ref)
    assert followup.action == CREATE
    proxy = read(api, ref)
    assert proxy.phase == "Provisioning" and "providerID" not in proxy.status
    assert next(c for c in proxy.status["conditions"] if c["type"] == "Provisioned")["reason"] == "InstanceLost"
    create(ctx, ref)
    assert [p.metadata.name for p in pods(api)] == [pod_name]


def test_spec_change_replaces_the_instance(ctx, api):
    ref = apply(api, "squid-7", {"provider": "k8s-local"})
    create(ctx, ref)
    first = pods(api)[0].metadata.uid
    k8s.CustomObjectsApi(api).patch_namespaced_custom_object(
        GROUP, VERSION, NS, PLURAL, "squid-7", {"spec": {"placement": {"image": "example/squid:6"}}})
    proxy = read(api, ref)
    assert decide(proxy) == CREATE
    create(ctx, ref)
    [pod] = pods(api)
    assert pod.metadata.uid != first and pod.spec.containers[0].image == "example/squid:6"
    proxy = read(api, ref)
    assert proxy.status["specHash"] == proxy.spec_hash and proxy.status["observedGeneration"] == 2


def test_transient_api_failure_retries_with_backoff(ctx, api, fake):
    ref = apply(api, "squid-8", {"provider": "k8s-local"})
    fake.fail_next("create", "pods", code=500)
    followup = create(ctx, ref)
    assert followup.action == CREATE and followup.attempt == 1 and 2.5 <= followup.delay <= 5
    cond = next(c for c in read(api, ref).status["conditions"] if c["type"] == "Provisioned")
    assert cond["reason"] == "Transient"
    fake.fail_next("create", "pods", code=503)
    assert 5 <= create(ctx, ref, 1).delay <= 10
    assert create(ctx, ref, 2).action == POLL
    assert len(pods(api)) == 1


def test_external_proxy_runs_without_an_instance(ctx, api, redis_client):
    ref = apply(api, "ext-1", {"mode": "External", "endpoint": {"host": "203.0.113.9", "port": 3128}})
    assert create(ctx, ref) is None
    proxy = read(api, ref)
    assert proxy.phase == "Running" and proxy.status["address"] == "203.0.113.9"
    assert pods(api) == []
    assert serving.get(redis_client, ref.uid)["address"] == "203.0.113.9"
    redis_client.flushall()  # a flushed Redis heals at the next resync
    assert decide(proxy, resync=True) == CREATE
    create(ctx, ref)
    assert serving.get(redis_client, ref.uid)["address"] == "203.0.113.9"


def test_label_and_max_leases_changes_refresh_the_serving_view(ctx, api, redis_client):
    ref = apply(api, "ext-2", {"mode": "External", "endpoint": {"host": "203.0.113.9"}, "maxLeases": 2})
    create(ctx, ref)
    custom = k8s.CustomObjectsApi(api)
    custom.patch_namespaced_custom_object(GROUP, VERSION, NS, PLURAL, "ext-2",
                                          {"metadata": {"labels": {"pool": "blue"}}, "spec": {"maxLeases": 0}})
    proxy = read(api, ref)
    assert serving.refresh(redis_client, proxy)
    record = serving.get(redis_client, ref.uid)
    assert record["labels"] == '{"pool": "blue"}' and record["maxLeases"] == "0"
    serving.withdraw(redis_client, ref.uid)
    assert not serving.refresh(redis_client, proxy)  # never resurrects a withdrawn Proxy
    assert serving.get(redis_client, ref.uid) is None


def test_failed_proxy_gets_another_chance_with_any_new_generation(ctx, api, redis_client):
    ref = apply(api, "squid-9", {"provider": "k8s-local"})
    create(ctx, ref)
    pod_name = read(api, ref).status["instanceName"]
    kubelet_runs(api, pod_name, "10.1.2.9")
    poll(ctx, ref)
    # The health engine fails it (never healthy within the deadline) and withdraws it.
    k8s.CustomObjectsApi(api).patch_namespaced_custom_object_status(
        GROUP, VERSION, NS, PLURAL, "squid-9", {"status": {"phase": "Failed"}})
    serving.withdraw(redis_client, ref.uid)
    assert decide(read(api, ref)) is None and decide(read(api, ref), resync=True) is None
    # A change that keeps the instance (maxLeases) is still a new generation: try again.
    k8s.CustomObjectsApi(api).patch_namespaced_custom_object(GROUP, VERSION, NS, PLURAL, "squid-9",
                                                             {"spec": {"maxLeases": 3}})
    assert decide(read(api, ref)) == CREATE
    # create is idempotent by name: it finds the Pod still running and takes it back at once.
    assert create(ctx, ref) is None
    proxy = read(api, ref)
    assert proxy.phase == "Running" and proxy.status["observedGeneration"] == 2
    assert serving.get(redis_client, ref.uid)["maxLeases"] == "3"
    assert len(pods(api)) == 1


def test_replacing_an_instance_withdraws_its_health(ctx, api):
    ref = apply(api, "squid-10", {"provider": "k8s-local"})
    create(ctx, ref)
    kubelet_runs(api, read(api, ref).status["instanceName"], "10.1.2.10")
    poll(ctx, ref)
    healthy = [{"type": t, "status": "True", "reason": "ProbeSucceeded", "message": "",
                "lastTransitionTime": "2026-01-01T00:00:00Z", "observedGeneration": 1} for t in ("Healthy", "Ready")]
    conds = read(api, ref).status["conditions"] + healthy
    k8s.CustomObjectsApi(api).patch_namespaced_custom_object_status(
        GROUP, VERSION, NS, PLURAL, "squid-10", {"status": {"phase": "Ready", "conditions": conds}})
    k8s.CustomObjectsApi(api).patch_namespaced_custom_object(
        GROUP, VERSION, NS, PLURAL, "squid-10", {"spec": {"placement": {"image": "example/squid:7"}}})
    create(ctx, ref)
    status = {c["type"]: c for c in read(api, ref).status["conditions"]}
    assert status["Healthy"]["status"] == "Unknown" and status["Ready"]["status"] == "Unknown"
    assert status["Healthy"]["reason"] == "Replacing"
