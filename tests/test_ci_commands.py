"""README's test command is what CI runs, and it installs what a fresh machine lacks."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
#: The demo as a user starts it: the project's command, from the venv running the tests.
DEMO = [str(Path(sys.executable).parent / "proxy-operator"), "demo"]


def test_readme_test_command_is_what_ci_runs():
    readme = (ROOT / "README.md").read_text()
    assert re.search(r"```sh\nmake test\n```", readme), "README shows `make test` as the test command"
    commands = [line for line in (ROOT / ".ci" / "run").read_text().splitlines()
                if line.strip() and not line.startswith("#") and not line.startswith(("set ", "cd "))]
    assert commands == ["make lint", "make test"]  # the gates, then README's test command
    makefile = (ROOT / "Makefile").read_text()
    assert re.search(r"^lint: deps venv$", makefile, re.M), "make lint installs what the venv builds against"
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


@pytest.mark.skipif(shutil.which("setpriv") is None or os.geteuid() != 0, reason="needs root and setpriv")
def test_the_demo_package_set_names_what_is_missing_and_how_to_install_it():
    """`bash .ci/install-deps demo` checks only the demo's list; as a non-root user it names the
    missing packages and the commands to run as root; a package whose program is on PATH counts."""
    tmp_path = Path(tempfile.mkdtemp(prefix="po-ci-"))
    try:
        (tmp_path / ".ci").mkdir()
        shutil.copy(ROOT / ".ci" / "install-deps", tmp_path / ".ci" / "install-deps")
        (tmp_path / ".ci" / "apt-packages.txt").write_text("no-such-test-package-po\n")
        os.chmod(tmp_path, 0o755)
        os.chmod(tmp_path / ".ci", 0o755)

        def install_deps(demo_packages: str, *args: str) -> subprocess.CompletedProcess:
            (tmp_path / ".ci" / "apt-packages-demo.txt").write_text(demo_packages)
            return subprocess.run(["setpriv", "--reuid=nobody", "--regid=nogroup", "--clear-groups", "bash",
                                   str(tmp_path / ".ci" / "install-deps"), *args], capture_output=True, text=True,
                                  timeout=60)

        out = install_deps("# comment\nno-such-demo-package-po no-such-command-po\nbash\n", "demo")
        assert out.returncode == 1
        assert "missing Debian packages: no-such-demo-package-po" in out.stderr
        assert "no-such-test-package-po" not in out.stderr  # the test suite's list is not read
        assert "sudo bash .ci/install-deps demo" in out.stderr
        assert "sudo apt-get install no-such-demo-package-po" in out.stderr
        # installed some other way (here: a package name dpkg does not know, its program on PATH)
        ok = install_deps("no-such-demo-package-po bash\n", "demo")
        assert ok.returncode == 0, ok.stderr
        wrong = install_deps("bash\n", "dmeo")
        assert wrong.returncode == 2 and "unknown package set 'dmeo'" in wrong.stderr
    finally:
        shutil.rmtree(tmp_path, ignore_errors=True)


def test_make_demo_installs_only_what_the_demo_runs():
    """`make demo` checks the demo's packages (redis-server, squid) and installs the demo extra,
    not the test suite's packages (qemu, libvirt, ...) nor libvirt-python; `make test` is unchanged."""
    demo_packages = [line.split()[0] for line in (ROOT / ".ci" / "apt-packages-demo.txt").read_text().splitlines()
                     if line.strip() and not line.startswith("#")]
    assert demo_packages == ["redis-server", "squid"]
    test_packages = {line.strip() for line in (ROOT / ".ci" / "apt-packages.txt").read_text().splitlines()}
    assert set(demo_packages) <= test_packages  # `make test` still installs them
    dry = subprocess.run(["make", "-n", "-B", "demo"], cwd=ROOT, capture_output=True, text=True, timeout=30)
    assert dry.returncode == 0, dry.stderr
    assert "bash .ci/install-deps demo" in dry.stdout.splitlines()
    assert "'.[demo]'" in dry.stdout and "kvm" not in dry.stdout and "test," not in dry.stdout
    full = subprocess.run(["make", "-n", "-B", "test"], cwd=ROOT, capture_output=True, text=True, timeout=30)
    assert "bash .ci/install-deps" in full.stdout.splitlines()
    assert "-e '.[test,kvm]' -e ./clients/python" in full.stdout
    import tomllib
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    assert set(extras["demo"]) <= set(extras["test"])  # the test venv runs the demo too


