"""Safe defaults: what an installation does before its operator changed anything.

The sample API tokens are refused unless the stack says it is a demo, and docker-compose
publishes the API on this machine only.
"""

from __future__ import annotations

import os
import subprocess
import time

import pytest
import requests
import yaml

from tests.support.processes import BIN, ROOT, Process
from tests.support.redis_server import free_port

CLI = str(BIN / "proxy-operator")
SAMPLE_TOKENS = ROOT / "deploy" / "samples" / "tokens.yaml"
SAMPLE_TOKEN = "PLACEHOLDER-crawler-a-token-CHANGE-ME"

pytestmark = pytest.mark.timeout(90)


def _cli(*args, **env):
    return subprocess.run([CLI, *args], capture_output=True, text=True, timeout=60,
                          env={k: v for k, v in {**os.environ, **env}.items() if v is not None})


def _serving(api: Process, port: int) -> None:
    deadline = time.monotonic() + 30
    while True:
        try:
            if requests.get(f"http://127.0.0.1:{port}/healthz", timeout=1).ok:
                return
        except requests.ConnectionError:
            pass
        assert time.monotonic() < deadline and api.alive(), api.log()
        time.sleep(0.2)


# -- the API and placeholder tokens -------------------------------------------------------------

def test_the_api_refuses_to_start_with_the_sample_tokens():
    out = _cli("api", "--bind", f"127.0.0.1:{free_port()}", "--tokens-file", str(SAMPLE_TOKENS),
               API_ALLOW_DEMO_TOKENS=None)
    assert out.returncode == 2, out.stderr
    assert str(SAMPLE_TOKENS) in out.stderr and "clients[0].token" in out.stderr
    assert "PLACEHOLDER" in out.stderr and "API_ALLOW_DEMO_TOKENS=true" in out.stderr
    assert SAMPLE_TOKEN not in out.stderr + out.stdout


@pytest.mark.parametrize("token", ["my-token-change-me-later-1", "placeholder-of-a-real-token"])
def test_any_spelling_of_a_placeholder_word_is_refused(tmp_path, token):
    tokens = tmp_path / "tokens.yaml"
    tokens.write_text(yaml.safe_dump({"clients": [{"name": "ok", "token": "a-real-token-0123456789"},
                                                  {"name": "lazy", "token": token}]}))
    out = _cli("api", "--bind", f"127.0.0.1:{free_port()}", "--tokens-file", str(tokens), API_ALLOW_DEMO_TOKENS=None)
    assert out.returncode == 2 and "clients[1].token" in out.stderr and token not in out.stderr


def test_a_bad_demo_switch_is_named():
    out = _cli("api", "--bind", f"127.0.0.1:{free_port()}", "--tokens-file", str(SAMPLE_TOKENS),
               API_ALLOW_DEMO_TOKENS="maybe")
    assert out.returncode == 2 and "API_ALLOW_DEMO_TOKENS" in out.stderr and "not a boolean" in out.stderr


def test_a_demo_stack_serves_with_the_sample_tokens(redis_url):
    compose = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
    api_env = compose["services"]["api"]["environment"]
    assert api_env["API_ALLOW_DEMO_TOKENS"] == "true"  # compose mounts the sample tokens
    port = free_port()
    api = Process("api", [CLI, "api", "--bind", f"127.0.0.1:{port}", "--tokens-file", str(SAMPLE_TOKENS)],
                  {"REDIS_URL": redis_url, "API_ALLOW_DEMO_TOKENS": api_env["API_ALLOW_DEMO_TOKENS"]}).start()
    try:
        _serving(api, port)
        ok = requests.get(f"http://127.0.0.1:{port}/v1/proxies", timeout=5,
                          headers={"Authorization": f"Bearer {SAMPLE_TOKEN}"})
        assert ok.status_code == 200
    finally:
        api.stop()


def test_compose_publishes_the_api_on_this_machine_only():
    compose = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
    for name, svc in compose["services"].items():
        for mapping in svc.get("ports", []):
            if name == "k3s":
                continue  # the kubeconfig's own address, as before
            assert str(mapping).startswith("127.0.0.1:"), (name, mapping)
    assert compose["services"]["api"]["ports"] == ["127.0.0.1:8080:8080"]
