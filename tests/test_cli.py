"""The ``proxy-operator`` command as a user runs it."""

from __future__ import annotations

import argparse
import subprocess
import time

import requests

from devcluster.redis_server import free_port
from tests.support.processes import BIN, Process

CLI = str(BIN / "proxy-operator")


def run(*args, env=None):
    return subprocess.run([CLI, *args], capture_output=True, text=True, timeout=60, env=env)


def test_version_names_release_and_commit():
    out = run("version")
    assert out.returncode == 0 and out.stdout.startswith("proxy-operator ") and "commit " in out.stdout


def test_crds_prints_both_definitions():
    out = run("crds")
    assert out.returncode == 0
    assert "name: proxies.crawl.example.com" in out.stdout and "name: providerhealths.crawl.example.com" in out.stdout


def test_kvm_ssh_secret_refuses_a_public_key(tmp_path):
    pub = tmp_path / "id_ed25519.pub"
    pub.write_text("ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIB example\n")
    hosts = tmp_path / "known_hosts"
    hosts.write_text("")
    out = run("kvm-ssh-secret", "--key", str(pub), "--known-hosts", str(hosts))
    assert out.returncode == 2 and "public key" in out.stderr


def test_api_serves_with_a_tokens_file(tmp_path, redis_url):
    tokens = tmp_path / "tokens.yaml"
    tokens.write_text("clients:\n  - {name: crawler-a, token: cli-test-token-123}\n")
    port = free_port()
    api = Process("api", [CLI, "api", "--bind", f"127.0.0.1:{port}", "--tokens-file", str(tokens)],
                  {"REDIS_URL": redis_url}).start()
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                if requests.get(f"http://127.0.0.1:{port}/healthz", timeout=1).ok:
                    break
            except requests.ConnectionError:
                pass
            assert time.monotonic() < deadline and api.alive(), api.log()
            time.sleep(0.2)
        assert requests.get(f"http://127.0.0.1:{port}/v1/proxies", timeout=5).status_code == 401
        ok = requests.get(f"http://127.0.0.1:{port}/v1/proxies", timeout=5,
                          headers={"Authorization": "Bearer cli-test-token-123"})
        assert ok.status_code == 200
        assert "cli-test-token-123" not in api.log()
    finally:
        api.stop()


def test_api_refuses_to_start_on_a_bad_tokens_file(tmp_path):
    tokens = tmp_path / "tokens.yaml"
    tokens.write_text("clients:\n  - {name: crawler-a}\n")
    out = run("api", "--tokens-file", str(tokens))
    assert out.returncode == 2 and str(tokens) in out.stderr


KVM_CONFIG = """providers:
  - name: kvm-lab
    type: kvm
    kvm:
      ssh: {user: op, keyFile: /nonexistent/id, knownHostsFile: /nonexistent/kh}
      imageTimeout: 10m
      hosts: [{name: lab1, address: 127.0.0.1}]
"""


def test_kvm_worker_checks_its_host_and_its_time_limits(tmp_path):
    import os

    cfg = tmp_path / "providers.yaml"
    cfg.write_text(KVM_CONFIG)
    out = run("worker", "--providers-config", str(cfg), "--kvm-host", "kvm-lab/lab9")
    assert out.returncode == 2 and "no kvm provider 'kvm-lab' with host 'lab9'" in out.stderr
    env = {**os.environ, "TASK_SOFT_TIME_LIMIT": "120"}
    out = run("worker", "--providers-config", str(cfg), "--kvm-host", "kvm-lab/lab1", env=env)
    assert out.returncode == 2 and "TASK_SOFT_TIME_LIMIT=120s must exceed kvm.imageTimeout=600s" in out.stderr
    env = {**os.environ, "BROKER_VISIBILITY_TIMEOUT": "1h"}
    out = run("worker", "--providers-config", str(cfg), "--kvm-host", "kvm-lab/lab1", env=env)
    assert out.returncode == 2 and "environment variable BROKER_VISIBILITY_TIMEOUT: not a number: '1h'" in out.stderr
    assert "Traceback" not in out.stderr


COMMANDS = ("watch", "worker", "api", "check-config", "crds", "kvm-ssh-secret", "demo", "version")


