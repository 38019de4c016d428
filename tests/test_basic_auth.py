"""Basic auth on kubernetes proxies: generated credentials in a Secret owned by the Proxy, a real
Squid that demands them, probes that use them, and an origin that never sees them."""

from __future__ import annotations

import base64
import json

import pytest
import requests
from kubernetes import client as k8s

from app.serving import view as serving

from app.squid import conf as squid
from app.wiring import parse_config as parse
from app.probes import engine
from app.probes.credentials import SecretCredentials
from app.probes.settings import HealthSettings
from app.kube.gateway import KubernetesGateway
from app.providers.kubernetes.provider import KubernetesProvider
from app.providers.registry import build
from app.proxy.reconcile import Context, Ref, create, delete, poll
from app.resources import GROUP, PLURAL, VERSION
from app.config.settings import Settings
from app.config.validation import ConfigError
from devcluster.cluster import FakeCluster
from devcluster.squid import LOOPBACK_SQUID_BLOCK
from tests.support.waiting import wait_for
from tests.support.stack_fixtures import origin  # noqa: F401 - pytest fixtures

pytestmark = pytest.mark.slow

CONFIG = {"providers": [{"name": "k8s-auth", "type": "kubernetes",
                         "squid": {"basicAuth": True, "allowedSourceRanges": ["127.0.0.0/8"],
                                   **LOOPBACK_SQUID_BLOCK}}]}


def _values(r, key) -> list:
    kind = r.type(key)
    if kind == "hash":
        return list(r.hgetall(key).values())
    if kind == "string":
        return [r.get(key)]
    if kind in ("set", "zset"):
        return list(r.smembers(key)) if kind == "set" else r.zrange(key, 0, -1)
    return r.lrange(key, 0, -1) if kind == "list" else []


def test_basic_auth_refuses_setups_that_cannot_enforce_it():
    with pytest.raises(ConfigError, match=r'provider "k": squid.basicAuth: .*kubernetes.namespace'):
        parse({"providers": [{"name": "k", "type": "kubernetes", "kubernetes": {"namespace": "proxies"},
                              "squid": {"basicAuth": True}}]}, "providers.yaml")


def test_a_foreign_secret_of_the_same_name_is_never_taken_over(redis_client):
    with FakeCluster(kubelet=False) as cluster:
        api = cluster.fake.api_client()
        registry = build(parse(CONFIG, "providers.yaml"), {"kubernetes": lambda pc: KubernetesProvider(pc, client=api)})
        ctx = Context(kube=KubernetesGateway(api), registry=registry, redis=redis_client, settings=Settings())
        k8s.CoreV1Api(api).create_namespaced_secret("default", k8s.V1Secret(
            metadata=k8s.V1ObjectMeta(name="mine-proxy-auth"), string_data={"username": "someone-else"}))
        obj = k8s.CustomObjectsApi(api).create_namespaced_custom_object(GROUP, VERSION, "default", PLURAL, {
            "apiVersion": f"{GROUP}/{VERSION}", "kind": "Proxy", "metadata": {"name": "mine"},
            "spec": {"provider": "k8s-auth"}})
        ref = Ref("default", "mine", obj["metadata"]["uid"])
        assert create(ctx, ref) is None
        proxy = KubernetesGateway(api).get_proxy("default", "mine")
        assert proxy.phase == "Failed" and "not owned by this Proxy" in proxy.status["conditions"][0]["message"]
        k8s.CustomObjectsApi(api).delete_namespaced_custom_object(GROUP, VERSION, "default", PLURAL, "mine")
        delete(ctx, ref)
        secret = k8s.CoreV1Api(api).read_namespaced_secret("mine-proxy-auth", "default")
        assert base64.b64decode(secret.data["username"]) == b"someone-else"


def test_generated_credentials_protect_the_proxy_and_feed_the_probes(redis_client, origin):
    with FakeCluster() as cluster:
        api = cluster.fake.api_client()
        registry = build(parse(CONFIG, "providers.yaml"), {"kubernetes": lambda pc: KubernetesProvider(pc, client=api)})
        ctx = Context(kube=KubernetesGateway(api), registry=registry, redis=redis_client,
                      settings=Settings(poll_initial=0.2))
        custom = k8s.CustomObjectsApi(api)
        obj = custom.create_namespaced_custom_object(GROUP, VERSION, "default", PLURAL, {
            "apiVersion": f"{GROUP}/{VERSION}", "kind": "Proxy", "metadata": {"name": "authed"},
            "spec": {"provider": "k8s-auth", "healthCheck": {"url": f"{origin}/generate_204"}}})
        ref = Ref("default", "authed", obj["metadata"]["uid"])
        create(ctx, ref)

        secret = k8s.CoreV1Api(api).read_namespaced_secret("authed-proxy-auth", "default")
        user, password = (base64.b64decode(secret.data[k]).decode() for k in ("username", "password"))
        assert secret.metadata.owner_references[0].uid == ref.uid
        pod = k8s.CoreV1Api(api).list_namespaced_pod("default").items[0]
        # The Secret volume is mounted on the file's directory, without subPath (so the kubelet
        # updates it when the Secret changes).
        directory, _, filename = squid.DEFAULT_HTPASSWD_PATH.rpartition("/")
        [mount] = [m for m in pod.spec.containers[0].volume_mounts if m.mount_path == directory]
        [volume] = [v for v in pod.spec.volumes if v.name == mount.name]
        assert volume.secret.secret_name == "authed-proxy-auth" and mount.sub_path is None and mount.read_only
        assert [(i.key, i.path) for i in volume.secret.items] == [("htpasswd", filename)]
        pod_text = json.dumps(api.sanitize_for_serialization(pod))
        assert password not in pod_text and "$2b$" not in pod_text

        def running():
            poll(ctx, ref)
            return KubernetesGateway(api).get_proxy("default", "authed").phase == "Running"

        wait_for(running, 30, "the Squid Pod to run")
        address = KubernetesGateway(api).get_proxy("default", "authed").status["address"]
        proxy_url = f"http://{address}:3128"

        assert requests.get(f"{origin}/x", proxies={"http": proxy_url}, timeout=10).status_code == 407
        authed = f"http://{user}:{password}@{address}:3128"
        seen = requests.get(f"{origin}/x", proxies={"http": authed}, timeout=10)
        assert seen.status_code == 200 and "Proxy-Authorization" not in seen.json()["headers"]

        # The serving view names the Secret; the credentials themselves never reach Redis.
        record = serving.get(redis_client, ref.uid)
        assert record["authSecret"] == "authed-proxy-auth"
        assert not any(password in str(v) for k in redis_client.scan_iter() for v in _values(redis_client, k))
        credentials = SecretCredentials(KubernetesGateway(api))
        assert credentials(record) == (user, password)
        settings = HealthSettings(echo_url="", allowed_ranges=("127.0.0.0/8",))  # the Squid is on loopback
        report = engine.probe_batch(redis_client, [ref.uid], settings, kube=KubernetesGateway(api, record_writes=False),
                                    credentials=credentials)
        assert report.succeeded == 1

        custom.delete_namespaced_custom_object(GROUP, VERSION, "default", PLURAL, "authed")
        delete(ctx, ref)
        with pytest.raises(k8s.ApiException) as gone:
            k8s.CoreV1Api(api).read_namespaced_secret("authed-proxy-auth", "default")
        assert gone.value.status == 404
