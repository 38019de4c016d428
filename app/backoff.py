"""Capped exponential backoff: the one formula every retry loop of the operator uses.

Used by the reconcile steps (Transient retries and poll delays), the pool controller (creates
held back after failures), beat's scheduler (Redis lost) and the watcher's stream (reconnects).
"""

from __future__ import annotations

import random
from typing import Callable

#: Doublings beyond this change nothing for any cap the operator uses and keep ``2 ** n`` small.
MAX_DOUBLINGS = 30


def capped_exponential(attempt: int, initial: float, cap: float) -> float:
    """Return ``initial`` doubled ``attempt`` times, at most ``cap`` (seconds in, seconds out).

    Args:
        attempt: 0 for the first delay; negative values count as 0.
        initial: the first delay.
        cap: the largest delay returned.
    """
    return min(cap, initial * 2 ** min(max(attempt, 0), MAX_DOUBLINGS))


def equal_jitter(delay: float, rand: Callable[[], float] = random.random) -> float:
    """Return ``delay`` with "equal jitter": half fixed, half uniformly random, so many waiters
    that failed together spread out (a value in ``[delay / 2, delay]``).

    Args:
        delay: the un-jittered delay, seconds.
        rand: a source of floats in ``[0, 1)`` (tests pass a fixed one).
    """
    return delay / 2 + rand() * delay / 2
