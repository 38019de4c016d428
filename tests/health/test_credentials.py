"""The health worker sends basic-auth credentials only to the Proxy that owns them (defence in
depth, docs/security.md): serving-view records forged straight into Redis name other
namespaces, Secrets, uids and addresses; none of them makes the probe carry a Secret's
credentials anywhere.  The listeners that stand in for the forger's "proxy" are real HTTP
servers that record every header they receive.
"""

from __future__ import annotations

import base64
import json
import logging

import pytest
from kubernetes import client as k8s

from app.serving import view as serving
from app.store import keys as redis_keys
from app.squid import conf as squid_conf
from app.probes import engine
from app.probes.credentials import SecretCredentials
from app.kube.gateway import KubernetesGateway
from app.resources import API_VERSION, KIND
from tests.health.conftest import NET
from tests.health.servers import OriginServer

pytestmark = pytest.mark.timeout(90)

VICTIM_PASSWORD = "victim-S3cret-pass"
STOLEN_PASSWORD = "kube-system-S3cret"


@pytest.fixture()
def listeners():
    """Two header-recording servers: ``forger`` (an address of the forger's choice) and
    ``victim`` (the victim Proxy's real endpoint)."""
    servers = {"forger": OriginServer(NET.host(2)).start(), "victim": OriginServer(NET.host(3)).start()}
    yield servers
    for s in servers.values():
        s.stop()


def _secret(api, namespace: str, name: str, password: str, owner=None) -> None:
    body = squid_conf.credentials_secret(name, namespace, username="user-" + name, password=password)
    if owner is not None:
        body["metadata"]["ownerReferences"] = [{"apiVersion": API_VERSION, "kind": KIND, "name": owner.name,
                                                "uid": owner.uid, "controller": True}]
    k8s.CoreV1Api(api).create_namespaced_secret(namespace, body)


def _authorizations(server: OriginServer) -> list[str]:
    out = []
    for req in server.requests:
        for key, value in req["headers"].items():
            if key.lower() == "proxy-authorization":
                out.append(base64.b64decode(value.split()[1]).decode())
    return out


def _forge(r, url: str, **fields) -> None:
    """Write a serving-view record straight into Redis, as anything that reaches Redis could."""
    uid = fields["uid"]
    record = {"mode": "External", "maxLeases": "5", "phase": "Running", "labels": "{}",
              "healthCheck": json.dumps({"url": url, "timeoutSeconds": 2, "intervalSeconds": 30}),
              **serving.HEALTH_DEFAULTS, **fields}
    r.delete(redis_keys.proxy(uid))
    r.hset(redis_keys.proxy(uid), mapping=record)
    r.sadd(redis_keys.PROXIES, uid)


def test_forged_records_never_carry_a_secret_anywhere(fake, fleet, settings, origin, listeners, caplog):
    api = fake.api_client()
    forger, real = listeners["forger"], listeners["victim"]
    url = origin.url("/generate_204")
    victim = fleet.external("victim", real.address, real.port)
    other = fleet.external("other", forger.address, forger.port)
    _secret(api, "default", "victim-proxy-auth", VICTIM_PASSWORD, owner=victim)
    _secret(api, "kube-system", "stolen", STOLEN_PASSWORD)                     # nobody's
    _secret(api, "default", "loose-secret", STOLEN_PASSWORD)                   # nobody's, the victim's namespace
    _secret(api, "default", "other-proxy-auth", VICTIM_PASSWORD, owner=victim)  # owned by another Proxy
    credentials = SecretCredentials(KubernetesGateway(api))
    caplog.set_level(logging.DEBUG)

    forged = {
        "a namespace and Secret of the forger's choice": dict(
            uid="forged-1", namespace="kube-system", name="stolen", authSecret="stolen",
            address=forger.address, port=str(forger.port)),
        "the victim's identity, the forger's address": dict(
            uid=victim.uid, namespace="default", name="victim", authSecret="victim-proxy-auth",
            address=forger.address, port=str(forger.port)),
        "the victim's address and Secret, another uid": dict(
            uid="forged-3", namespace="default", name="victim", authSecret="victim-proxy-auth",
            address=forger.address, port=str(forger.port)),
        "the victim's record naming another Secret of its namespace": dict(
            uid=victim.uid, namespace="default", name="victim", authSecret="loose-secret",
            address=real.address, port=str(real.port)),
        "a real Proxy whose Secret another Proxy owns": dict(
            uid=other.uid, namespace="default", name="other", authSecret="other-proxy-auth",
            address=forger.address, port=str(forger.port)),
    }
    for what, fields in forged.items():
        _forge(fleet.r, url, **fields)
        report = engine.probe_batch(fleet.r, [fields["uid"]], settings, kube=fleet.kube, credentials=credentials)
        assert report.probed == 1, what
        assert fleet.r.exists(redis_keys.auth(fields["uid"])) == 0, what  # nothing copied for the API
    assert len(forger.requests) == 4 and len(real.requests) == 1  # every forged record was probed ...
    assert _authorizations(forger) == [] and _authorizations(real) == []  # ... without credentials

    # The genuine record (as the reconciler publishes it) gets the victim's own credentials,
    # sent to the victim's own endpoint only.
    fleet.r.delete(redis_keys.proxy(victim.uid))
    serving.publish(fleet.r, fleet.read("default", "victim"), address=real.address, port=real.port,
                    phase="Running", auth_secret="victim-proxy-auth")
    engine.probe_batch(fleet.r, [victim.uid], settings, kube=fleet.kube, credentials=credentials)
    assert _authorizations(real) == [f"user-victim-proxy-auth:{VICTIM_PASSWORD}"]
    assert _authorizations(forger) == []

    warnings = [r.getMessage() for r in caplog.records if r.name == "app.probes.credentials"]
    assert any("endpoint is not the Proxy's" in w for w in warnings)
    assert any("no such Proxy" in w for w in warnings)
    assert any("uid is not the Proxy's" in w for w in warnings)
    assert any("not the Proxy's credentials Secret" in w for w in warnings)
    assert any("NotOwned" in w or "Permanent" in w or "Transient" in w for w in warnings)
    text = caplog.text
    assert VICTIM_PASSWORD not in text and STOLEN_PASSWORD not in text
    api.close()
