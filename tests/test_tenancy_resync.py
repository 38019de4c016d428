"""The tenancy boundary over time: what happens to a Proxy that was serving
before the operator narrowed ``tenancy:``.

docs/security.md promises: "anything else is Failed, reason SpecNotAllowed ... and is never
served (a serving one is withdrawn at the next resync)".  These tests run the real resync
(:meth:`app.dispatch.proxies.Dispatcher.resync` with :func:`app.proxy.reconcile.drifted`, as the
``proxy.resync`` task does), then every step it queued, with the narrowed settings, against the
API fake and real Redis.
"""

from __future__ import annotations

import pytest

from app.serving import view as serving
from app.config.providers import ProvidersConfig
from app.dispatch.proxies import Dispatcher, Router
from app.proxy.reconcile import CREATE, DELETE, POLL, create, delete, drifted, poll, steady
from app.config.tenancy import Tenancy
from app.wiring import PROVIDER_TYPES, parse_config
from tests.support.contexts import k8s_provider
from tests.support.proxies import apply, kubelet_runs, pods, read

pytestmark = pytest.mark.timeout(60)

STEPS = {"proxy.create": create, "proxy.poll": poll, "proxy.delete": delete}


class Sent(list):
    def __call__(self, task, args, queue, countdown=None):
        self.append((task, list(args), queue, countdown))


def _resync_and_run(ctx, redis_client, rounds: int = 3) -> list[str]:
    """What beat's ``proxy.resync`` and the workers do: resync, then run every queued step (and
    its followups) with ``ctx``; return the task names that were sent."""
    config = ProvidersConfig((k8s_provider(),))
    sent = Sent()
    dispatcher = Dispatcher(redis_client, Router(config, PROVIDER_TYPES), sent)
    names = []
    for _ in range(rounds):
        sent.clear()
        dispatcher.resync(ctx.kube.list_proxies(), drifted=lambda p: drifted(ctx, p))
        for task, args, _queue, _countdown in list(sent):
            names.append(task)
            from app.proxy.reconcile import Ref
            ref = Ref(*args[:3]) if len(args) >= 3 else None
            followup = STEPS[task](ctx, ref)
            for _ in range(5):
                if followup is None:
                    break
                step = {CREATE: create, POLL: poll, DELETE: delete}[followup.action]
                followup = step(ctx, ref)
    return names


def _narrowed():
    return parse_config({"providers": [], "tenancy": {"externalProxyNamespaces": ["crawl-ops"],
                                                      "cloudInitNamespaces": ["crawl-ops"]}}, "p.yaml").tenancy


def test_a_steady_external_proxy_is_withdrawn_at_the_next_resync_once_its_namespace_is_no_longer_allowed(
        make_context, api, redis_client):
    """An External Proxy of team-x, Running and published while every namespace was allowed.
    The operator narrows externalProxyNamespaces to crawl-ops; the documented promise is that
    the next resync withdraws it.  The resync skips it (steady and published: nothing is sent),
    so it keeps being served forever."""
    ref = apply(api, "ext", {"mode": "External", "endpoint": {"host": "203.0.113.9", "port": 3128}},
                namespace="team-x")
    create(make_context(k8s_provider(), tenancy=Tenancy.open()), ref)
    assert steady(read(api, ref)) and serving.get(redis_client, ref.uid) is not None

    narrowed = make_context(k8s_provider(), tenancy=_narrowed())
    _resync_and_run(narrowed, redis_client)
    proxy = read(api, ref)
    assert serving.get(redis_client, ref.uid) is None, "still served after the resync"
    assert proxy.phase == "Failed"


def test_a_steady_cloud_init_proxy_is_withdrawn_at_the_next_resync_once_its_namespace_is_no_longer_allowed(
        make_context, api, redis_client):
    """A Managed Proxy of team-x with spec.cloudInit (its author's code on the instance), Running
    and published while cloud-init was allowed everywhere.  After cloudInitNamespaces is narrowed
    the resync never sends anything for it and nothing re-checks it: it stays served."""
    ref = apply(api, "squid", {"provider": "k8s-local", "cloudInit": {"inline": "#cloud-config\nruncmd: [id]\n"}},
                namespace="team-x")
    ctx_open = make_context(k8s_provider(), tenancy=Tenancy.open())
    create(ctx_open, ref)
    [pod] = pods(api)
    kubelet_runs(api, pod.metadata.name, "10.1.2.3", pod.metadata.namespace)
    poll(ctx_open, ref)
    assert read(api, ref).phase == "Running" and steady(read(api, ref))
    assert serving.get(redis_client, ref.uid) is not None

    narrowed = make_context(k8s_provider(), tenancy=_narrowed())
    _resync_and_run(narrowed, redis_client)
    assert serving.get(redis_client, ref.uid) is None, "a refused cloud-init Proxy is still served"
    assert read(api, ref).phase == "Failed"


def test_a_poll_never_republishes_a_cloud_init_proxy_its_namespace_may_no_longer_run(
        make_context, api, redis_client):
    """The poll step (queued by the resync for an Unhealthy Proxy, or by a flushed Redis) writes
    Running and publishes again without looking at the tenancy settings."""
    ref = apply(api, "squid", {"provider": "k8s-local", "vendorData": "#cloud-config\n"}, namespace="team-x")
    ctx_open = make_context(k8s_provider(), tenancy=Tenancy.open())
    create(ctx_open, ref)
    [pod] = pods(api)
    kubelet_runs(api, pod.metadata.name, "10.1.2.4", pod.metadata.namespace)
    poll(ctx_open, ref)
    assert serving.get(redis_client, ref.uid) is not None
    serving.withdraw(redis_client, ref.uid)  # e.g. a flushed Redis: the resync polls it

    narrowed = make_context(k8s_provider(), tenancy=_narrowed())
    poll(narrowed, ref)
    assert serving.get(redis_client, ref.uid) is None, "the poll re-published a refused cloud-init Proxy"
