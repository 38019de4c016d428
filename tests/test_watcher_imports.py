"""The watcher routes work for every provider without loading the worker or any provider SDK.

A fresh interpreter builds the watcher's event handler (``watchers.events.make_on_event``, given
the publisher ``workers.celery_app.send`` as ``proxy-operator watch`` does) with a providers config
naming a kvm, a gcp and a kubernetes provider, hands it an event for a Proxy on a KVM host, and
reports its ``sys.modules``: the message is on that host's queue in Redis (the real broker path),
and neither the Celery task modules nor libvirt nor google-cloud were imported.

The watchers package itself imports nothing from ``workers/`` (the publisher is injected by the
composition root, ``cli/main.py``): no ``import`` statement in ``watchers/*.py`` names it, and
importing every watcher module alone loads no ``workers`` module.
"""

from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.timeout(60)

CONFIG = """
providers:
  - name: lab
    type: kvm
    kvm:
      ssh: {user: proxyop, keyFile: /nonexistent/key, knownHostsFile: /nonexistent/known_hosts}
      hosts:
        - {name: h1, address: 127.0.0.1}
        - {name: h2, address: 127.0.0.1}
  - name: cloud
    type: gcp
    gcp: {project: demo-project, zones: [europe-west1-b]}
  - name: k8s-local
    type: kubernetes
"""

SCRIPT = textwrap.dedent("""
    import json, sys
    from watchers.events import make_on_event
    import watchers.main  # the rest of the watcher process
    from workers.celery_app import send  # injected by the composition root (cli/main.py cmd_watch)
    on_event = make_on_event(send)
    on_event("SYNC", {"metadata": {"namespace": "ns", "name": "p", "uid": "uid-watcher-imports",
                                   "generation": 1, "resourceVersion": "1"},
                      "spec": {"provider": "lab", "placement": {"zone": "h2"}}})
    print(json.dumps(sorted(sys.modules)))
""")

FORBIDDEN = ("workers.tasks", "workers.probe_tasks", "workers.beat", "workers.metrics_server", "libvirt",
             "paramiko", "google.cloud")


def test_the_watchers_event_handler_loads_no_task_module_and_no_provider_sdk(tmp_path, redis_url, redis_client):
    config = tmp_path / "providers.yaml"
    config.write_text(CONFIG)
    env = {k: v for k, v in os.environ.items() if k not in ("REDIS_PASSWORD", "PYTHONPATH")}
    env.update(PROVIDERS_CONFIG=str(config), REDIS_URL=redis_url, PYTHONPATH=str(ROOT))
    out = subprocess.run([sys.executable, "-c", SCRIPT], cwd=ROOT, env=env, capture_output=True, text=True,
                         timeout=45)
    assert out.returncode == 0, out.stderr
    modules = json.loads(out.stdout.strip().splitlines()[-1])

    loaded = [m for m in modules if any(m == f or m.startswith(f + ".") for f in FORBIDDEN)]
    assert loaded == []
    assert "app.dispatch.proxies" in modules and "app.providers.kvm.placement" in modules
    # The event was routed from the config alone, to the queue of the host its spec names.
    [message] = [json.loads(m) for m in redis_client.lrange("kvm.lab.h2", 0, -1)]
    assert message["headers"]["task"] == "proxy.create"
    assert message["headers"]["argsrepr"] == "['ns', 'p', 'uid-watcher-imports', 0]"


def _imported_modules(path: Path) -> list[tuple[int, str]]:
    """Every module an ``import`` statement of ``path`` names (function-level and TYPE_CHECKING ones too)."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found.append((node.lineno, node.module))
    return found


def test_the_watchers_package_imports_nothing_from_workers():
    files = sorted((ROOT / "watchers").glob("*.py"))
    assert files
    offending = [f"{path.relative_to(ROOT)}:{line} imports {module}" for path in files
                 for line, module in _imported_modules(path) if module == "workers" or module.startswith("workers.")]
    assert offending == [], ("the watcher never imports the Celery side (workers/); the composition root "
                             "(cli/main.py) injects the publisher: " + "; ".join(offending))


def test_importing_every_watcher_module_loads_no_workers_module():
    names = sorted(f"watchers.{p.stem}" for p in (ROOT / "watchers").glob("*.py") if p.stem != "__init__")
    script = ("import importlib, json, sys\n"
              f"for name in {names!r}: importlib.import_module(name)\n"
              "print(json.dumps(sorted(sys.modules)))\n")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env["PYTHONPATH"] = str(ROOT)
    out = subprocess.run([sys.executable, "-c", script], cwd=ROOT, env=env, capture_output=True, text=True,
                         timeout=45)
    assert out.returncode == 0, out.stderr
    modules = json.loads(out.stdout.strip().splitlines()[-1])
    assert "watchers.events" in modules
    assert [m for m in modules if m == "workers" or m.startswith("workers.")] == []
