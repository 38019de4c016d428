"""The Kubernetes gateway and the one Proxy status writer, against the API fake.

:mod:`app.kube.status_writer` is what both the reconciler and the health engine write status
through: only what differs, the read's resourceVersion as a precondition, a fixed patch never
re-applied after a 409, a patch built from the object re-read and rebuilt after one, Events once
per happening.  :class:`app.kube.gateway.KubernetesGateway` records its own writes for the watcher's
de-duplication unless told not to.
"""

from __future__ import annotations

import pytest
from kubernetes import client as k8s

from app.kube import conditions, status_writer

from app.kube import credentials
from app.kube.gateway import KubeGateway, KubernetesGateway, OwnerReference, Secret
from app.errors import Permanent, Transient
from app.resources import PLURAL
from tests.support.proxies import NS, apply

pytestmark = pytest.mark.timeout(60)


def external(api, name: str):
    ref = apply(api, name, {"mode": "External", "endpoint": {"host": "192.0.2.1", "port": 3128}})
    return KubernetesGateway(api).get_proxy(ref.namespace, ref.name)


def status_patches(fake) -> int:
    return fake.request_count("patch", f"{PLURAL}/status")


def events_of(api, name: str) -> list[tuple[str, str]]:
    items = k8s.CoreV1Api(api).list_namespaced_event(NS).items
    return [(e.type, e.reason) for e in items if e.involved_object.name == name]


def test_the_gateway_implements_the_protocol(api):
    assert isinstance(KubernetesGateway(api), KubeGateway)


def test_only_what_differs_is_sent_and_nothing_when_nothing_differs(fake, api):
    kube = KubernetesGateway(api)
    proxy = external(api, "diff-1")
    proxy = status_writer.write(kube, proxy, {"phase": "Running", "address": "192.0.2.1"})
    assert status_patches(fake) == 1 and proxy.status["phase"] == "Running"
    same = status_writer.write(kube, proxy, {"phase": "Running", "address": "192.0.2.1"})
    assert same is proxy and status_patches(fake) == 1          # no request at all
    cleared = status_writer.write(kube, proxy, {"phase": "Running", "address": None})
    assert "address" not in cleared.status and status_patches(fake) == 2   # None deletes (merge patch)


def test_a_fixed_patch_is_never_reapplied_after_a_conflict(fake, api):
    """The reconciler's patches go with a decision about the object: a 409 goes back to the step."""
    kube = KubernetesGateway(api)
    proxy = external(api, "fixed-1")
    KubernetesGateway(api).patch_status(proxy, {"phase": "Running"})    # another writer: proxy is stale
    with pytest.raises(k8s.ApiException) as info:
        status_writer.write(kube, proxy, {"phase": "Failed"})
    assert info.value.status == 409
    assert kube.get_proxy(NS, "fixed-1").status["phase"] == "Running"
    assert status_patches(fake) == 2
    assert events_of(api, "fixed-1") == []


def test_a_built_patch_is_rebuilt_from_the_object_that_won_the_race(fake, api):
    """A reconciler write between the health read and its patch: the 409 is answered by reading
    again and rebuilding, so neither writer's condition is lost."""
    kube = KubernetesGateway(api, record_writes=False)
    proxy = external(api, "race-1")
    reconciler = KubernetesGateway(api)
    seen: list[str] = []

    def build(p):
        seen.append(p.resource_version)
        if len(seen) == 1:   # the reconciler writes Provisioned meanwhile
            reconciler.patch_status(p, {"conditions": conditions.set_condition(
                p.status.get("conditions"), "Provisioned", "True", reason="InstanceRunning", message="running", generation=p.generation)})
        return {"phase": "Ready", "conditions": conditions.set_condition(
            p.status.get("conditions"), "Healthy", "True", reason="OK", message="probes pass", generation=p.generation)}

    written = status_writer.write_latest(kube, NS, "race-1", uid=proxy.uid, build=build)
    assert written is not None and len(seen) == 2 and seen[0] != seen[1]
    final = kube.get_proxy(NS, "race-1")
    assert final.phase == "Ready"
    assert {c["type"] for c in final.status["conditions"]} == {"Provisioned", "Healthy"}
    assert kube.take_written() == []   # not recorded: record_writes=False


