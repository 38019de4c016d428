"""The pool autoscaler's arithmetic (app.pools.autoscale): recommendation, tolerance, bounds,
the scale-down window, and no oscillation under steady or bursty load."""

from __future__ import annotations

import random

import pytest

from app.pools.autoscale import MAX_HISTORY, Demand, current_count, decide, recommend, stabilize
from app.pools.model import Autoscale

AUTO = Autoscale(min_replicas=1, max_replicas=20, target=0.5, scale_down_delay=300)


def test_waiting_crawlers_from_refusals_per_second():
    assert Demand(refused=0, window=10).waiting == 0
    assert Demand(refused=30, window=10).waiting == 3
    assert Demand(refused=31, window=10).waiting == 4
    assert Demand(refused=5, window=0).waiting == 5  # a window under a second counts as one


def test_recommendation_is_load_over_target_capacity():
    # 12 live leases, 5 per member at 50 %: 12 / 2.5 -> 5 members
    assert recommend(AUTO, 3, Demand(live=12, ready=3), max_leases=5) == 5
    assert recommend(AUTO, 3, Demand(live=0, ready=3), max_leases=5) == 0
    assert recommend(AUTO, 0, Demand(refused=10, window=10), max_leases=5) == 1  # from zero on refusals


def test_within_tolerance_the_count_stands():
    # 4 members at 50 % of 5 = 10 leases; 9.5..10.5 -> stay; 9 and 11 are 10 % off: still stay
    for live in (9, 10, 11):
        assert recommend(AUTO, 4, Demand(live=live, ready=4), max_leases=5) == 4
    assert recommend(AUTO, 4, Demand(live=12, ready=4), max_leases=5) == 5
    assert recommend(AUTO, 4, Demand(live=5, ready=4), max_leases=5) == 2


def test_no_signal_while_members_exist_but_none_is_ready():
    assert recommend(AUTO, 3, Demand(live=0, ready=0), max_leases=5) is None
    assert recommend(AUTO, 3, Demand(live=0, ready=0, refused=9, window=3), max_leases=5) == 2  # refusals are a signal
    assert recommend(AUTO, 3, Demand(live=4, ready=1), max_leases=0) is None  # members take no leases at all


def test_current_count_is_spec_replicas_clamped():
    assert current_count(3, AUTO) == 3
    assert current_count(30, AUTO) == 20
    assert current_count(0, AUTO) == 1


def test_bounds_are_reported():
    small = Autoscale(min_replicas=2, max_replicas=3, target=0.5, scale_down_delay=0)
    d = decide(small, 2, Demand(live=50, ready=2), max_leases=5, history=[], now=0.0)
    assert (d.desired, d.raw, d.limited) == (3, 20, "TooManyReplicas")
    d = decide(small, 3, Demand(live=0, ready=3), max_leases=5, history=None, now=0.0)
    assert (d.desired, d.raw, d.limited) == (2, 0, "TooFewReplicas")
    d = decide(small, 2, Demand(live=5, ready=2), max_leases=5, history=[], now=0.0)
    assert (d.desired, d.limited) == (2, "")
    assert d.utilization == pytest.approx(0.5)


def test_scale_up_is_immediate_scale_down_waits_for_the_window():
    t = 0.0
    d = decide(AUTO, 4, Demand(live=10, ready=4), max_leases=5, history=[], now=t)
    assert d.desired == 4
    t = 100.0
    d = decide(AUTO, 4, Demand(live=30, ready=4), max_leases=5, history=d.history, now=t)
    assert d.desired == 12  # at once
    for t in (200.0, 300.0, 399.0):
        d = decide(AUTO, 12, Demand(live=2, ready=12), max_leases=5, history=d.history, now=t)
        assert d.desired == 12, t  # the 12 of t=100 is inside the last 300 s
    d = decide(AUTO, 12, Demand(live=2, ready=12), max_leases=5, history=d.history, now=501.0)
    assert d.desired == 1


def test_history_keeps_changes_only_and_what_was_in_effect_at_the_window_start():
    desired, kept = stabilize([], 5, 0, delay=300)
    assert (desired, kept) == (5, [{"time": 0, "replicas": 5}])
    desired, kept = stabilize(kept, 5, 50, delay=300)
    assert kept == [{"time": 0, "replicas": 5}]  # unchanged: nothing appended
    desired, kept = stabilize(kept, 2, 100, delay=300)
    assert desired == 5 and len(kept) == 2
    desired, kept = stabilize(kept, 2, 399, delay=300)
    assert desired == 5  # 5 was in effect until t=100, inside [99, 399]
    desired, kept = stabilize(kept, 2, 400, delay=300)
    assert desired == 2 and kept == [{"time": 100, "replicas": 2}]
    # malformed entries are dropped; the list stays bounded
    many = [{"time": i, "replicas": i % 7} for i in range(200)] + [{"time": "x"}, "junk"]
    _, kept = stabilize(many, 3, 200, delay=10_000)
    assert len(kept) <= MAX_HISTORY


def _run(load, passes=400, dt=15.0, auto=AUTO, start=4):
    """Feed ``load(t)`` (live leases) to the autoscaler every ``dt`` seconds; return the desired counts."""
    history, current, out = [], start, []
    for i in range(passes):
        t = i * dt
        d = decide(auto, current, Demand(live=load(t, current), ready=current), max_leases=5, history=history, now=t)
        current, history = d.desired, d.history
        out.append(current)
    return out


def test_steady_load_with_noise_never_oscillates():
    rng = random.Random(7)
    # about 20 live leases (+-1): 8 members at 50 %; the noise stays inside the tolerance
    counts = _run(lambda t, n: 20 + rng.choice((-1, 0, 1)))
    settled = counts[10:]
    assert len(set(settled)) == 1 and settled[0] == 8
    changes = sum(1 for a, b in zip(counts, counts[1:]) if a != b)
    assert changes <= 1


def test_bursty_load_scales_up_fast_and_down_once_after_the_window():
    # 10 leases, with a burst to 40 for one minute every ten minutes
    counts = _run(lambda t, n: 40 if (t % 600) < 60 else 10, passes=200)
    changes = [(i, a, b) for i, (a, b) in enumerate(zip(counts, counts[1:])) if a != b]
    # every burst: one step up at once; the count falls back at most once per burst, never flaps
    ups = [c for c in changes if c[2] > c[1]]
    downs = [c for c in changes if c[2] < c[1]]
    assert ups and all(b == 16 for _, _, b in ups)
    assert counts[0] == 16  # the first burst is at t=0
    assert len(downs) <= len(ups) + 1
    # with bursts closer together than the delay the pool just stays up
    close = _run(lambda t, n: 40 if (t % 240) < 30 else 10, passes=200)
    assert set(close[5:]) == {16}
