"""The layout rules of docs/architecture.md ("Layout rules"), checked by import-linter.

The rules are import-linter contracts in pyproject.toml (``[tool.importlinter]``); ``make lint``
runs ``lint-imports`` and so does this module, so a broken contract also fails the suite.  Every
import counts, function-level and ``TYPE_CHECKING`` ones included, and so does what a module
imports through another.

* No operator process imports the dev cluster (``devcluster/``): ``cli/main.py`` only inside
  ``proxy-operator demo``'s function.

The page's "Module map" names every module of ``app/``, ``workers/``, ``watchers/``, ``api/``,
``cli/`` and ``devcluster/``, and every repository path the page names exists.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

GATEWAY = ("app/kube.py", "app/status_writer.py")
DOMAIN = ("app/config.py", "app/resources.py", "app/settings.py", "app/provider_types.py", "app/validation.py",
          "app/squid.py", "app/tenancy.py", "app/naming.py", "app/timefmt.py", "app/lazy.py")
LINT_IMPORTS = Path(sys.executable).with_name("lint-imports")


def _module_of(path: Path) -> str:
    rel = path.relative_to(ROOT).with_suffix("")
    parts = rel.parts[:-1] if rel.name == "__init__" else rel.parts
    return ".".join(parts)


def _under(module: str, prefixes: tuple[str, ...]) -> bool:
    return any(module == p or module.startswith(p + ".") for p in prefixes)


def lint_imports(tree: Path) -> subprocess.CompletedProcess:
    """``lint-imports`` on the packages of ``tree`` with the contracts of ``tree/pyproject.toml``."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env["PYTHONPATH"] = str(tree)
    return subprocess.run([str(LINT_IMPORTS), "--no-cache"], cwd=tree, env=env, capture_output=True, text=True,
                          timeout=120)


def test_the_layout_contracts_hold():
    out = lint_imports(ROOT)
    assert out.returncode == 0, out.stdout + out.stderr
    contracts = (ROOT / "pyproject.toml").read_text().count("[[tool.importlinter.contracts]]")
    assert f"Contracts: {contracts} kept, 0 broken." in out.stdout, out.stdout


@pytest.mark.parametrize(("module", "line", "rule"), [
    ("app/kube.py", "def _f():\n    import app.providers.pods.provider\n", "The Kubernetes gateway knows no provider"),
    ("app/providers/gcp/ids.py", "from app import wiring\n", "Providers get their clients injected"),
    ("app/tenancy.py", "from app.providers import registry\n", "Plain domain modules never import providers"),
    ("watchers/leader.py", "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    import workers.tasks\n",
     "The watcher never loads the Celery side"),
    ("app/reconcile.py", "import celery\n", "Reconcile and the probe engine know no Celery"),
    ("app/health/state.py", "from app import gc\n", None),  # allowed: gc knows no Celery either
    ("api/routes.py", "from app import kube\n", "The API reads only Redis"),
])
def test_a_forbidden_import_breaks_its_contract_and_names_it(tmp_path, module, line, rule):
    """A copy of the tree with one import added: the contract it breaks is reported by name, with
    the importing module and line (function-level and TYPE_CHECKING imports count)."""
    tree = tmp_path / "tree"
    tree.mkdir()
    shutil.copy(ROOT / "pyproject.toml", tree / "pyproject.toml")
    for package in ("app", "api", "workers", "watchers", "cli"):
        shutil.copytree(ROOT / package, tree / package, ignore=shutil.ignore_patterns("__pycache__"))
    target = tree / module
    target.write_text(target.read_text() + "\n" + line)
    out = lint_imports(tree)
    if rule is None:
        assert out.returncode == 0, out.stdout + out.stderr
        return
    assert out.returncode != 0, out.stdout
    broken = out.stdout[out.stdout.index("Broken contracts"):]
    assert rule in broken, out.stdout
    assert f"{_module_of(ROOT / module)} -> " in broken, out.stdout


def test_the_command_loads_the_dev_cluster_only_inside_a_function():
    """devcluster/ is the local simulated cluster: the operator's processes never load it (a
    layout contract), and ``cli/main.py`` loads it for ``proxy-operator demo`` only, inside that
    command's function, never when the module is imported."""
    import ast

    tree = ast.parse((ROOT / "cli" / "main.py").read_text())
    top = [node for node in tree.body if isinstance(node, (ast.Import, ast.ImportFrom))]
    names = [alias.name for node in top if isinstance(node, ast.Import) for alias in node.names]
    names += [node.module or "" for node in top if isinstance(node, ast.ImportFrom)]
    assert not [n for n in names if n == "devcluster" or n.startswith("devcluster.")]


