"""Every task that touches KVM host H runs on H's queue, without exception.

A kvm provider with hosts h1 and h2 (never dialled here) and a Proxy that moved from h1 to
h2: create goes where the spec now places it, poll and delete follow the recorded instance,
the replaced instance's delete goes to the old host, GC shards and checks to each host.  The
router works from the providers config alone (no provider is built); the provider built from
the same config agrees with it.
"""

from __future__ import annotations

from app.store import queues
from app.config.providers import ProvidersConfig
from app.dispatch.proxies import RETIRE_TASK, Router
from app.providers.base import CheckableProvider, ShardedProvider
from app.proxy.reconcile import CREATE, DELETE, POLL
from app.resources import Proxy
from app.wiring import PROVIDER_TYPES, build_registry
from tests.kvm import harness
from workers import routing

UID = "0b1c2d3e-0000-4000-8000-00000000abcd"


def _config(tmp_path, hosts=("h1", "h2")) -> ProvidersConfig:
    entry = harness.kvm_entry(user="u", port=22, key_file=tmp_path / "key", known_hosts_file=tmp_path / "kh",
                              hosts=[{"name": h, "address": "127.0.0.1"} for h in hosts], name="lab")
    return ProvidersConfig((harness.provider_config(entry),))


def _proxy(zone: str, provider_id: str | None) -> Proxy:
    status = {"providerID": provider_id, "provider": "lab", "phase": "Ready"} if provider_id else {}
    return Proxy.from_dict({"metadata": {"namespace": "ns", "name": "p", "uid": UID, "generation": 2},
                            "spec": {"provider": "lab", "placement": {"zone": zone}}, "status": status})


def test_every_task_type_runs_on_the_queue_of_the_host_it_touches(tmp_path):
    router = Router(_config(tmp_path), PROVIDER_TYPES)
    old_id = "hosts/h1/domains/proxy-abc"
    moved = _proxy("h2", old_id)      # spec says h2; the instance that exists is on h1

    assert router.queue_for_proxy(moved, CREATE) == "kvm.lab.h2"       # the new instance's place
    assert router.queue_for_proxy(moved, POLL) == "kvm.lab.h1"         # the recorded instance
    assert router.queue_for_proxy(moved, DELETE) == "kvm.lab.h1"
    assert router.queue_for_instance("lab", old_id) == "kvm.lab.h1"   # retire and gc.delete
    assert router.queue_for_instance("lab", "hosts/h2/domains/proxy-abc") == "kvm.lab.h2"
    assert router.host_queues("lab") == {"h1": "kvm.lab.h1", "h2": "kvm.lab.h2"}  # gc shards, checks
    # Nothing recorded yet: a delete looks where the spec places it.
    assert router.queue_for_proxy(_proxy("h2", None), DELETE) == "kvm.lab.h2"
    # A host that is not configured, an ID that does not parse, an unknown provider: the shared queue.
    assert router.queue_for("lab", "h9") == router.queue_for("lab", None) == queues.PROXIES
    assert router.queue_for_instance("lab", "hosts/h9/domains/x") == queues.PROXIES
    assert router.queue_for_instance("lab", "garbage") == queues.PROXIES
    assert router.queue_for("nope", "h1") == router.queue_for_instance("nope", old_id) == queues.PROXIES
    assert RETIRE_TASK == "instance.retire"
    assert routing.PROXIES == queues.PROXIES and queues.kvm_queue("lab", "h1") == "kvm.lab.h1"


def test_a_single_host_takes_placements_without_a_zone(tmp_path):
    router = Router(_config(tmp_path, hosts=("h1",)), PROVIDER_TYPES)
    assert router.queue_for("lab", None) == "kvm.lab.h1"
    assert router.queue_for("lab", "h2") == queues.PROXIES


def test_the_built_provider_declares_its_capabilities_and_agrees_with_the_router(tmp_path):
    config = _config(tmp_path)
    router = Router(config, PROVIDER_TYPES)
    registry = build_registry(config)
    wrapped, inner = registry.get("lab"), registry.unwrapped["lab"]
    # Declared, through the metrics wrapper too; checks only on the unwrapped provider.
    assert isinstance(inner, ShardedProvider) and isinstance(wrapped, ShardedProvider)
    assert isinstance(inner, CheckableProvider) and not isinstance(wrapped, CheckableProvider)
    assert inner.credentials_in_instance and wrapped.credentials_in_instance
    assert wrapped.hosts() == list(router.host_queues("lab")) == ["h1", "h2"]
    old_id = "hosts/h1/domains/proxy-abc"
    assert router.queue_for_instance("lab", old_id) == queues.kvm_queue("lab", wrapped.host_of(old_id))


def test_providers_without_hosts_use_the_shared_queues(tmp_path):
    from app.config.providers import ProviderConfig
    from app.providers.kubernetes.config import KubernetesSettings
    from app.providers.kubernetes.provider import KubernetesProvider
    from app.providers.metrics import wrap

    pc = ProviderConfig("k8s", "kubernetes", 60, 15, KubernetesSettings())
    router = Router([pc], PROVIDER_TYPES)
    assert router.queue_for_instance("k8s", "ns/proxy-abc") == routing.PROXIES
    assert router.queue_for("k8s", "ns") == routing.PROXIES
    assert router.host_queues("k8s") == {}
    provider = KubernetesProvider(pc, client=object())
    wrapped = wrap(provider, pc)
    # A wrapper never claims a capability its provider lacks, whatever it forwards.
    assert not isinstance(provider, ShardedProvider) and not isinstance(wrapped, ShardedProvider)
    assert isinstance(provider, CheckableProvider) and not isinstance(wrapped, CheckableProvider)
    assert provider.credentials_in_instance is False and wrapped.credentials_in_instance is False
