"""The layout rules of docs/architecture.md ("Layout rules"), checked on the import statements.

* The Kubernetes gateway (``app/kube.py``, ``app/status_writer.py``) knows no provider: it
  imports nothing from ``app/providers/``.
* A provider never imports the gateway or the composition root: its clients are injected by
  ``app/wiring.py`` (the kubernetes provider gets the gateway's per-process client).
* Plain domain modules (``app/config.py``, ``app/resources.py``, ``app/settings.py``,
  ``app/provider_types.py`` ...) never import ``app/providers/``: providers depend on the domain.
* The watcher (``watchers/``) imports nothing from ``workers/`` (the Celery side); the
  composition root (``cli/main.py``) injects the publisher (also ``tests/test_watcher_imports.py``).

Every ``import`` statement counts, function-level and ``TYPE_CHECKING`` ones included.  Imports
are resolved as Python resolves them: ``from kubernetes import config`` is the ``kubernetes``
client package, not ``app/providers/pods``.

* No operator process imports the dev cluster (``devcluster/``): ``cli/main.py`` only inside
  ``proxy-operator demo``'s function.

The page's "Module map" names every module of ``app/``, ``workers/``, ``watchers/``, ``api/``,
``cli/`` and ``devcluster/``, and every repository path the page names exists.
"""

from __future__ import annotations

import ast
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

GATEWAY = ("app/kube.py", "app/status_writer.py")
DOMAIN = ("app/config.py", "app/resources.py", "app/settings.py", "app/provider_types.py", "app/validation.py",
          "app/squid.py", "app/tenancy.py", "app/naming.py", "app/timefmt.py", "app/lazy.py")


def _module_of(path: Path) -> str:
    rel = path.relative_to(ROOT).with_suffix("")
    parts = rel.parts[:-1] if rel.name == "__init__" else rel.parts
    return ".".join(parts)


def imports_of(path: Path, text: str | None = None) -> list[tuple[int, str]]:
    """``(line, module)`` for every module an import statement of ``path`` (or ``text`` as if it
    were that file) may load.

    ``from a.b import c`` yields ``a.b`` and ``a.b.c`` (``c`` may be a submodule); relative
    imports are resolved against the file's package.
    """
    module = _module_of(path)
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found: list[tuple[int, str]] = []
    for node in ast.walk(ast.parse(path.read_text() if text is None else text, str(path))):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[:len(base) - (node.level - 1)]
                source = ".".join(base + ([node.module] if node.module else []))
            else:
                source = node.module or ""
            found.append((node.lineno, source))
            found += [(node.lineno, f"{source}.{alias.name}") for alias in node.names if alias.name != "*"]
    return found


def _under(module: str, prefixes: tuple[str, ...]) -> bool:
    return any(module == p or module.startswith(p + ".") for p in prefixes)


def violations(files, forbidden: tuple[str, ...], rule: str) -> list[str]:
    out = []
    for path in files:
        seen = set()
        for line, module in imports_of(path):
            if _under(module, forbidden) and line not in seen:
                seen.add(line)
                out.append(f"{path.relative_to(ROOT)}:{line} imports {module} ({rule})")
    return out


def _files(*patterns: str) -> list[Path]:
    files = sorted({p for pattern in patterns for p in ROOT.glob(pattern)})
    assert files, patterns
    return files


def test_the_imports_are_resolved_as_python_resolves_them():
    sample = ROOT / "app" / "pools" / "sample.py"  # parsed as if it lived there; never written
    assert imports_of(sample, "from kubernetes import config\n") == [(1, "kubernetes"), (1, "kubernetes.config")]
    assert (1, "app.providers.pods") in imports_of(sample, "from ..providers import pods\n")
    assert (2, "app.providers.base") in imports_of(sample, "def f():\n    import app.providers.base\n")
    assert (1, "app.providers") in imports_of(sample, "from app import providers\n")


def test_the_gateway_imports_no_provider():
    assert violations(_files(*GATEWAY), ("app.providers",),
                      "the Kubernetes gateway knows no provider; clients are injected at app/wiring.py") == []


def test_providers_never_import_the_gateway_or_the_composition_root():
    assert violations(_files("app/providers/**/*.py"),
                      ("app.kube", "app.status_writer", "app.wiring", "cli"),
                      "a provider gets its clients injected at the composition root (app/wiring.py)") == []


def test_plain_domain_modules_never_import_providers():
    assert violations(_files(*DOMAIN), ("app.providers",),
                      "providers depend on the domain, never the reverse; "
                      "ProviderType lives in app/provider_types.py") == []


def test_the_watcher_never_imports_the_celery_side():
    assert violations(_files("watchers/**/*.py"), ("workers",),
                      "the watcher imports nothing from workers/; cli/main.py injects the publisher") == []


def test_no_operator_process_imports_the_dev_cluster():
    """devcluster/ is the local simulated cluster; the command loads it for ``proxy-operator demo`` only,
    inside that command's function (never at module level)."""
    assert violations(_files("app/**/*.py", "workers/**/*.py", "watchers/**/*.py", "api/**/*.py"), ("devcluster",),
                      "the operator's processes never load the dev cluster") == []
    cli = ROOT / "cli" / "main.py"
    top_level = {node.lineno for node in ast.parse(cli.read_text()).body}
    assert [(line, m) for line, m in imports_of(cli) if _under(m, ("devcluster",)) and line in top_level] == []


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