def _busy_port():
    import socket

    busy = socket.socket()
    busy.bind(("127.0.0.1", 0))
    busy.listen(1)
    return busy, busy.getsockname()[1]


def test_make_demo_names_the_setting_of_a_busy_port_and_starts_nothing():
    """Through make, the port comes from DEMO_API_PORT and the message says so; run directly,
    the flag; a busy default names the default and how to change it.  Nothing had started, so
    no "stopped." line."""
    busy, port = _busy_port()
    with busy:
        res = subprocess.run(["make", "-o", "demo-deps", "-o", "venv-demo", "demo"], cwd=ROOT,
                             env={**os.environ, "DEMO_API_PORT": str(port)}, capture_output=True, text=True,
                             timeout=60)
        assert f"proxy-operator demo: DEMO_API_PORT={port}: something already listens on 127.0.0.1:{port}" in res.stderr
        assert "--api-port" not in res.stderr and "stopped." not in res.stdout and res.returncode != 0
        res = subprocess.run([*DEMO, "--api-port", "0", "--flower-port",
                              str(port)], cwd=ROOT, env={**os.environ, "DEMO_FLOWER_PORT": "1"},
                             capture_output=True, text=True, timeout=60)
        assert res.returncode == 1
        assert f"proxy-operator demo: --flower-port {port}: something already listens on 127.0.0.1:{port}" in res.stderr
        assert "stopped." not in res.stdout
        res = subprocess.run(DEMO, cwd=ROOT, capture_output=True, text=True,
                             env={**os.environ, "DEMO_API_PORT": "80a"}, timeout=60)
        assert res.returncode == 2 and "DEMO_API_PORT='80a': not a port number" in res.stderr


def test_demo_port_settings_as_the_user_wrote_them():
    from devcluster import demo

    got = demo.resolve_ports({"--api-port": None, "--flower-port": 7000, "--kube-port": None},
                             {"DEMO_API_PORT": "9000", "DEMO_FLOWER_PORT": "7001"})
    assert got["--api-port"] == (9000, "DEMO_API_PORT=9000")
    assert got["--flower-port"] == (7000, "--flower-port 7000")  # the flag wins over the variable
    assert got["--kube-port"][0] == 0
    default = demo.resolve_ports({}, {})["--api-port"]
    assert default == (8080, "the API port 8080 (the default; DEMO_API_PORT or --api-port changes it)")
    busy, port = _busy_port()
    with busy:
        problems = demo.port_problems({"--api-port": (port, f"DEMO_API_PORT={port}"),
                                       "--flower-port": (port, f"--flower-port {port}"),
                                       "--kube-port": (0, "free")})
    assert problems == [f"DEMO_API_PORT={port}: something already listens on 127.0.0.1:{port}",
                        f"--flower-port {port}: the same port as DEMO_API_PORT={port}"]
    with pytest.raises(ValueError, match=r"--api-port 70000: not a port number"):
        demo.resolve_ports({"--api-port": 70000}, {})


def readme_demo_block() -> list[str]:
    """The lines of README's ``sh`` block under "Without Docker: `make demo`"."""
    section = (ROOT / "README.md").read_text().split("### Without Docker: `make demo`", 1)[1]
    return re.search(r"```sh\n(.*?)```", section, re.S).group(1).splitlines()


