"""A Proxy whose deletion has begun is out of leasing as soon as the watcher sees it, before any
delete step (no worker runs here at all): the real watcher, the API fake, real Redis."""

from __future__ import annotations

import pytest

from app.serving import leases, view as serving
from app.store import keys as redis_keys
from app.serving.leases import Filters, LeaseSettings
from app.proxy.reconcile import create
from app.config.tenancy import Tenancy
from tests.support.contexts import k8s_provider
from tests.support.processes import watcher
from tests.support.proxies import apply, kubectl_delete, read
from tests.support.waiting import wait_for

pytestmark = [pytest.mark.timeout(120), pytest.mark.slow]


def test_a_proxy_being_deleted_is_withdrawn_by_the_watcher_before_any_step(
        make_context, api, kube, redis_client, redis_url, tmp_path):
    ctx = make_context(k8s_provider(), tenancy=Tenancy.open())
    ref = apply(api, "ext", {"mode": "External", "endpoint": {"host": "203.0.113.9", "port": 3128}, "maxLeases": 5})
    create(ctx, ref)  # Running, published, with the finalizer
    redis_client.hset(redis_keys.proxy(ref.uid), mapping={"health": "healthy", "healthy": "1"})
    leases.reindex(redis_client, ref.uid)
    held = leases.acquire(redis_client, "crawler", Filters(), ttl=300, settings=LeaseSettings())
    assert held.uid == ref.uid

    proc = watcher({"KUBECONFIG": kube.write_kubeconfig(str(tmp_path / "kc")), "REDIS_URL": redis_url,
                    "PROVIDERS_CONFIG": ""}).start()
    try:
        proc.wait_for_log("leading: streaming Proxy events", timeout=60)
        kubectl_delete(api, ref)
        assert read(api, ref).deleting  # held by the finalizer: no worker runs its delete step
        wait_for(lambda: serving.get(redis_client, ref.uid) is None, 20, "the watcher to withdraw the Proxy")
    finally:
        proc.stop()
    with pytest.raises(leases.LeaseError) as refused:
        leases.acquire(redis_client, "crawler", Filters(), ttl=300, settings=LeaseSettings())
    assert refused.value.code == leases.NO_PROXY_AVAILABLE
    with pytest.raises(leases.LeaseError) as ended:
        leases.renew(redis_client, "crawler", held.id, ttl=None, settings=LeaseSettings())
    assert ended.value.code == leases.PROXY_UNAVAILABLE  # the holder hears it as documented
