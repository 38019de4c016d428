"""docs/demo/: the bulk-create script and the live egress-IP table.

* ``watch-egress.py``: its table rendering on a sample ``/v1/proxies`` payload, and one
  ``--once`` run as a subprocess against the real discovery API (``api.create_app`` served on
  loopback, the session's private Redis holding a published serving view).
* ``create-proxies.sh``: the manifests it renders are admitted by the real Proxy CRD (schema,
  defaults and CEL rules through devcluster/crd_validation), spread over the zones given,
  and reach ``kubectl apply -f -`` in one call (a stand-in kubectl on PATH records it).
"""

from __future__ import annotations

import importlib.util
import json
import stat
import subprocess
import sys
import threading
from datetime import datetime, timezone
from pathlib import Path

import pytest
import redis as redis_lib
import yaml
from werkzeug.serving import make_server

from app.serving import leases, view as serving
from app.store import keys as redis_keys
from app.resources import Proxy
from devcluster import crd_validation

ROOT = Path(__file__).resolve().parent.parent
DEMO = ROOT / "docs" / "demo"
CREATE = DEMO / "create-proxies.sh"
WATCH = DEMO / "watch-egress.py"

pytestmark = pytest.mark.timeout(60)


def _load_watch_egress():
    spec = importlib.util.spec_from_file_location("watch_egress", WATCH)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


watch_egress = _load_watch_egress()

SAMPLE = {"items": [
    {"namespace": "default", "name": "demo-gcp-eu-001", "address": "10.132.0.7", "port": 3128, "provider": "gcp-eu",
     "zone": "europe-west1-b", "egressIP": "203.0.113.9", "labels": {},
     "health": {"healthy": True, "state": "healthy", "reason": "OK", "lastProbeTime": None, "latencyMs": 41.0},
     "leases": {"used": 2, "max": 5}},
    {"namespace": "crawl", "name": "ext-1", "address": "fd00::7", "port": 8080, "provider": None, "zone": None,
     "egressIP": None, "labels": {"tier": "b"},
     "health": {"healthy": True, "state": "healthy", "reason": None, "lastProbeTime": None, "latencyMs": None},
     "leases": {"used": 0, "max": 0}},
]}


# -- watch-egress.py ------------------------------------------------------------------------

def test_render_table_on_a_sample_payload():
    out = watch_egress.render_table(SAMPLE["items"])
    assert out == (
        "NAME             NAMESPACE  PROVIDER  ZONE            ADDRESS          EGRESS IP    LEASES\n"
        "demo-gcp-eu-001  default    gcp-eu    europe-west1-b  10.132.0.7:3128  203.0.113.9  2/5\n"
        "ext-1            crawl      -         -               [fd00::7]:8080   -            0/0\n")
    assert watch_egress.render_table([]) == (
        "NAME  NAMESPACE  PROVIDER  ZONE  ADDRESS  EGRESS IP  LEASES\n(no healthy proxies)\n")
    when = datetime(2030, 1, 2, 3, 4, 5, tzinfo=timezone.utc)
    assert watch_egress.summary(SAMPLE["items"], when) == \
        "2 healthy proxies, 1 distinct egress IP  2030-01-02 03:04:05 UTC"


def _publish(r, name: str, namespace: str, address: str, *, provider: str, zone: str, egress: str,
             healthy: bool, max_leases: int) -> None:
    obj = {"metadata": {"name": name, "namespace": namespace, "uid": f"uid-{name}", "generation": 1},
           "spec": {"provider": provider, "placement": {"zone": zone}, "maxLeases": max_leases}}
    serving.publish(r, Proxy.from_dict(obj), address=address, port=3128, phase="Ready")
    # What the health engine records after probes through the proxy (app/serving/view.py's fields).
    r.hset(redis_keys.proxy(f"uid-{name}"), mapping={
        "healthy": "1" if healthy else "0", "health": "healthy" if healthy else "unhealthy", "egressIP": egress})
    leases.reindex(r, f"uid-{name}")


