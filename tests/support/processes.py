"""The operator's processes for end-to-end tests: :mod:`devcluster.processes` (``Process``,
``celery_worker``, ``celery_beat``; ``BIN``, the venv's ``bin``; ``ROOT``, the checkout) and the
test watcher.
"""

from __future__ import annotations

from devcluster.processes import BIN, ROOT, Process, celery_beat, celery_worker

__all__ = ["BIN", "ROOT", "Process", "celery_beat", "celery_worker", "watcher"]


def watcher(env: dict[str, str], health_bind: str | None = None) -> Process:
    """``proxy-operator watch``."""
    argv = [str(BIN / "proxy-operator"), "watch", "--lease-namespace", "proxy-operator", "--identity", "test-watcher"]
    if health_bind:
        argv += ["--health-bind", health_bind]
    return Process("watcher", argv, env)
