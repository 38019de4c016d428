"""prometheus-client's multiprocess directory for a process that forks its workers.

prometheus-client decides at *import* time whether values live in memory (one process) or in
per-process files under ``PROMETHEUS_MULTIPROC_DIR`` that a scrape sums up.  A server whose
workers are forked children must therefore have the directory ready, empty of a previous
run's files, before anything imports ``prometheus_client``: :func:`prepare` does that, and
this module imports nothing of prometheus-client, Flask or the ``api`` package.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

ENV = "PROMETHEUS_MULTIPROC_DIR"


def prepare(prefix: str = "proxy-operator-metrics-") -> tuple[str, bool]:
    """Make ``PROMETHEUS_MULTIPROC_DIR`` an existing directory without stale sample files.

    When the variable is set, that directory is created if missing and its ``*.db`` files (the
    samples of an earlier run, which would otherwise be summed into this run's counters) are
    removed; nothing else in it is touched.  When it is not set, a fresh private directory is
    made under ``$TMPDIR`` (or ``/tmp``) and the variable is set to it for this process and
    the children it starts.

    Must run before ``prometheus_client`` is imported in this process.

    Args:
        prefix: name prefix of a directory made here.
    Returns:
        ``(path, created)``: the directory, and whether it was made here (the caller removes
        it with :func:`cleanup` when it exits).
    Raises:
        OSError: the directory cannot be created or cleared (for example a read-only path).
    """
    path = os.environ.get(ENV, "").strip()
    if path:
        Path(path).mkdir(parents=True, exist_ok=True)
        for stale in Path(path).glob("*.db"):
            stale.unlink()
        return path, False
    path = tempfile.mkdtemp(prefix=prefix)
    os.environ[ENV] = path
    return path, True


def cleanup(path: str) -> None:
    """Remove a directory made by :func:`prepare` (no error when it is already gone)."""
    shutil.rmtree(path, ignore_errors=True)