def test_the_gateway_and_the_domain_load_no_provider_module():
    """What the import statements promise holds for what they load, transitively."""
    names = [_module_of(ROOT / f) for f in GATEWAY + DOMAIN]
    script = ("import importlib, json, sys\n"
              f"for name in {names!r}: importlib.import_module(name)\n"
              "print(json.dumps(sorted(sys.modules)))\n")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env["PYTHONPATH"] = str(ROOT)
    out = subprocess.run([sys.executable, "-c", script], cwd=ROOT, env=env, capture_output=True, text=True,
                         timeout=45)
    assert out.returncode == 0, out.stderr
    modules = json.loads(out.stdout.strip().splitlines()[-1])
    assert "app.kube" in modules
    assert [m for m in modules if _under(m, ("app.providers", "workers"))] == []


def test_the_composition_root_gives_the_kubernetes_provider_the_gateways_client(monkeypatch):
    import app.kube
    from app import wiring
    from app.config import ProviderConfig
    from app.providers.pods.config import KubernetesSettings
    from app.providers.pods.provider import KubernetesProvider

    client = object()
    monkeypatch.setattr(app.kube, "api_client", lambda: client)
    provider = wiring.PROVIDER_TYPES["kubernetes"].build(ProviderConfig("k8s", "kubernetes", 60, 15,
                                                                        KubernetesSettings()))
    assert provider.core.api_client is client  # looked up on use, not at construction
    with pytest.raises(TypeError, match="client"):
        KubernetesProvider(ProviderConfig("k8s", "kubernetes", 60, 15, KubernetesSettings()))


# -- docs/architecture.md's module map matches the tree ------------------------------------------
ARCHITECTURE = ROOT / "docs" / "architecture.md"
PACKAGES = ("app", "workers", "watchers", "api", "cli", "devcluster")
#: A repository path as the page writes it: ``app/kube.py``, ``app/providers/<type>/registration.py``,
#: ``app/lua/*.lua``, ``app/providers/{pods,gcp,kvm}/``, ``tests/x.py::test_y`` (the test id is not part of it).
_PATH = re.compile(r"(?<![\w./<>*{}-])(?:app|workers|watchers|api|cli|devcluster|tests|deploy|docs|bench)/[\w./<>*{},-]*")


def _section(text: str, title: str) -> str:
    """The body of the ``## title`` section of a markdown page (up to the next ``## ``)."""
    start = text.index(f"\n## {title}\n")
    end = text.find("\n## ", start + 1)
    return text[start:end if end != -1 else len(text)]


def _expand(path: str) -> list[str]:
    """``a/{b,c}/d`` -> ``[a/b/d, a/c/d]``; ``<name>`` placeholders become ``*`` (a glob)."""
    path = re.sub(r"<[^>]*>", "*", path.rstrip(".,"))
    m = re.search(r"\{([^{}]*)\}", path)
    if m is None:
        return [path]
    return [out for alt in m.group(1).split(",") for out in _expand(path[:m.start()] + alt + path[m.end():])]


def named_paths(text: str) -> set[str]:
    """Every repository path ``text`` names (braces expanded, placeholders as globs)."""
    return {p for found in _PATH.findall(text) for p in _expand(found)}


def missing_paths(text: str) -> list[str]:
    """The paths ``text`` names that match nothing in the repository."""
    return sorted(p for p in named_paths(text)
                  if not (any(ROOT.glob(p.rstrip("/"))) if "*" in p else (ROOT / p).exists()))


def test_the_path_reader_sees_what_the_page_writes():
    text = ("`app/kube.py`, app/providers/{pods,gcp}/ and `app/providers/<type>/registration.py`, "
            "`tests/test_layout.py::test_x`; see docs/redis.md. Not https://kubernetes.io/docs/concepts/x "
            "nor no/such/app/thing.")
    assert named_paths(text) == {"app/kube.py", "app/providers/pods/", "app/providers/gcp/",
                                 "app/providers/*/registration.py", "tests/test_layout.py", "docs/redis.md"}
    assert missing_paths(text + " app/no_such_module.py, app/providers/{pods,nope}/") == [
        "app/no_such_module.py", "app/providers/nope/"]


def test_every_module_is_in_the_module_map():
    """docs/architecture.md's "Module map" names every module of the product's packages, so it
    cannot drift from the tree (a new module fails here until it has its line)."""
    mapped = named_paths(_section(ARCHITECTURE.read_text(), "Module map"))
    modules = sorted(str(p.relative_to(ROOT)) for package in PACKAGES for p in (ROOT / package).rglob("*.py"))
    assert len(modules) > 50
    assert [m for m in modules if m not in mapped] == []


def test_every_path_the_architecture_page_names_exists():
    assert missing_paths(ARCHITECTURE.read_text()) == []