@pytest.fixture()
def api_url(redis_url, tmp_path):
    """The real discovery API on 127.0.0.1 (werkzeug server thread), reading the session Redis."""
    from api import create_app
    from api.settings import ApiSettings

    tokens = tmp_path / "tokens.yaml"
    tokens.write_text("sharedNamespaces: [\"*\"]\nclients:\n  - name: demo\n    token: demo-token-4c1e-7a9b0d2f\n")
    app = create_app(ApiSettings(redis_url=redis_url, tokens_file=str(tokens)))
    server = make_server("127.0.0.1", 0, app, threaded=True)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_port}"
    server.shutdown()


def _watch(api: str, token_file: Path, *extra: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(WATCH), "--api", api, "--token-file", str(token_file), "--once",
                           *extra], capture_output=True, text=True, timeout=30)


def test_watch_egress_once_against_the_real_api(api_url, redis_url, tmp_path):
    r = redis_lib.Redis.from_url(redis_url, decode_responses=True)
    _publish(r, "demo-k8s-local-001", "default", "10.42.0.17", provider="k8s-local", zone="", egress="198.51.100.4",
             healthy=True, max_leases=5)
    _publish(r, "demo-gcp-eu-001", "crawl", "10.132.0.7", provider="gcp-eu", zone="europe-west1-b",
             egress="203.0.113.9", healthy=True, max_leases=3)
    _publish(r, "demo-gcp-eu-002", "crawl", "10.132.0.8", provider="gcp-eu", zone="europe-west4-a",
             egress="203.0.113.10", healthy=False, max_leases=3)
    token = tmp_path / "token"
    token.write_text("demo-token-4c1e-7a9b0d2f\n")

    out = _watch(api_url, token)
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert lines[0].startswith("2 healthy proxies, 2 distinct egress IPs  ")
    assert lines[2].split() == ["NAME", "NAMESPACE", "PROVIDER", "ZONE", "ADDRESS", "EGRESS", "IP", "LEASES"]
    # Unhealthy demo-gcp-eu-002 is left out; the API sorts by namespace, then name.
    assert [ln.split() for ln in lines[3:]] == [
        ["demo-gcp-eu-001", "crawl", "gcp-eu", "europe-west1-b", "10.132.0.7:3128", "203.0.113.9", "0/3"],
        ["demo-k8s-local-001", "default", "k8s-local", "-", "10.42.0.17:3128", "198.51.100.4", "0/5"],
    ]
    assert "\033[" not in out.stdout  # no screen clearing when not on a terminal

    out = _watch(api_url, token, "--provider", "k8s-local")
    assert [ln.split()[0] for ln in out.stdout.splitlines()[3:]] == ["demo-k8s-local-001"]

    token.write_text("wrong-token\n")
    out = _watch(api_url, token)
    assert out.returncode == 1
    assert "HTTP 401: unauthorized: invalid bearer token (check --token-file)" in out.stderr
    assert "wrong-token" not in out.stderr + out.stdout

    token.write_text("")
    out = _watch(api_url, token)
    assert out.returncode == 1 and f"--token-file {token}: the file is empty" in out.stderr


def test_watch_egress_rejects_bad_arguments(tmp_path):
    out = subprocess.run([sys.executable, str(WATCH), "--api", "127.0.0.1:8080", "--token-file", "t", "--once"],
                         capture_output=True, text=True, timeout=30)
    assert out.returncode == 2 and "--api: want an http:// or https:// URL" in out.stderr


# -- create-proxies.sh ----------------------------------------------------------------------

def _create(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", str(CREATE), *args], capture_output=True, text=True, timeout=30,
                          env={"PATH": "/usr/bin:/bin", **(env or {})})


@pytest.fixture(scope="module")
def proxy_crd() -> dict:
    return crd_validation.load_crd(ROOT / "deploy" / "crd" / "proxy.yaml")