def test_a_conflict_that_persists_propagates_after_the_attempts(fake, api):
    kube = KubernetesGateway(api)
    proxy = external(api, "race-2")
    fake.fail_next("patch", f"{PLURAL}/status", code=409, reason="Conflict", times=3)
    with pytest.raises(k8s.ApiException) as info:
        status_writer.write_latest(kube, NS, "race-2", uid=proxy.uid, build=lambda p: {"phase": "Ready"}, attempts=3)
    assert info.value.status == 409 and status_patches(fake) == 3


def test_write_latest_leaves_other_objects_alone(fake, api):
    kube = KubernetesGateway(api)
    proxy = external(api, "other-1")
    assert status_writer.write_latest(kube, NS, "missing", uid="uid", build=lambda p: {"phase": "Ready"}) is None
    assert status_writer.write_latest(kube, NS, "other-1", uid="another-uid", build=lambda p: {"phase": "Ready"}) is None
    assert status_writer.write_latest(kube, NS, "other-1", uid=proxy.uid, build=lambda p: None) is None
    assert status_patches(fake) == 0


def test_events_once_per_happening(api):
    kube = KubernetesGateway(api)
    proxy = external(api, "ev-1")
    proxy = status_writer.write(kube, proxy, {"phase": "Running"})                       # default: the phase
    proxy = status_writer.write(kube, proxy, {"phase": "Running"})                       # nothing differs
    proxy = status_writer.write(kube, proxy, {"address": "192.0.2.9"},
                                event=("Warning", "InstanceLost", "gone"))               # explicit, no phase change
    proxy = status_writer.write(kube, proxy, {"phase": "Failed"}, event=lambda before: None)  # chosen: none
    assert sorted(events_of(api, "ev-1")) == [("Normal", "Running"), ("Warning", "InstanceLost")]


def test_own_writes_are_recorded_per_gateway_setting(api):
    recording, silent = KubernetesGateway(api), KubernetesGateway(api, record_writes=False)
    proxy = external(api, "own-1")
    proxy = recording.add_finalizer(proxy)
    proxy = recording.patch_status(proxy, {"phase": "Running"})
    silent.patch_status(proxy, {"phase": "Ready"})
    written = recording.take_written()
    assert len(written) == 2 and written[-1] == proxy.resource_version
    assert recording.take_written() == [] and silent.take_written() == []


def test_the_credentials_secret_is_used_only_when_the_proxy_owns_it(fake, api):
    kube = KubernetesGateway(api)
    proxy = external(api, "auth-1")
    auth = credentials.ensure(kube, proxy)
    secret = kube.read_secret(NS, credentials.secret_name(proxy))
    assert [(o.kind, o.uid, o.controller) for o in secret.owners] == [("Proxy", proxy.uid, True)]
    assert credentials.read(kube, proxy) == auth and credentials.ensure(kube, proxy) == auth   # reused

    earlier = external(api, "auth-2")
    fake.gc.pause()  # the Secret of an earlier Proxy, before the cluster's garbage collector deletes it
    kube.create_secret(Secret(NS, credentials.secret_name(earlier), {"username": b"u"},
                              owners=(OwnerReference("crawl.example.com/v1alpha1", "Proxy", "auth-2", "old-uid"),)))
    with pytest.raises(Transient):
        credentials.read(kube, earlier)
    foreign = external(api, "auth-3")
    kube.create_secret(Secret(NS, credentials.secret_name(foreign), {"username": b"u"}))
    with pytest.raises(Permanent):
        credentials.ensure(kube, foreign)
    credentials.delete(kube, foreign)                   # not ours: left alone
    assert kube.read_secret(NS, credentials.secret_name(foreign)) is not None
    credentials.delete(kube, proxy)
    assert kube.read_secret(NS, credentials.secret_name(proxy)) is None
