"""Polling helper for tests that wait on real processes."""

from __future__ import annotations

import time


def wait_for(predicate, timeout: float = 20.0, what: str = "condition", interval: float = 0.1, explain=None):
    """Call ``predicate`` until it returns a truthy value and return that value.

    ``explain``, if given, is called once on a timeout; the string it returns (e.g. the tails
    of the processes' logs) is appended to the failure message.

    Raises:
        AssertionError: ``timeout`` seconds passed; the message names ``what``.
    """
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(interval)
    message = f"timed out after {timeout}s waiting for {what}"
    raise AssertionError(message + (f"\n{explain()}" if explain is not None else ""))


def wait_until(predicate, timeout: float = 10.0, what: str = "condition", interval: float = 0.02) -> float:
    """Like :func:`wait_for`, polling every ``interval`` seconds; return the seconds waited
    (for tests that bound how long a takeover or recovery took)."""
    start = time.monotonic()
    wait_for(predicate, timeout, what, interval)
    return time.monotonic() - start
