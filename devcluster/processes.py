"""The operator's real processes, started through their real commands (the demo's and the tests').

``Process(name, argv, env)`` runs one command in its own session with output captured in a
log file; :meth:`Process.kill` sends SIGKILL to the whole group (the Celery parent and its
prefork children), :meth:`Process.stop` SIGTERM then SIGKILL.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from devcluster import ROOT

BIN = Path(sys.executable).parent


class Process:
    """One operator process.

    Args:
        name: label for logs.
        argv: the command line.
        env: extra environment (merged over os.environ).
    """

    def __init__(self, name: str, argv: list[str], env: dict[str, str], logdir: str | None = None) -> None:
        self.name, self.argv = name, argv
        self.env = {**os.environ, **env, "PYTHONUNBUFFERED": "1"}
        self.logdir = logdir or tempfile.mkdtemp(prefix=f"{name}-")
        self.log_path = Path(self.logdir) / f"{name}.log"
        self.proc: subprocess.Popen | None = None

    def start(self) -> "Process":
        """Start the command (cwd = the project root)."""
        self._log = open(self.log_path, "ab")
        self.proc = subprocess.Popen(self.argv, cwd=ROOT, env=self.env, stdout=self._log, stderr=subprocess.STDOUT,
                                     start_new_session=True)
        return self

    def log(self) -> str:
        """The process's combined output so far."""
        try:
            return self.log_path.read_text(errors="replace")
        except OSError:
            return ""

    def wait_for_log(self, needle: str, timeout: float = 30.0) -> None:
        """Wait until ``needle`` appears in the output; raise AssertionError with the log if not."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if needle in self.log():
                return
            if self.proc and self.proc.poll() is not None:
                break
            time.sleep(0.1)
        raise AssertionError(f"{self.name}: {needle!r} not seen; log:\n{self.log()[-5000:]}")

    def alive(self) -> bool:
        """Whether the process is running."""
        return self.proc is not None and self.proc.poll() is None

    def kill(self) -> None:
        """SIGKILL the whole process group (no cleanup, like a node dying)."""
        if self.proc is not None:
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            self.proc.wait(10)

    def stop(self, timeout: float = 15.0) -> None:
        """SIGTERM the group, SIGKILL after ``timeout`` seconds."""
        if self.proc is None or self.proc.poll() is not None:
            return
        try:
            os.killpg(self.proc.pid, signal.SIGTERM)
            self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.kill()
        except ProcessLookupError:
            pass
        self._log.close()


def celery_worker(env: dict[str, str], queues: str = "proxies,health,gc", concurrency: int = 2,
                  name: str = "worker", pool: str = "prefork") -> Process:
    """``celery -A workers worker -Q <queues>`` as deployed (events on, so Flower can see tasks)."""
    return Process(name, [str(BIN / "celery"), "-A", "workers", "worker", "-Q", queues, "-E",
                          "--without-gossip", "--without-mingle", "--concurrency", str(concurrency),
                          "--pool", pool, "--loglevel", "INFO", "-n", f"{name}@%h"], env)


def celery_beat(env: dict[str, str], workdir: str) -> Process:
    """``celery -A workers beat`` with the deployed scheduler (redbeat's, riding out Redis loss)."""
    return Process("beat", [str(BIN / "celery"), "-A", "workers", "beat", "-S",
                            "workers.beat_scheduler.ResilientRedBeatScheduler",
                            "--loglevel", "INFO", "--pidfile", str(Path(workdir) / "beat.pid")], env)
