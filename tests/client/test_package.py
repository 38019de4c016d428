"""The SDK is a package of its own: ``pip install ./clients/python`` into a fresh venv brings
requests alone, importing it (and its Scrapy middleware) loads nothing of the operator's stack,
and its version is defined once, where clients/python/pyproject.toml reads it."""

from __future__ import annotations

import importlib.metadata
import json
import re
import shutil
import subprocess
import sys
import tomllib

import pytest

import proxy_operator_client
from tests.support.processes import ROOT

SDK = ROOT / "clients" / "python"
#: Top-level modules the SDK must never load: the operator's packages and its heavy dependencies.
FORBIDDEN = {"celery", "kombu", "kubernetes", "libvirt", "redis", "app", "api", "workers", "watchers", "cli"}


def test_importing_the_sdk_loads_nothing_of_the_operator():
    # run from the repository's root, where app, api, workers ... are importable: nothing
    # imports them all the same
    code = ("import json, sys\n"
            "import proxy_operator_client, proxy_operator_client.scrapy\n"
            "print(json.dumps({'modules': sorted({m.split('.')[0] for m in sys.modules}),\n"
            "                  'version': proxy_operator_client.__version__,\n"
            "                  'file': proxy_operator_client.__file__}))\n")
    run = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env={"PATH": "/usr/bin:/bin"},
                         capture_output=True, text=True, timeout=60)
    assert run.returncode == 0, run.stderr
    loaded = json.loads(run.stdout)
    assert loaded["file"].startswith(str(SDK / "src")), loaded["file"]  # the SDK of this tree
    assert "scrapy" in loaded["modules"] and "requests" in loaded["modules"]  # the probe did import
    assert not FORBIDDEN & set(loaded["modules"]), FORBIDDEN & set(loaded["modules"])
    assert loaded["version"] == proxy_operator_client.__version__


def test_the_version_is_defined_once_and_is_the_packages():
    project = tomllib.loads((SDK / "pyproject.toml").read_text())
    # pyproject.toml has no version of its own: it reads the package's __version__
    assert "version" not in project["project"] and "version" in project["project"]["dynamic"]
    assert project["tool"]["setuptools"]["dynamic"]["version"] == {"attr": "proxy_operator_client.__version__"}
    version = proxy_operator_client.__version__
    assert re.fullmatch(r"\d+\.\d+\.\d+([.-]?(a|b|rc|dev|post)\d+)?", version), version
    # ... assigned in exactly one place of the package's source
    sources = {p.relative_to(SDK).as_posix(): p.read_text() for p in (SDK / "src").rglob("*.py")}
    assigned = [path for path, text in sources.items() for _ in re.finditer(r"^__version__\s*[:=]", text, re.M)]
    assert assigned == ["src/proxy_operator_client/__init__.py"], assigned
    literal = [path for path, text in sources.items() if re.search(rf"['\"]{re.escape(version)}['\"]", text)]
    assert literal == ["src/proxy_operator_client/__init__.py"], literal
    # the installed distribution says the same (built from that pyproject.toml)
    assert importlib.metadata.version("proxy-operator-client") == version


def test_the_sdk_depends_on_nothing_of_the_operators_stack():
    project = tomllib.loads((SDK / "pyproject.toml").read_text())["project"]
    requirements = list(project["dependencies"])
    for extra in project.get("optional-dependencies", {}).values():
        requirements += extra
    names = {re.split(r"[\s<>=!~;\[]", r, maxsplit=1)[0].lower().replace("_", "-") for r in requirements}
    assert names == {"requests", "httpx", "scrapy"}, names
    # and the operator's package does not ship the SDK inside itself
    include = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"]["find"]
    assert not any(re.fullmatch(p.replace(".", r"\.").replace("*", ".*"), "proxy_operator_client")
                   for p in include.get("include", [])), include


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_pip_install_into_a_fresh_venv_brings_requests_alone(tmp_path):
    """``pip install ./clients/python`` into a new virtualenv (no site packages, pip's own
    configuration and index, as a user runs it): only the SDK and requests with its own
    dependencies are installed, and the SDK and its middleware module import there."""
    src = tmp_path / "python"  # a copy: the build leaves build/ and *.egg-info in the source
    shutil.copytree(SDK, src, ignore=shutil.ignore_patterns("*.egg-info", "build", "__pycache__"))
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=60)
    python = venv / "bin" / "python"
    pip = [sys.executable, "-m", "pip", "--python", str(python)]
    install = subprocess.run([*pip, "install", "-q", str(src)], capture_output=True, text=True, timeout=240)
    assert install.returncode == 0, install.stdout + install.stderr[-3000:]
    listed = subprocess.run([*pip, "list", "--format=json"], capture_output=True, text=True, timeout=60, check=True)
    installed = {p["name"].lower().replace("_", "-") for p in json.loads(listed.stdout)}
    assert {"proxy-operator-client", "requests"} <= installed, installed
    assert installed <= {"proxy-operator-client", "requests", "urllib3", "idna", "charset-normalizer", "certifi"}, \
        installed
    code = ("import json, sys\n"
            "import proxy_operator_client\n"
            "from proxy_operator_client import ApiError, Client\n"
            "try:\n"
            "    import proxy_operator_client.scrapy\n"
            "    scrapy = 'imported'\n"
            "except ImportError as exc:\n"
            "    scrapy = exc.name\n"
            "print(json.dumps({'modules': sorted({m.split('.')[0] for m in sys.modules}), 'scrapy': scrapy,\n"
            "                  'version': proxy_operator_client.__version__, 'file': proxy_operator_client.__file__}))\n")
    run = subprocess.run([str(python), "-c", code], cwd=tmp_path, env={"PATH": "/usr/bin:/bin"},
                         capture_output=True, text=True, timeout=60)
    assert run.returncode == 0, run.stderr
    loaded = json.loads(run.stdout)
    assert loaded["file"].startswith(str(venv)), loaded["file"]  # the installed copy, not this tree
    assert loaded["version"] == proxy_operator_client.__version__
    assert "requests" in loaded["modules"] and not FORBIDDEN & set(loaded["modules"])
    assert loaded["scrapy"] == "scrapy"  # the middleware needs the [scrapy] extra, not installed here
