"""The real ``kubectl`` against the API fake, as a user runs it.

:class:`Kubectl` runs the kubectl binary found on ``PATH`` with a kubeconfig written for one
:class:`devcluster.apiserver.server.FakeKube` and a private discovery cache and ``HOME`` (nothing of
the machine's own ``~/.kube`` is read or written).  :data:`needs_kubectl` skips a test, with
:data:`KUBECTL_MISSING` as the reason, when kubectl is not installed: the fake serves what kubectl
1.27 or newer needs (OpenAPI v3; see :data:`devcluster.demo.KUBECTL_MINIMUM`), and no package
registry this project installs from has one (Debian 12's ``kubernetes-client`` is 1.20).
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

#: Why kubectl tests skip when the binary is missing, and where to get one.
KUBECTL_MISSING = ("kubectl is not installed (1.27 or newer, from https://kubernetes.io/docs/tasks/tools/; "
                   "Debian 12's kubernetes-client 1.20 is too old)")

#: Skips the marked test (or module, in ``pytestmark``) when ``kubectl`` is not on ``PATH``.
needs_kubectl = pytest.mark.skipif(shutil.which("kubectl") is None, reason=KUBECTL_MISSING)


class Kubectl:
    """``kubectl`` pointed at one API fake.

    ``Kubectl(fake, workdir, cwd=None)`` writes ``workdir/kubeconfig`` for ``fake`` (a
    :class:`~devcluster.apiserver.server.FakeKube`) and keeps kubectl's discovery cache and ``HOME``
    under ``workdir``.  Commands run in ``cwd`` (default ``workdir``), so relative ``-f`` paths are
    read from there.  kubectl sends no bearer token to a plain-HTTP server (seen with ``-v=8``
    on 1.32), so :meth:`FakeKube.audit` does not see its requests: tell them apart by their
    effects, or from kubectl's own request log (``-v=6``).

    Raises:
        FileNotFoundError: kubectl is not on ``PATH`` (use :data:`needs_kubectl` to skip instead).
    """

    def __init__(self, fake, workdir: str | Path, *, cwd: str | Path | None = None) -> None:
        binary = shutil.which("kubectl")
        if binary is None:
            raise FileNotFoundError(KUBECTL_MISSING)
        workdir = Path(workdir)
        workdir.mkdir(parents=True, exist_ok=True)
        self.binary = binary
        self.cwd = Path(cwd) if cwd is not None else workdir
        #: The environment kubectl runs with (also for a test's own ``Popen``).
        self.env = {"KUBECONFIG": fake.write_kubeconfig(str(workdir / "kubeconfig")),
                    "KUBECACHEDIR": str(workdir / "kube-cache"), "HOME": str(workdir),
                    "PATH": os.environ.get("PATH") or "/usr/bin:/bin:/usr/local/bin"}

    def __call__(self, *args: str, check: bool = True, input: str | None = None,
                 timeout: float = 30) -> subprocess.CompletedProcess:
        """Run ``kubectl ARGS...`` and return the finished process (``stdout``/``stderr`` as text).

        ``input`` is sent on stdin (for ``apply -f -``); ``timeout`` is in seconds.

        Raises:
            AssertionError: ``check`` is true and kubectl exited non-zero; the message has the
                command, the exit code, stdout and stderr.
            subprocess.TimeoutExpired: kubectl ran longer than ``timeout``.
        """
        res = subprocess.run([self.binary, *args], env=self.env, capture_output=True, text=True, input=input,
                             timeout=timeout, cwd=self.cwd)
        if check and res.returncode != 0:
            raise AssertionError(f"kubectl {' '.join(args)} failed ({res.returncode}):\n{res.stdout}\n{res.stderr}")
        return res

    def popen(self, *args: str) -> subprocess.Popen:
        """Start ``kubectl ARGS...`` in the background (``get -w``, ``wait``), stderr merged
        into stdout, text mode; the caller terminates and reads it."""
        return subprocess.Popen([self.binary, *args], env=self.env, cwd=self.cwd, stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, text=True)
