"""What a new Proxy's create step asks of the Kubernetes API, and the cases the cuts must keep.

A create step of a new kubernetes-provider Proxy makes 6 requests (it made 9: a re-read after
the Pod create, a separate Pending write and a re-read to route the poll are gone; see
docs/performance.md, "Fewer API requests per create").  The count is pinned here, request by
request, so it cannot grow back unnoticed.  The post-create status write is optimistic (it
carries the write-ahead's resourceVersion): the tests below change the Proxy while its Pod
create is held by the fake and check that the 409 falls back to the re-read and the decisions
of before (delete, replace, keep the other writer's condition).
"""

from __future__ import annotations

import pytest

from app.kube import conditions, status_writer
from app.config.providers import ProvidersConfig
from app.dispatch.proxies import Dispatcher, Router
from app.kube.gateway import KubernetesGateway
from app.providers.naming import instance_name
from app.proxy.reconcile import CREATE, DELETE, POLL, create, decide
from app.resources import PLURAL
from app.wiring import PROVIDER_TYPES
from tests.support.contexts import k8s_provider
from tests.support.proxies import (Background, apply, kubectl_delete, kubelet_runs, patch_spec, pods, read,
                                   run_delete_until_released)
from tests.support.waiting import wait_until

NS = "default"
PROXY = f"/apis/crawl.example.com/v1alpha1/namespaces/{NS}/proxies/"
pytestmark = pytest.mark.timeout(60)


class Sent(list):
    """The dispatcher's ``send``: records ``(task, args, queue, countdown)``."""

    def __call__(self, task, args, queue, countdown=None):
        self.append((task, list(args), queue, countdown))


@pytest.fixture()
def ctx(make_context):
    return make_context()  # one k8s-local provider on the API fake


@pytest.fixture()
def sent():
    return Sent()


@pytest.fixture()
def dispatcher(redis_client, sent):
    return Dispatcher(redis_client, Router(ProvidersConfig((k8s_provider(),)), PROVIDER_TYPES), sent)


def test_a_new_proxys_create_step_makes_six_requests(fake, api, ctx, dispatcher, sent):
    ref = apply(api, "count-1", {"provider": "k8s-local"})
    log = fake.record_requests()

    assert dispatcher.run_step(ctx, CREATE, ref) == "followup"

    pod = instance_name(ref.uid)
    assert log == [
        ("GET", PROXY + "count-1"),             # the task's read (messages carry references only)
        ("PATCH", PROXY + "count-1"),           # the finalizer
        ("PATCH", PROXY + "count-1/status"),    # write-ahead: Provisioning, the provider ID
        ("POST", f"/api/v1/namespaces/{NS}/events"),  # Event Provisioning
        # the Squid Pods' egress NetworkPolicy, once per namespace and process
        ("POST", f"/apis/networking.k8s.io/v1/namespaces/{NS}/networkpolicies"),
        ("POST", f"/api/v1/namespaces/{NS}/pods"),    # the instance
        ("PATCH", PROXY + "count-1/status"),    # Provisioning, instance requested (optimistic)
    ]
    # the poll was routed from the Proxy the step wrote, not read again
    assert [(task, queue) for task, _, queue, _ in sent] == [("proxy.poll", "proxies")]
    proxy = read(api, ref)
    assert proxy.phase == "Provisioning" and proxy.status["providerID"] == f"{NS}/{pod}"
    provisioned = conditions.find(proxy.status["conditions"], "Provisioned")
    assert (provisioned["status"], provisioned["reason"]) == ("False", "Provisioning")

    # Its followups up to Running: a poll while the Pod is Pending (2), one once it runs (4).
    log.clear()
    assert dispatcher.run_step(ctx, POLL, ref) == "followup"
    assert len(log) == 2
    kubelet_runs(api, pod, "10.1.2.3")
    log.clear()
    assert dispatcher.run_step(ctx, POLL, ref) == "done"
    assert [m for m, _ in log] == ["GET", "GET", "PATCH", "POST"]
    assert read(api, ref).phase == "Running"

    # the next Proxy of the namespace: six requests, the NetworkPolicy is in place
    second = apply(api, "count-2", {"provider": "k8s-local"})
    log.clear()
    assert dispatcher.run_step(ctx, CREATE, second) == "followup"
    assert len(log) == 6 and not any("networkpolicies" in path for _, path in log), log


def test_the_phase_goes_from_none_to_provisioning_in_one_write(fake, api, ctx):
    ref = apply(api, "phases-1", {"provider": "k8s-local"})
    fake.delay_next("create", "pods", seconds=1)
    creating = Background(create, ctx, ref)
    wait_until(lambda: fake.request_count("create", "pods") == 1, 10, "Pod create sent")
    assert read(api, ref).status["phase"] == "Provisioning"   # no Pending write on the way
    assert creating.join().action == POLL


