"""app.timefmt: the one RFC 3339 formatter and parser."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

import pytest

from app.timefmt import parse_rfc3339, rfc3339

EPOCH = 1767323045.987654  # 2026-01-02T03:04:05.987654Z


def test_seconds_as_kubernetes_serialises_metav1_time():
    assert rfc3339(EPOCH) == "2026-01-02T03:04:05Z"
    assert rfc3339(datetime(2026, 1, 2, 4, 4, 5, tzinfo=timezone(timedelta(hours=1)))) == "2026-01-02T03:04:05Z"
    assert rfc3339(datetime(2026, 1, 2, 3, 4, 5)) == "2026-01-02T03:04:05Z"  # naive: UTC
    assert rfc3339().endswith("Z") and len(rfc3339()) == 20


def test_milliseconds_are_truncated():
    assert rfc3339(EPOCH, millis=True) == "2026-01-02T03:04:05.987Z"
    assert rfc3339(1767323045.0, millis=True) == "2026-01-02T03:04:05.000Z"


@pytest.mark.parametrize("text", ["2026-01-02T03:04:05Z", "2026-01-02T03:04:05.000Z", "2026-01-02t03:04:05z",
                                  "2026-01-01T20:04:05-07:00", "2026-01-02T03:04:05", "2026-01-02T03:04:05.0000001Z"])
def test_parses_what_kubernetes_gce_and_libvirt_write(text):
    assert parse_rfc3339(text) == datetime(2026, 1, 2, 3, 4, 5, tzinfo=timezone.utc)
    assert parse_rfc3339(text).tzinfo is timezone.utc


def test_round_trip_and_fraction():
    assert parse_rfc3339(rfc3339(EPOCH)) == datetime(2026, 1, 2, 3, 4, 5, tzinfo=timezone.utc)
    assert parse_rfc3339("2026-01-02T03:04:05.5Z").microsecond == 500000


@pytest.mark.parametrize("text", ["", "2026-01-02", "yesterday", "2026-13-02T03:04:05Z", "2026-01-02T03:04:05+0700",
                                  # offsets past year 1 / 9999: OverflowError before
                                  "0001-01-01T00:00:00+23:59", "9999-12-31T23:59:59-23:59"])
def test_refuses_anything_else(text):
    with pytest.raises(ValueError, match="not an RFC 3339 timestamp"):
        parse_rfc3339(text)
