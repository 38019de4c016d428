"""The 2-minute chaos run CI makes (bench/chaos.py, docs/reliability.md).

The whole stack of ``make demo`` with two watchers and two workers, two minutes of faults from a
fixed seed (every fault kind at least once: SIGKILL and restart of each process kind, SIGSTOP of
a worker, Redis restarted with and without its data, a Redis outage, a Squid killed behind a
Ready Proxy) while Proxies and a ProxyPool are applied, scaled and deleted and clients lease,
renew and release; then every invariant must hold within the settle limit.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))

from chaos import FAULT_KINDS, INVARIANTS  # noqa: E402

pytestmark = [pytest.mark.slow, pytest.mark.timeout(420)]

SEED = 7


def test_two_minutes_of_faults_leave_every_invariant_holding():
    run = subprocess.run([sys.executable, str(ROOT / "bench" / "chaos.py"), "--seed", str(SEED), "--duration", "120",
                          "--settle", "100"], capture_output=True, text=True, timeout=400, cwd=ROOT)
    out = run.stdout
    assert run.returncode == 0, f"{out[-8000:]}\n{run.stderr[-4000:]}"
    injected = re.search(r"^faults injected: (\d+) \((.*)\)$", out, re.M)
    assert injected, out
    counts = dict(part.rsplit(" ", 1) for part in injected.group(2).split(", "))
    assert set(counts) == set(FAULT_KINDS), out  # every kind, each really injected
    assert "nothing killed" not in out  # the Squid fault found a Ready Proxy's Squid to kill
    for name, _ in INVARIANTS:
        assert f"  ok   {name} " in out, out
    assert re.search(r"^violations: 0$", out, re.M), out