@pytest.mark.parametrize("code", [500, 503])
def test_a_create_that_stops_before_the_write_ahead_writes_pending(fake, api, ctx, code):
    ref = apply(api, f"stopped-{code}", {"provider": "k8s-local"})
    fake.fail_next("patch", f"{PLURAL}/status", code=code)   # the write-ahead
    followup = create(ctx, ref)
    assert followup.action == CREATE and followup.attempt == 1 and followup.delay > 0
    proxy = read(api, ref)
    assert proxy.status["phase"] == "Pending" and "providerID" not in proxy.status
    pending = conditions.find(proxy.status["conditions"], "Provisioned")
    assert (pending["status"], pending["reason"]) == ("False", "Pending")
    assert pods(api) == []
    assert create(ctx, ref, followup.attempt).action == POLL   # the retry goes on
    assert read(api, ref).phase == "Provisioning" and len(pods(api)) == 1


# -- the optimistic post-create write refused (409): re-read, decide as before ----------------------------
def test_deleted_during_a_slow_create_hands_over_to_delete(fake, api, ctx):
    """Terminating (finalizer still held) when the Pod create returns: the write conflicts, the
    re-read sees the deletion, and the delete step removes what the create made."""
    ref = apply(api, "slow-del", {"provider": "k8s-local"})
    fake.delay_next("create", "pods", seconds=1.5)
    creating = Background(create, ctx, ref)
    wait_until(lambda: fake.request_count("create", "pods") == 1, 10, "Pod create sent")
    kubectl_delete(api, ref)
    log = fake.record_requests()

    followup = creating.join()

    assert followup.action == DELETE and followup.delay == 0
    assert [(m, p) for m, p in log if p.startswith(PROXY)] == [
        ("PATCH", PROXY + "slow-del/status"), ("GET", PROXY + "slow-del")]   # 409, then the re-read
    assert len(pods(api)) == 1 and decide(read(api, ref)) == DELETE
    run_delete_until_released(ctx, ref)
    assert read(api, ref) is None and pods(api) == []


def test_a_spec_change_during_a_slow_create_is_still_unobserved_afterwards(fake, api, make_context):
    """The status records the spec the Pod was made from, so decide() replaces it."""
    ctx = make_context(k8s_provider(images=("example/squid:6", "example/squid:7")))
    ref = apply(api, "slow-spec", {"provider": "k8s-local", "placement": {"image": "example/squid:6"}})
    fake.delay_next("create", "pods", seconds=1.5)
    creating = Background(create, ctx, ref)
    wait_until(lambda: fake.request_count("create", "pods") == 1, 10, "Pod create sent")
    made = read(api, ref)
    patch_spec(api, "slow-spec", {"placement": {"image": "example/squid:7"}})
    log = fake.record_requests()

    assert creating.join().action == POLL
    assert [m for m, p in log if p.startswith(PROXY)] == ["PATCH", "GET", "PATCH"]   # 409, re-read, write
    proxy = read(api, ref)
    assert proxy.generation == 2 and proxy.phase == "Provisioning"
    assert proxy.status["specHash"] == made.spec_hash != proxy.spec_hash
    assert proxy.status["observedGeneration"] == 1
    assert decide(proxy) == CREATE   # the new spec is acted on: the Pod is replaced


def test_another_writers_condition_written_during_a_slow_create_is_kept(fake, api, ctx):
    """A status write by someone else (the health engine) between the write-ahead and the end of
    the create: the optimistic write conflicts instead of dropping that condition."""
    ref = apply(api, "slow-cond", {"provider": "k8s-local"})
    fake.delay_next("create", "pods", seconds=1.5)
    creating = Background(create, ctx, ref)
    wait_until(lambda: fake.request_count("create", "pods") == 1, 10, "Pod create sent")
    gw = KubernetesGateway(api, record_writes=False)
    status_writer.write_latest(gw, NS, "slow-cond", uid=ref.uid, build=lambda p: {
        "conditions": conditions.set_condition(p.status.get("conditions"), "Healthy", "Unknown", reason="NotProbed",
                                               message="x", generation=p.generation)})
    log = fake.record_requests()

    assert creating.join().action == POLL
    assert [m for m, p in log if p.startswith(PROXY)] == ["PATCH", "GET", "PATCH"]   # 409, re-read, write
    proxy = read(api, ref)
    assert conditions.find(proxy.status["conditions"], "Healthy")["reason"] == "NotProbed"
    provisioned = conditions.find(proxy.status["conditions"], "Provisioned")
    assert provisioned["reason"] == "Provisioning" and proxy.status["providerID"] == f"{NS}/{instance_name(ref.uid)}"
