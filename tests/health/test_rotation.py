"""A password rotation never withdraws the proxy it rotates, in process.

A real Squid with basic auth reads its htpasswd file from a volume directory written the way
the kubelet writes Secret volumes (devcluster/kubelet.py ``write_atomic``); the Proxy's
credentials Secret lives in the API fake; probes run through the real engine with the real
:class:`SecretCredentials`.  Both orders of a rotation are covered:

* the probes learn the new password before the instance does (the kubelet has not updated
  the file yet): the proxy still accepts the previous one, which the probe falls back to;
* the instance learns it first (the probes' cached copy of the Secret is old): a 407 reads the
  Secret again.

With ``failureThreshold: 1``, a single probe held against the proxy would withdraw it.
"""

from __future__ import annotations

import base64
import os
import tempfile
import time

import pytest
from kubernetes import client as k8s

from app.serving import view as serving
from app.store import keys as redis_keys
from app.squid import conf as squid_conf
from app.probes.credentials import SecretCredentials
from app.kube.gateway import KubernetesGateway
from app.resources import API_VERSION, KIND
from devcluster.kubelet import write_atomic
from devcluster.squid import loopback_policy, start_on_free_port

pytestmark = pytest.mark.timeout(90)

USER = "crawler"
OLD, NEW = "old-S3cret-password", "new-S3cret-password"


def put_secret(api, owner, password: str, *, create: bool = False) -> None:
    body = squid_conf.credentials_secret(f"{owner.name}-proxy-auth", "default", username=USER, password=password)
    body["metadata"]["ownerReferences"] = [{"apiVersion": API_VERSION, "kind": KIND, "name": owner.name,
                                            "uid": owner.uid, "controller": True}]
    core = k8s.CoreV1Api(api)
    if create:
        core.create_namespaced_secret("default", body)
    else:
        core.replace_namespaced_secret(f"{owner.name}-proxy-auth", "default", body)


def lease_password(r, uid: str) -> str | None:
    return r.hget(redis_keys.auth(uid), "password")


@pytest.fixture()
def authed_squid(next_address):
    """A Squid requiring basic auth, its htpasswd in a kubelet-style volume; yields ``(squid, update)``."""
    volume = tempfile.mkdtemp(prefix="volume-")
    os.chmod(volume, 0o755)

    def update(password: str) -> None:
        write_atomic(volume, {"htpasswd": squid_conf.htpasswd_entry(USER, password) + "\n"})
        time.sleep(1.1)  # basic_ncsa_auth compares modification times in whole seconds

    update(OLD)
    address = next_address()
    policy = loopback_policy(squid_conf.SquidPolicy(basic_auth_file=squid_conf.DEFAULT_HTPASSWD_PATH,
                                                    credentials_ttl=1))
    squid = start_on_free_port(address, lambda port: squid_conf.render(port, policy),
                               htpasswd_file=os.path.join(volume, "htpasswd"))
    yield squid, update
    squid.stop()


def test_a_rotation_in_either_order_never_withdraws_the_proxy(fake, fleet, settings, authed_squid):
    squid, update = authed_squid
    api = fake.api_client()
    px = fleet.external("rotated", squid.address, squid.port, health={"failureThreshold": 1})
    serving.publish(fleet.r, px, address=squid.address, port=squid.port, phase="Running",
                    auth_secret="rotated-proxy-auth")
    put_secret(api, px, OLD, create=True)
    creds = SecretCredentials(KubernetesGateway(api), ttl=3600)  # a long cache: only a 407 reads the Secret again

    def probe():
        report = fleet.probe([px], settings, credentials=creds)
        assert report.failed == 0, report
        assert fleet.read("default", "rotated").phase == "Ready"
        return serving.get(fleet.r, px.uid)

    assert probe()["healthy"] == "1" and lease_password(fleet.r, px.uid) == OLD

    # 1. The instance learns the new password first; the probes' cached copy still says OLD.
    put_secret(api, px, NEW)
    update(NEW)
    time.sleep(1.5)  # Squid's credentialsttl (1 s) for the old pair runs out
    rec = probe()
    assert rec["lastReason"] == "ProbeSucceeded"
    assert lease_password(fleet.r, px.uid) == NEW  # crawlers get the pair that works now

    # 2. The probes learn the next password before the instance does.
    put_secret(api, px, OLD)
    creds = SecretCredentials(KubernetesGateway(api), ttl=3600)  # a fresh cache reads OLD at once
    rec = probe()
    assert "previous password" in rec["lastMessage"]
    assert lease_password(fleet.r, px.uid) == NEW  # still the pair the proxy accepts
    update(OLD)
    time.sleep(1.5)
    rec = probe()
    assert "previous password" not in rec["lastMessage"]
    assert lease_password(fleet.r, px.uid) == OLD
    for password in (OLD, NEW):
        assert password not in rec["lastMessage"] + rec["lastVerdictMessage"]


def test_a_forged_record_gets_no_fallback_credentials(fake, fleet, settings, authed_squid):
    squid, _ = authed_squid
    px = fleet.external("victim2", squid.address, squid.port, health={"failureThreshold": 1})
    fleet.r.hset(redis_keys.auth(px.uid), mapping={"username": USER, "password": OLD})
    # published with a Secret the Proxy does not own: no credentials, and no fallback either
    serving.publish(fleet.r, px, address=squid.address, port=squid.port, phase="Running",
                    auth_secret="victim2-proxy-auth")
    report = fleet.probe([px], settings, credentials=SecretCredentials(KubernetesGateway(fake.api_client())))
    assert report.failed == 1 and report.reasons == {"ProxyAuthRequired": 1}
    assert base64.b64encode(OLD.encode()).decode() not in squid.log()
