"""kvm: a poll that runs while the create is still making the domain (the per-Proxy lock lost,
e.g. Redis flushed) finds no domain yet: the Proxy stays Provisioning, nothing is recreated.

Real libvirtd over real sshd (the session's rig), the Kubernetes API fake for the Proxy.  The
create is held in its image download (a slow image server) while the poll runs.
"""

from __future__ import annotations

import uuid

import pytest
from kubernetes import client as k8s

from app.kube.gateway import KubernetesGateway
from app.providers.naming import instance_name
from app.proxy.reconcile import POLL, create, poll
from app.resources import GROUP, PLURAL, VERSION
from tests.kvm.test_delete_during_create import NS, _apply, _ctx, _domains, _release
from tests.support.proxies import Background
from tests.support.waiting import wait_until

pytestmark = pytest.mark.timeout(120)


def test_a_poll_beside_a_create_still_making_the_domain_keeps_it_provisioning(rig, image, kube_client, redis_client):
    path, url, sha, _ = image()
    key = "lag-" + uuid.uuid4().hex[:8]
    rig.images.delays[path] = 4                      # the create waits in its image download
    ctx = _ctx(kube_client, redis_client, rig.entry(images={key: {"url": url, "sha256": sha}}))
    provider = ctx.registry.get("kvm-test")
    ref = _apply(kube_client, "kvm-lag-1", {"provider": "kvm-test",
                                               "placement": {"zone": "h1", "image": key, "machineType": "small"}})
    creating = Background(create, ctx, ref)
    wait_until(lambda: rig.images.gets.get(path) == 1, 20, "image download started")
    assert instance_name(ref.uid) not in _domains(provider)
    followup = poll(ctx, ref)                       # no domain yet: still provisioning, not lost
    assert followup is not None and followup.action == POLL, followup
    proxy = KubernetesGateway(kube_client).get_proxy(NS, "kvm-lag-1")
    assert proxy.phase == "Provisioning" and proxy.status["providerID"] == f"hosts/h1/domains/{instance_name(ref.uid)}"
    cond = next(c for c in proxy.status["conditions"] if c["type"] == "Provisioned")
    assert cond["reason"] == "NotVisibleYet", cond
    creating.join(60)
    assert _domains(provider).count(instance_name(ref.uid)) == 1
    followup = poll(ctx, ref, followup.attempt)     # the domain shows now
    assert followup is None or followup.action == POLL
    events = [e.reason for e in k8s.CoreV1Api(kube_client).list_namespaced_event(NS).items
              if e.involved_object.uid == ref.uid]
    assert "InstanceLost" not in events
    k8s.CustomObjectsApi(kube_client).delete_namespaced_custom_object(GROUP, VERSION, NS, PLURAL, "kvm-lag-1")
    _release(ctx, ref)
    assert instance_name(ref.uid) not in _domains(provider)
