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

from devcluster.redis_server import free_port
from tests.support.processes import BIN, ROOT, Process

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


# -- the providers config deploy/ ships ------------------------------------------------------------

DEFAULT_PROVIDERS = ROOT / "deploy" / "default" / "providers.yaml"


def test_every_process_refuses_the_default_providers_config_until_the_ranges_are_filled():
    out = _cli("check-config", str(DEFAULT_PROVIDERS))
    assert out.returncode == 2, out.stdout
    assert (f'{DEFAULT_PROVIDERS}: provider "k8s-local": squid.deniedDestinations[0]: '
            "'POD-CIDR-PLACEHOLDER' is a placeholder") in out.stderr
    worker = _cli("worker", "--providers-config", str(DEFAULT_PROVIDERS))  # as every process: before anything
    assert worker.returncode == 2 and "squid.deniedDestinations[0]" in worker.stderr


def test_the_filled_default_config_asks_for_basic_auth_and_denies_the_cluster_ranges(tmp_path):
    from app import wiring
    from app.squid import conf as squid

    text = DEFAULT_PROVIDERS.read_text()
    filled = tmp_path / "providers.yaml"
    filled.write_text(text.replace("POD-CIDR-PLACEHOLDER", "10.244.0.0/16")
                      .replace("SERVICE-CIDR-PLACEHOLDER", "10.96.0.0/12"))
    out = _cli("check-config", str(filled))
    assert out.returncode == 0 and "OK (1 provider(s): k8s-local)" in out.stdout and out.stderr == ""
    pc = wiring.load_config(filled).get("k8s-local")
    assert pc.squid.basic_auth_file == squid.DEFAULT_HTPASSWD_PATH
    assert pc.squid.denied_destinations == ("10.244.0.0/16", "10.96.0.0/12")
    conf = squid.render(3128, pc.squid)
    assert "acl authenticated proxy_auth REQUIRED" in conf and "http_access deny !authenticated" in conf
    assert "10.244.0.0/16 10.96.0.0/12" in conf


def test_check_config_warns_when_no_destination_is_denied(tmp_path):
    empty = tmp_path / "providers.yaml"
    empty.write_text(DEFAULT_PROVIDERS.read_text().split("      deniedDestinations:")[0]
                     + "      deniedDestinations: []\n")
    out = _cli("check-config", str(empty))
    assert out.returncode == 0, out.stderr
    assert (f'proxy-operator: warning: {empty}: provider "k8s-local": squid.deniedDestinations is empty'
            in out.stderr)
    no_block = tmp_path / "plain.yaml"
    no_block.write_text("providers:\n  - {name: k, type: kubernetes}\n")
    assert 'provider "k": squid.deniedDestinations is empty' in _cli("check-config", str(no_block)).stderr


def test_the_compose_config_asks_for_basic_auth_and_denies_k3s_ranges():
    from app import wiring

    pc = wiring.load_config(ROOT / "deploy" / "compose" / "providers.yaml").get("k8s-local")
    assert pc.squid.basic_auth_file is not None
    assert pc.squid.denied_destinations == ("10.42.0.0/16", "10.43.0.0/16")