def test_rendered_proxies_pass_the_crd_and_spread_over_zones(proxy_crd):
    out = _create("5", "gcp-eu", "crawl", env={
        "DRY_RUN": "1", "ZONES": "europe-west1-b,europe-west4-a", "MACHINE_TYPE": "e2-micro",
        "IMAGE": "projects/debian-cloud/global/images/family/debian-12", "CLOUD_INIT_SECRET": "squid-cloud-init",
        "MAX_LEASES": "3"})
    assert out.returncode == 0, out.stderr
    docs = [d for d in yaml.safe_load_all(out.stdout) if d]
    assert [d["metadata"]["name"] for d in docs] == [f"demo-gcp-eu-00{i}" for i in range(1, 6)]
    admitted = [crd_validation.admit(proxy_crd, d, field_validation="Strict") for d in docs]
    for px in admitted:
        assert px["metadata"]["namespace"] == "crawl"
        assert px["metadata"]["labels"] == {"app.kubernetes.io/part-of": "proxy-operator-demo"}
        spec = px["spec"]
        assert spec["mode"] == "Managed" and spec["provider"] == "gcp-eu" and spec["maxLeases"] == 3
        assert spec["cloudInit"] == {"secretRef": {"name": "squid-cloud-init", "key": "user-data"}}
        assert spec["placement"]["machineType"] == "e2-micro"
    assert [px["spec"]["placement"]["zone"] for px in admitted] == ["europe-west1-b", "europe-west4-a"] * 2 + \
        ["europe-west1-b"]


def test_kubernetes_proxies_need_no_placement(proxy_crd):
    out = _create("2", "k8s-local", env={"DRY_RUN": "1"})
    assert out.returncode == 0, out.stderr
    docs = [crd_validation.admit(proxy_crd, d, field_validation="Strict") for d in yaml.safe_load_all(out.stdout) if d]
    assert [(d["metadata"]["namespace"], d["spec"].get("placement")) for d in docs] == [("default", None)] * 2
    assert docs[0]["spec"]["maxLeases"] == 5 and docs[0]["spec"]["endpoint"]["port"] == 3128


def test_applies_all_manifests_in_one_kubectl_call(tmp_path):
    record = tmp_path / "kubectl-calls.jsonl"
    kubectl = tmp_path / "kubectl"
    kubectl.write_text(f"#!{sys.executable}\nimport json, sys\n"
                       f"open({str(record)!r}, 'a').write(json.dumps({{'argv': sys.argv[1:], "
                       f"'stdin': sys.stdin.read()}}) + '\\n')\n")
    kubectl.chmod(kubectl.stat().st_mode | stat.S_IXUSR)
    out = _create("3", "kvm-lab", "lab", env={"KUBECTL": str(kubectl), "ZONES": "lab1"})
    assert out.returncode == 0, out.stderr
    [call] = [json.loads(line) for line in record.read_text().splitlines()]
    assert call["argv"] == ["apply", "-f", "-"]
    docs = [d for d in yaml.safe_load_all(call["stdin"]) if d]
    assert [(d["metadata"]["name"], d["spec"]["placement"]["zone"]) for d in docs] == \
        [("demo-kvm-lab-001", "lab1"), ("demo-kvm-lab-002", "lab1"), ("demo-kvm-lab-003", "lab1")]
    assert "delete px -l app.kubernetes.io/part-of=proxy-operator-demo" in out.stdout


@pytest.mark.parametrize("args, env, message", [
    (("0", "k8s-local"), {}, "N: want a whole number from 1 to 500, got '0'"),
    (("many", "k8s-local"), {}, "N: want a whole number from 1 to 500, got 'many'"),
    (("2", "GCP_EU"), {}, "PROVIDER: 'GCP_EU' is not a provider name"),
    (("2", "k8s-local", "Bad_NS"), {}, "NAMESPACE: 'Bad_NS' is not a namespace name"),
    (("2", "gcp-eu"), {"ZONES": "europe-west1-b,,x"}, "ZONES: '' is not a zone or host name"),
    (("2", "gcp-eu"), {"IMAGE": 'a"b'}, "IMAGE: quotes, backslashes and newlines are not allowed"),
    (("2", "gcp-eu"), {"CLOUD_INIT_SECRET": "Bad/user-data"}, "CLOUD_INIT_SECRET: 'Bad' is not a Secret name"),
    (("2", "gcp-eu"), {"MAX_LEASES": "-1"}, "MAX_LEASES: want a whole number >= 0, got '-1'"),
])
def test_bad_arguments_are_named(args, env, message):
    out = _create(*args, env={"DRY_RUN": "1", **env})
    assert out.returncode == 2 and message in out.stderr and out.stdout == ""
