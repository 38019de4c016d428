"""Every task that touches KVM host H runs on H's queue, without exception.

A kvm provider with hosts h1 and h2 (never dialled here) and a Proxy that moved from h1 to
h2: create goes where the spec now places it, poll and delete follow the recorded instance,
the replaced instance's delete goes to the old host, GC shards and checks to each host.
"""

from __future__ import annotations

from app.config import ProvidersConfig
from app.providers.registry import build
from app.reconcile import CREATE, DELETE, POLL, Context
from app.resources import Proxy
from app.settings import Settings
from tests.kvm import harness
from workers import routing
from workers.runtime import RETIRE_TASK
from workers.tasks import queue_for_proxy

UID = "0b1c2d3e-0000-4000-8000-00000000abcd"


def _ctx(tmp_path) -> Context:
    from app.providers.kvm.provider import KvmProvider

    entry = harness.kvm_entry(user="u", port=22, key_file=tmp_path / "key", known_hosts_file=tmp_path / "kh",
                              hosts=[{"name": "h1", "address": "127.0.0.1"}, {"name": "h2", "address": "127.0.0.1"}],
                              name="lab")
    pc = harness.provider_config(entry)
    return Context(kube=None, registry=build(ProvidersConfig((pc,)), {"kvm": KvmProvider}), redis=None,
                   settings=Settings())


def _proxy(zone: str, provider_id: str | None) -> Proxy:
    status = {"providerID": provider_id, "provider": "lab", "phase": "Ready"} if provider_id else {}
    return Proxy.from_dict({"metadata": {"namespace": "ns", "name": "p", "uid": UID, "generation": 2},
                            "spec": {"provider": "lab", "placement": {"zone": zone}}, "status": status})


def test_every_task_type_runs_on_the_queue_of_the_host_it_touches(tmp_path):
    ctx = _ctx(tmp_path)
    provider = ctx.registry.get("lab")
    old_id = "hosts/h1/domains/proxy-abc"
    moved = _proxy("h2", old_id)      # spec says h2; the instance that exists is on h1

    assert queue_for_proxy(ctx, moved, CREATE) == "kvm.lab.h2"       # the new instance's place
    assert queue_for_proxy(ctx, moved, POLL) == "kvm.lab.h1"         # the recorded instance
    assert queue_for_proxy(ctx, moved, DELETE) == "kvm.lab.h1"
    assert routing.queue_for_instance(provider, old_id) == "kvm.lab.h1"   # retire and gc.delete
    assert routing.queue_for_instance(provider, "hosts/h2/domains/proxy-abc") == "kvm.lab.h2"
    assert routing.host_queues(provider) == {"h1": "kvm.lab.h1", "h2": "kvm.lab.h2"}  # gc shards, checks
    # Nothing recorded yet: a delete looks where the spec places it.
    assert queue_for_proxy(ctx, _proxy("h2", None), DELETE) == "kvm.lab.h2"
    assert RETIRE_TASK == "instance.retire"


def test_providers_without_hosts_use_the_shared_queues(tmp_path):
    from app.config import ProviderConfig
    from app.providers.kubernetes.config import KubernetesSettings
    from app.providers.kubernetes.provider import KubernetesProvider

    pc = ProviderConfig("k8s", "kubernetes", 60, 15, KubernetesSettings())
    provider = KubernetesProvider(pc, client=object())
    assert routing.queue_for_instance(provider, "ns/proxy-abc") == routing.PROXIES
    assert routing.host_queues(provider) == {}
