"""A worker's main process imports what every task needs before it forks (workers.runtime.preload).

Run in a fresh interpreter: what it imports is the point.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

_SCRIPT = textwrap.dedent("""
    import sys
    from workers.runtime import preload
    preload()
    print("core" if "kubernetes.client.api.core_v1_api" in sys.modules else "no-core")
    print("provider" if "app.providers.kubernetes.provider" in sys.modules else "no-provider")
""")


def _run(tmp_path, providers: str) -> list[str]:
    config = tmp_path / "providers.yaml"
    config.write_text(providers)
    out = subprocess.run([sys.executable, "-c", _SCRIPT], cwd=ROOT, capture_output=True, text=True, timeout=120,
                         env={"PATH": "/usr/bin:/bin", "PROVIDERS_CONFIG": str(config), "HOME": str(tmp_path),
                              "REDIS_URL": "redis://127.0.0.1:1/0"})
    assert out.returncode == 0, out.stderr
    return out.stdout.split()


def test_preload_imports_the_client_and_the_configured_providers(tmp_path):
    assert _run(tmp_path, "providers:\n  - name: k8s-local\n    type: kubernetes\n") == ["core", "provider"]


def test_preload_never_fails_the_worker(tmp_path):
    # an invalid config: the client is still imported, and the first task reports the config error
    assert _run(tmp_path, "providers: [{name: x, type: nope}]\n") == ["core", "no-provider"]
