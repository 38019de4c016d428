"""README's test command is what CI runs, and it installs what a fresh machine lacks."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def test_readme_test_command_is_what_ci_runs():
    readme = (ROOT / "README.md").read_text()
    assert re.search(r"```sh\nmake test\n```", readme), "README shows `make test` as the test command"
    commands = [line for line in (ROOT / ".ci" / "run").read_text().splitlines()
                if line.strip() and not line.startswith("#") and not line.startswith(("set ", "cd "))]
    assert commands == ["make test"]
    makefile = (ROOT / "Makefile").read_text()
    assert re.search(r"^test: deps venv$", makefile, re.M), "make test installs the packages, then the venv"
    assert re.search(r"^deps:\n\tbash \.ci/install-deps$", makefile, re.M)


@pytest.mark.skipif(shutil.which("setpriv") is None or os.geteuid() != 0, reason="needs root and setpriv")
def test_a_missing_package_is_named_with_the_command_that_installs_it():
    """As a non-root newcomer on a machine that lacks a package, the message says what to run."""
    tmp_path = Path(tempfile.mkdtemp(prefix="po-ci-"))  # pytest's tmp tree is closed to other users
    try:
        (tmp_path / ".ci").mkdir()
        shutil.copy(ROOT / ".ci" / "install-deps", tmp_path / ".ci" / "install-deps")
        os.chmod(tmp_path, 0o755)
        os.chmod(tmp_path / ".ci", 0o755)

        def install_deps(packages: str) -> subprocess.CompletedProcess:
            (tmp_path / ".ci" / "apt-packages.txt").write_text(packages)
            return subprocess.run(["setpriv", "--reuid=nobody", "--regid=nogroup", "--clear-groups", "bash",
                                   str(tmp_path / ".ci" / "install-deps")], capture_output=True, text=True, timeout=60)

        out = install_deps("# comment\nbash\nno-such-package-po-test\n")
        assert out.returncode == 1
        assert "missing Debian packages: no-such-package-po-test" in out.stderr
        assert "sudo bash .ci/install-deps" in out.stderr
        ok = install_deps("bash\n")  # nothing missing: nothing to do, whoever runs it
        assert ok.returncode == 0, ok.stderr
    finally:
        shutil.rmtree(tmp_path, ignore_errors=True)