def test_no_command_prints_the_usage_with_the_commands():
    out = run()
    assert out.returncode == 2
    assert "required: cmd" not in out.stderr and out.stderr.startswith("usage: proxy-operator")
    for name in COMMANDS:
        assert f"\n    {name} " in out.stderr or f"\n    {name}\n" in out.stderr, name
    assert "COMMAND --help" in out.stderr


def test_help_is_plain_text_for_a_user():
    """No reST markup or source file paths; the commands say what they do."""
    out = run("--help")
    assert out.returncode == 0
    assert "``" not in out.stdout and ".py" not in out.stdout
    assert "leases them to crawlers" in out.stdout and "REDIS_URL" in out.stdout
    for name in COMMANDS:
        sub = run(name, "--help")
        assert sub.returncode == 0 and "``" not in sub.stdout and ".py" not in sub.stdout, sub.stdout


def test_every_option_has_help_naming_its_default_or_environment_variable():
    from cli.main import parser

    [subparsers] = [a for a in parser()._actions if isinstance(a, argparse._SubParsersAction)]
    assert set(subparsers.choices) == set(COMMANDS)
    for name, sub in subparsers.choices.items():
        for action in sub._actions:
            if isinstance(action, argparse._HelpAction):
                continue
            assert action.help, f"proxy-operator {name} {action.option_strings or action.dest}: no help text"
    watch = run("watch", "--help").stdout
    for words in ("POD_NAMESPACE", "default proxy-operator-watcher", "HOSTNAME", "WATCHER_HEALTH_BIND",
                  "METRICS_BIND", "PROVIDERS_CONFIG"):
        assert words in " ".join(watch.split()), words
    worker = " ".join(run("worker", "--help").stdout.split())
    assert "default proxies,health,gc" in worker
    api = " ".join(run("api", "--help").stdout.split())
    for words in ("API_BIND", "default 127.0.0.1:8080", "API_WORKERS", "default 2", "API_TOKENS_FILE"):
        assert words in api, words
    check = " ".join(run("check-config", "--help").stdout.split())
    assert "FILE the providers config file" in check
    demo = " ".join(run("demo", "--help").stdout.split())
    for words in ("usage: proxy-operator demo", "DEMO_API_PORT", "default 8080", "DEMO_FLOWER_PORT", "default 5555",
                  "--pod-cidr", "--info-file"):
        assert words in demo, words


#: A fresh interpreter: ``cli.main.main(ARGV)``, then the loaded modules as JSON on the last line.
_MODULES_AFTER = """
import json, sys
from cli.main import main
try:
    main(sys.argv[1:])
except SystemExit:
    pass
print(json.dumps(sorted(sys.modules)))
"""


def test_no_operator_command_loads_the_dev_cluster():
    """The demo is a command of the CLI, but the operator's commands never import devcluster
    nor the demo extra's packages (cel-python, jsonpatch)."""
    import json
    import sys

    from tests.support.processes import ROOT

    for argv in (["check-config", str(ROOT / "deploy" / "samples" / "providers.yaml")], ["crds"], ["--help"]):
        out = subprocess.run([sys.executable, "-c", _MODULES_AFTER, *argv], capture_output=True, text=True,
                             timeout=60, cwd=ROOT)
        modules = json.loads(out.stdout.splitlines()[-1])
        loaded = [m for m in modules if m.split(".")[0] in ("devcluster", "celpy", "jsonpatch")]
        assert loaded == [], (argv, loaded)


def test_demo_without_its_extra_names_the_missing_package_and_the_install():
    """Without the demo extra (cel-python absent: an import of it fails), ``proxy-operator demo``
    starts nothing and says what is missing and how to install it (exit status 2)."""
    import sys

    from tests.support.processes import ROOT

    script = "import sys; sys.modules['celpy'] = None\nfrom cli.main import main\nsys.exit(main(['demo']))"
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert out.returncode == 2, out.stderr
    assert out.stderr.startswith("proxy-operator demo: ") and "celpy" in out.stderr
    assert "pip install -e '.[demo]'" in out.stderr and "is up" not in out.stdout
