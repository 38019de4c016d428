"""The layout rules of docs/architecture.md ("Layout rules"), checked by import-linter.

The rules are import-linter contracts in pyproject.toml (``[tool.importlinter]``); ``make lint``
runs ``lint-imports`` and so does this module, so a broken contract also fails the suite.  Every
import counts, function-level and ``TYPE_CHECKING`` ones included, and so does what a module
imports through another.

* No operator process imports the dev cluster (``devcluster/``): ``cli/main.py`` only inside
  ``proxy-operator demo``'s function.

The page's "Package map" names every package of ``app/``, ``workers/``, ``watchers/``, ``api/``,
``cli/`` and ``devcluster/`` (and the few modules of ``app/`` outside a subpackage), every
subpackage of ``app/`` says in its ``__init__`` docstring what it owns, and every repository path
the page names exists.
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

GATEWAY = ("app/kube/gateway.py", "app/kube/status_writer.py")
DOMAIN = ("app/config/providers.py", "app/resources.py", "app/config/settings.py", "app/config/provider_types.py", "app/config/validation.py",
          "app/squid/conf.py", "app/config/tenancy.py", "app/providers/naming.py", "app/timefmt.py", "app/lazy.py")
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
    ("app/kube/gateway.py", "def _f():\n    import app.providers.kubernetes.provider\n", "The Kubernetes gateway knows no provider"),
    ("app/providers/gcp/ids.py", "from app import wiring\n", "Providers get their clients injected"),
    ("app/config/tenancy.py", "from app.providers import registry\n", "Plain domain modules never import a provider package"),
    ("watchers/leader.py", "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    import workers.tasks\n",
     "The watcher never loads the Celery side"),
    ("app/proxy/reconcile.py", "import celery\n", "Reconcile, dispatch, pools and the probe engine know no Celery"),
    ("app/probes/state.py", "from app.serving import view\n", None),  # allowed: a lower layer
    ("app/probes/state.py", "from app.proxy import gc\n", "The domain's own layers"),  # siblings are independent
    ("app/store/keys.py", "from app.kube import gateway\n", "The serving view and the Redis plumbing know no gateway"),
    ("api/routes.py", "from app.kube import gateway\n", "The API reads only Redis"),
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
    assert "app.kube.gateway" in modules
    providers = ("app.providers.base", "app.providers.registry", "app.providers.checks", "app.providers.kubernetes",
                 "app.providers.gcp", "app.providers.kvm", "workers")
    assert [m for m in modules if _under(m, providers)] == []


def test_the_composition_root_gives_the_kubernetes_provider_the_gateways_client(monkeypatch):
    import app.kube.gateway
    from app import wiring
    from app.config.providers import ProviderConfig
    from app.providers.kubernetes.config import KubernetesSettings
    from app.providers.kubernetes.provider import KubernetesProvider

    client = object()
    monkeypatch.setattr(app.kube.gateway, "api_client", lambda: client)
    provider = wiring.PROVIDER_TYPES["kubernetes"].build(ProviderConfig("k8s", "kubernetes", 60, 15,
                                                                        KubernetesSettings()))
    assert provider.core.api_client is client  # looked up on use, not at construction
    with pytest.raises(TypeError, match="client"):
        KubernetesProvider(ProviderConfig("k8s", "kubernetes", 60, 15, KubernetesSettings()))


# -- docs/architecture.md's package map matches the tree ------------------------------------------
ARCHITECTURE = ROOT / "docs" / "architecture.md"
PACKAGES = ("app", "workers", "watchers", "api", "cli", "devcluster")
#: A repository path as the page writes it: ``app/kube/gateway.py``, ``app/providers/<type>/registration.py``,
#: ``app/store/lua/*.lua``, ``app/providers/{pods,gcp,kvm}/``, ``tests/x.py::test_y`` (the test id is not part of it).
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
    text = ("`app/kube/gateway.py`, app/providers/{kubernetes,gcp}/ and `app/providers/<type>/registration.py`, "
            "`tests/test_layout.py::test_x`; see docs/redis.md. Not https://kubernetes.io/docs/concepts/x "
            "nor no/such/app/thing.")
    assert named_paths(text) == {"app/kube/gateway.py", "app/providers/kubernetes/", "app/providers/gcp/",
                                 "app/providers/*/registration.py", "tests/test_layout.py", "docs/redis.md"}
    assert missing_paths(text + " app/no_such_module.py, app/providers/{kubernetes,nope}/") == [
        "app/no_such_module.py", "app/providers/nope/"]


def _packages() -> list[Path]:
    return sorted(p.parent for top in PACKAGES for p in (ROOT / top).rglob("__init__.py"))


def test_every_package_is_in_the_package_map():
    """docs/architecture.md's "Package map" names every package of the product (and every module
    of ``app/`` outside a subpackage), so it cannot drift from the tree: a new package fails here
    until it has its line."""
    mapped = {p.rstrip("/") for p in named_paths(_section(ARCHITECTURE.read_text(), "Package map"))}
    names = [str(p.relative_to(ROOT)) for p in _packages()]
    names += [str(p.relative_to(ROOT)) for p in sorted((ROOT / "app").glob("*.py")) if p.name != "__init__.py"]
    assert len(names) > 20
    assert [n for n in names if n not in mapped] == []


def test_every_domain_package_says_what_it_owns():
    """Each subpackage of ``app/`` opens with a docstring: what it owns and what it must not import."""
    for package in _packages():
        if package.parent != ROOT / "app":
            continue
        import ast
        doc = ast.get_docstring(ast.parse((package / "__init__.py").read_text()))
        assert doc and len(doc.split()) > 15, package


def test_every_path_the_architecture_page_names_exists():
    assert missing_paths(ARCHITECTURE.read_text()) == []
