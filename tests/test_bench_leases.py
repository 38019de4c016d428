"""bench/leases.py runs end to end and prints the side-by-side table with its targets.

A smoke run (one short round per server): the figures of a run this short mean nothing, so
only the shape of the output is checked, never a speed (speed targets are the benchmark's to
print, docs/performance.md).
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

pytestmark = [pytest.mark.slow, pytest.mark.timeout(240)]


def test_the_lease_benchmark_prints_both_servers_both_floors_and_the_targets():
    out = subprocess.run([sys.executable, str(ROOT / "bench" / "leases.py"), "--seconds", "1", "--warmup", "0.3",
                          "--rounds", "1", "--connections", "4", "--proxies", "3"],
                         capture_output=True, text=True, timeout=200, cwd=ROOT)
    assert out.returncode == 0, out.stderr[-3000:]
    text = out.stdout
    labels = ["gunicorn gthread (old)", "granian (new)"]
    # one round per server (old, then new), each reporting its error count; every count is 0
    rounds = re.split(r"^round \d+ of 1, ", text, flags=re.M)[1:]
    assert len(rounds) == len(labels), text[-3000:]
    for label, section in zip(labels, rounds):
        assert section.startswith(label), section
        assert re.search(r"^\s*errors: \d+", section, re.M), section
    counts = [int(n) for n in re.findall(r"^\s*errors: (\d+)", text, re.M)]
    assert len(counts) >= len(labels) and not any(counts), text[-3000:]
    for label in labels:
        assert f"serving floor of {label}, 2x4 (trivial WSGI callable" in text
        assert f"serving floor of {label}, 2x4 (trivial Flask app" in text
    table = text[text.index("pairs/s median"):]
    assert "floor req/s WSGI / Flask" in table and "new / old pairs/s:" in table
    targets = next(line for line in table.splitlines() if line.startswith("targets:"))
    for check in ("new >= 1.4 x old pairs/s", "new p99 < 35 ms", "40% of its WSGI callable floor/2",
                  "40% of its Flask app floor/2"):
        assert check in targets
