"""Basic auth on kubernetes proxies: generated credentials in a Secret owned by the Proxy, a real
Squid that demands them, probes that use them, and an origin that never sees them."""

from __future__ import annotations

import base64
import http.server
import json
import threading

import pytest
import requests
from kubernetes import client as k8s

from app import serving
from app.config import parse
from app.health import engine
from app.health.settings import HealthSettings
from app.kube import Kube
from app.providers.kubernetes.provider import KubernetesProvider
from app.providers.registry import build
from app.reconcile import Context, Ref, create, delete, poll
from app.resources import GROUP, PLURAL, VERSION
from app.settings import Settings
from tests.support.cluster import FakeCluster
from tests.support.waiting import wait_for

pytestmark = pytest.mark.slow

CONFIG = {"providers": [{"name": "k8s-auth", "type": "kubernetes",
                         "squid": {"basicAuth": True, "allowedSourceRanges": ["127.0.0.0/8"]}}]}


@pytest.fixture()
def origin():
    """Answers 204 on /generate_204 and echoes request headers as JSON elsewhere."""

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            if self.path.endswith("/generate_204"):
                self.send_response(204)
                self.end_headers()
                return
            body = json.dumps(dict(self.headers)).encode()
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_port}"
    server.shutdown()


def test_generated_credentials_protect_the_proxy_and_feed_the_probes(redis_client, origin):
    with FakeCluster() as cluster:
        api = cluster.fake.api_client()
        registry = build(parse(CONFIG, "providers.yaml"), {"kubernetes": lambda pc: KubernetesProvider(pc, client=api)})
        ctx = Context(kube=Kube(api), registry=registry, redis=redis_client, settings=Settings(poll_initial=0.2))
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
        [env] = [e for e in pod.spec.containers[0].env if e.name == "SQUID_HTPASSWD"]
        assert env.value is None and env.value_from.secret_key_ref.name == "authed-proxy-auth"
        assert password not in json.dumps(api.sanitize_for_serialization(pod))

        def running():
            poll(ctx, ref)
            return Kube(api).get_proxy("default", "authed").phase == "Running"

        wait_for(running, 30, "the Squid Pod to run")
        address = Kube(api).get_proxy("default", "authed").status["address"]
        proxy_url = f"http://{address}:3128"

        assert requests.get(f"{origin}/x", proxies={"http": proxy_url}, timeout=10).status_code == 407
        authed = f"http://{user}:{password}@{address}:3128"
        seen = requests.get(f"{origin}/x", proxies={"http": authed}, timeout=10)
        assert seen.status_code == 200 and "Proxy-Authorization" not in seen.json()

        # The health engine probes with the credentials the reconciler published.
        record = serving.get(redis_client, ref.uid)
        assert serving.credentials_of(record) == (user, password)
        settings = HealthSettings(echo_url="")
        kube = Kube(api)
        report = engine.probe_batch(
            redis_client, [ref.uid], settings,
            get_proxy=lambda ns, name: (p := kube.get_proxy(ns, name)) and p.raw,
            patch_status=lambda ns, name, status, rv=None: custom.patch_namespaced_custom_object_status(
                GROUP, VERSION, ns, PLURAL, name, {"metadata": {"resourceVersion": rv}, "status": status}),
            credentials=serving.credentials_of)
        assert report.succeeded == 1

        custom.delete_namespaced_custom_object(GROUP, VERSION, "default", PLURAL, "authed")
        delete(ctx, ref)
        with pytest.raises(k8s.ApiException) as gone:
            k8s.CoreV1Api(api).read_namespaced_secret("authed-proxy-auth", "default")
        assert gone.value.status == 404