def test_readme_demo_command_is_the_make_target_and_its_steps_are_the_banners():
    """README's no-Docker command is a Makefile target that runs ``proxy-operator demo``, and the
    steps README shows after the two per-run lines are the banner's, word for word (the banner
    itself, and those steps run as written, are checked by tests/test_demo_stack.py)."""
    from devcluster import demo

    lines = readme_demo_block()
    commands = [line for line in lines if not line.startswith("#")]
    assert commands[0] == "make demo"
    makefile = (ROOT / "Makefile").read_text()
    assert re.search(r"^\.PHONY:.*\bdemo\b", makefile, re.M)
    assert re.search(r"^demo: demo-deps venv-demo\n\t\$\(BIN\)/proxy-operator demo$", makefile, re.M)
    dry = subprocess.run(["make", "-n", "demo"], cwd=ROOT, capture_output=True, text=True, timeout=30)
    assert dry.returncode == 0, dry.stderr
    assert ".venv/bin/proxy-operator demo" in dry.stdout.splitlines()
    # The two lines make demo prints with this run's values, as placeholders ...
    assert re.fullmatch(r"export KUBECONFIG=/tmp/proxy-operator-demo-\w+/kubeconfig", commands[1])
    assert re.fullmatch(r"TOKEN=demo-\S+ API=http://127\.0\.0\.1:8080 ORIGIN=http://127\.0\.0\.1:\S+/", commands[2])
    # ... then the steps, which take the proxy from the lease answer (no address written in).
    assert commands[3:] == list(demo.STEPS_LINES)
    assert not re.search(r"127\.0\.1\.\d|:3128", "\n".join(lines))


FAKE_KUBECTL = """#!/bin/sh
[ "$*" = "version --client -o json" ] || exit 64
cat <<'JSON'
%s
JSON
"""


@pytest.mark.parametrize("answer, warned", [
    ('{"clientVersion": {"major": "1", "minor": "20", "gitVersion": "v1.20.0"}}', "kubectl v1.20.0"),
    ('{"clientVersion": {"major": "1", "minor": "26+", "gitVersion": "v1.26.15-eks-1"}}', "kubectl v1.26.15-eks-1"),
    ('{"clientVersion": {"major": "1", "minor": "27", "gitVersion": "v1.27.0"}}', None),
    ('{"clientVersion": {"major": "1", "minor": "32+", "gitVersion": "v1.32.4-dispatcher"}}', None),
    ('{"clientVersion": {"major": "1", "minor": "30+"}}', None),  # no gitVersion: major.minor
    ('{"clientVersion": {"major": "1", "minor": "19"}}', "kubectl v1.19"),
    ("error: unknown flag: --output", "could not tell the version"),
])
def test_demo_warns_about_a_kubectl_older_than_the_minimum(tmp_path, answer, warned):
    from devcluster import demo

    fake = tmp_path / "kubectl"
    fake.write_text(FAKE_KUBECTL % answer)
    fake.chmod(0o755)
    got = demo.kubectl_warning(path=str(tmp_path))
    if warned is None:
        assert got is None
    else:
        assert warned in got and f"{fake}" in got and "1.27 or newer" in got


def test_demo_warns_when_kubectl_is_missing(tmp_path):
    from devcluster import demo

    got = demo.kubectl_warning(path=str(tmp_path))
    assert "kubectl is not on PATH" in got and "1.27 or newer" in got


@pytest.mark.parametrize("package_set, answer, note", [
    ("test", None, "kubectl is not installed: the tests that run the real kubectl"),
    ("demo", None, "kubectl is not installed: the demo runs without it, but its kubectl steps"),
    ("test", '{"clientVersion": {"major": "1", "minor": "20", "gitVersion": "v1.20.0"}}', "is kubectl 1.20: "),
    ("test", '{"clientVersion": {"major": "1", "minor": "26+"}}', "is kubectl 1.26: "),
    ("test", "error: unknown flag: --output", "could not tell the version of"),
    ("test", '{"clientVersion": {"major": "1", "minor": "27", "gitVersion": "v1.27.0"}}', None),
    ("demo", '{"clientVersion": {"major": "1", "minor": "32+", "gitVersion": "v1.32.4-dispatcher"}}', None),
])
def test_install_deps_says_when_kubectl_is_missing_or_too_old(tmp_path, package_set, answer, note):
    """No package set installs kubectl (no Debian release has 1.27 or newer): `.ci/install-deps`
    says when it is missing or too old, what that skips, and where to get one; it is no failure."""
    (tmp_path / ".ci").mkdir()
    shutil.copy(ROOT / ".ci" / "install-deps", tmp_path / ".ci" / "install-deps")
    for name in ("apt-packages.txt", "apt-packages-demo.txt"):
        (tmp_path / ".ci" / name).write_text("bash bash\n")  # nothing missing: apt-get is never run
    bin_dir = tmp_path / "bin"  # the tools the script uses, and kubectl only when the case has one
    bin_dir.mkdir()
    for tool in ("bash", "cat", "dirname", "dpkg-query", "grep", "id", "mkdir"):
        (bin_dir / tool).symlink_to(shutil.which(tool))
    if answer is not None:
        (bin_dir / "kubectl").write_text(FAKE_KUBECTL % answer)
        (bin_dir / "kubectl").chmod(0o755)
    res = subprocess.run([str(bin_dir / "bash"), str(tmp_path / ".ci" / "install-deps"), package_set],
                         env={"PATH": str(bin_dir), "HOME": str(tmp_path)}, capture_output=True, text=True, timeout=60)
    assert res.returncode == 0, res.stderr
    if note is None:
        assert "kubectl" not in res.stderr
    else:
        assert note in res.stderr
        if answer is not None:
            assert f"{bin_dir / 'kubectl'}" in res.stderr
        if "could not tell" not in note:
            assert "1.27 or newer" in res.stderr and "https://kubernetes.io/docs/tasks/tools/" in res.stderr


