"""A rotated basic-auth Secret replaces instances that carry the htpasswd inside them (gcp, kvm).

The gcp provider ships the htpasswd line in the instance's metadata, so the old password keeps
working on the instance until it is replaced.  Reconcile steps in-process against the
Kubernetes API fake and the real Compute client against the Compute fake.
"""

from __future__ import annotations


import pytest
from kubernetes import client as k8s

from app.kube import credentials
from app.wiring import parse_config as parse
from app.proxy.reconcile import CREATE, create, credentials_hash, poll
from app.config.settings import Settings
from tests.gcp.conftest import PROJECT, ZONES
from tests.support.proxies import NS, apply, read, rotate_credentials

pytestmark = pytest.mark.timeout(60)


@pytest.fixture()
def ctx(make_context, compute):
    from app.providers.gcp.provider import GcpProvider

    cfg = parse({"providers": [{"name": "gcp-test", "type": "gcp", "squid": {"basicAuth": True},
                                "gcp": {"project": PROJECT, "zones": list(ZONES), "apiEndpoint": compute.url,
                                        "anonymous": True, "requestTimeout": "5s", "operationTimeout": "10s"}}]},
                "providers-test.yaml")
    return make_context(*cfg.providers, factories={"gcp": GcpProvider},
                        settings=Settings(poll_initial=0.2, poll_max=1, retry_initial=0.2, retry_max=1))


def _htpasswd_on_instances(compute) -> list[str]:
    return [item["value"] for inst in compute.instances.values()
            for item in inst.get("metadata", {}).get("items", []) if item["key"] == "squid-htpasswd"]


def _settle(ctx, ref, first):
    followup = first
    steps = {"create": create, "poll": poll}
    while followup is not None:
        followup = steps[followup.action](ctx, ref, followup.attempt)


def test_a_rotated_secret_replaces_the_gce_instance_and_nothing_else_does(kube_client, compute, ctx):
    ref = apply(kube_client, "rot-1", {"provider": "gcp-test", "placement": {"zone": ZONES[0]}})
    _settle(ctx, ref, create(ctx, ref))
    proxy = read(kube_client, ref)
    assert proxy.phase == "Running"
    [old_line] = _htpasswd_on_instances(compute)
    assert proxy.status["credentialsHash"] == credentials_hash(old_line)

    # Unchanged credentials: a resync poll replaces nothing.
    assert poll(ctx, ref) is None
    assert len(compute.calls("DELETE")) == 0

    # The user rotates the password (new password and the htpasswd line that goes with it).
    line = rotate_credentials(kube_client, credentials.secret_name(proxy))

    followup = poll(ctx, ref)
    assert followup is not None and followup.action == CREATE
    _settle(ctx, ref, followup)
    proxy = read(kube_client, ref)
    assert proxy.phase == "Running" and proxy.status["credentialsHash"] == credentials_hash(line)
    assert [x.strip() for x in _htpasswd_on_instances(compute)] == [line]   # one instance, the new line
    assert len(compute.calls("DELETE")) == 1
    listed = k8s.CoreV1Api(kube_client).list_namespaced_event(NS).items
    events = [e.reason for e in listed]
    assert "CredentialsRotated" in events
    # the replacement says why: the rotation, not a spec change the user never made
    [replacing] = [e.message for e in listed if e.reason == "Replacing"]
    assert replacing.startswith("the basic-auth credentials changed: replacing instance"), replacing


def test_a_retried_replacement_still_says_it_is_for_the_rotation(kube_client, compute, ctx):
    """The old instance's delete fails once (a 503 from Compute): the create step is retried,
    its condition and Event meanwhile say the error, and the retried replacement still tells
    the rotation, not a spec change the user never made."""
    ref = apply(kube_client, "rot-retry", {"provider": "gcp-test", "placement": {"zone": ZONES[0]}})
    _settle(ctx, ref, create(ctx, ref))
    assert read(kube_client, ref).phase == "Running"
    line = rotate_credentials(kube_client, credentials.secret_name(read(kube_client, ref)))
    compute.fail("DELETE", r"/instances/", 503, "backendError", times=1)

    followup = poll(ctx, ref)
    assert followup is not None and followup.action == CREATE
    followup = create(ctx, ref, followup.attempt)              # the delete answers 503: retried
    assert followup is not None and followup.action == CREATE and followup.attempt == 1
    assert read(kube_client, ref).phase != "Running"
    _settle(ctx, ref, followup)
    proxy = read(kube_client, ref)
    assert proxy.phase == "Running" and proxy.status["credentialsHash"] == credentials_hash(line)
    assert [x.strip() for x in _htpasswd_on_instances(compute)] == [line]
    replacing = [e.message for e in k8s.CoreV1Api(kube_client).list_namespaced_event(NS).items
                 if e.reason == "Replacing" and e.involved_object.name == "rot-retry"]
    assert replacing and all(m.startswith("the basic-auth credentials changed: replacing instance")
                             for m in replacing), replacing