def test_make_demo_prints_the_kubectl_warning_at_start_and_carries_on(tmp_path):
    """The check runs before anything starts, and is no failure: here the demo then stops only
    because its API port is taken."""
    import socket

    fake = tmp_path / "kubectl"
    fake.write_text(FAKE_KUBECTL % '{"clientVersion": {"major": "1", "minor": "20", "gitVersion": "v1.20.0"}}')
    fake.chmod(0o755)
    env = {**os.environ, "PATH": f"{tmp_path}:{os.environ.get('PATH', '/usr/bin:/bin')}:/usr/sbin"}
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen(1)
        port = busy.getsockname()[1]
        res = subprocess.run([*DEMO, "--api-port",
                              str(port), "--flower-port", "0"], cwd=ROOT, env=env, capture_output=True, text=True,
                             timeout=60)
    assert "proxy-operator demo: warning: " in res.stderr and "kubectl v1.20.0" in res.stderr, res.stderr
    assert "1.27 or newer" in res.stderr
    assert res.returncode == 1 and f"--api-port {port}: something already listens" in res.stderr


def _make_test_with(tmp_path, fail: set[str]) -> tuple[subprocess.CompletedProcess, list[str]]:
    """`make test` with a stand-in pytest in ``BIN`` that logs its arguments and fails in the
    phases named in ``fail`` (``suite``: the first, ``guest``: the real-guest one); deps and venv
    are taken as made (``-o``)."""
    log = tmp_path / "calls"
    stub = tmp_path / "pytest"
    stub.write_text("#!/bin/sh\n"
                    f"echo \"$*\" >> {log}\n"
                    f"case \"$*\" in *'-m guest'*) phase=guest;; *) phase=suite;; esac\n"
                    f"case ' {' '.join(sorted(fail))} ' in *\" $phase \"*) exit 1;; esac\n"
                    "exit 0\n")
    stub.chmod(0o755)
    res = subprocess.run(["make", "-o", "deps", "-o", "venv", "-o", ".venv/.installed-test", "test",
                          f"BIN={tmp_path}"], cwd=ROOT, capture_output=True, text=True, timeout=60)
    return res, log.read_text().splitlines() if log.exists() else []


@pytest.mark.parametrize("fail", [set(), {"suite"}, {"guest"}, {"suite", "guest"}],
                         ids=["none", "suite", "guest", "both"])
def test_make_test_runs_both_phases_and_fails_if_either_failed(tmp_path, fail):
    """A failing first phase must not hide the real-guest phase's result: both always run, in
    order, and `make test` (what CI runs) fails when either failed, naming which."""
    res, calls = _make_test_with(tmp_path, fail)
    assert len(calls) == 2, (calls, res.stdout, res.stderr)
    assert "-m not e2e and not kvmhost and not guest" in calls[0] and calls[1].endswith("-m guest")
    assert (res.returncode != 0) == bool(fail), (res.returncode, res.stderr)
    for phase in ("suite", "guest"):
        assert (phase in res.stderr.rpartition("failed phase(s):")[2]) == (phase in fail), res.stderr
