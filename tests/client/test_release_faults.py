"""Releases that do not go through: the real API behind a relay that answers the first release
``500`` (tests/support/slow_relay.py), real Squids, the SDK.  A ``blocked`` or ``failed`` report
that failed is not lost: the lease's next release (``Client.close``, ``release_all``, a
``release()`` with the default outcome) sends that outcome, not ``ok``."""

from __future__ import annotations

import pytest

from proxy_operator_client import ApiError, Client
from tests.api.helpers import healthy
from tests.support.slow_relay import SlowRelay

pytestmark = [pytest.mark.slow, pytest.mark.timeout(60)]


def _active(api, ip: str) -> list[str]:
    with Client(api.url, api.token, wait=0) as reader:
        return [b["target"] for p in reader.proxies() if p["egressIP"] == ip for b in p["bans"]["active"]]


def test_a_blocked_report_that_failed_is_sent_blocked_again_when_the_client_closes(api, fleet, client_squids,
                                                                                   health_settings):
    healthy(fleet, client_squids, health_settings, count=3, max_leases=3)
    relay = SlowRelay(api.url, delay=0, fail=1)
    try:
        client = Client(relay.url, api.token, wait=0)
        lease = client.lease(target="flaky.example", ttl=60)
        with pytest.raises(ApiError):
            lease.report("blocked")
        assert relay.failed and "outcome=blocked" in relay.failed[0]
        assert lease.released is None and _active(api, lease.egress_ip) == []
        client.close()  # releases what is still held
        assert lease.released is not None and lease.released.outcome == "blocked"
        assert _active(api, lease.egress_ip) == ["flaky.example"]
    finally:
        relay.stop()


def test_a_release_with_the_default_outcome_after_a_failed_report_sends_the_report(api, fleet, client_squids,
                                                                                  health_settings):
    healthy(fleet, client_squids, health_settings, count=3, max_leases=3)
    relay = SlowRelay(api.url, delay=0, fail=1)
    try:
        with Client(relay.url, api.token, wait=0) as client:
            lease = client.lease(target="flaky.example", ttl=60)
            with pytest.raises(ApiError):
                lease.report("failed")
            with lease:  # the block ends without an exception: the default outcome
                pass
            assert lease.release_error is None and lease.released.outcome == "failed"
            assert _active(api, lease.egress_ip) == ["flaky.example"]
    finally:
        relay.stop()


def test_a_release_answered_after_the_timeout_is_asked_again_and_counts_as_released(api, fleet, client_squids,
                                                                                    health_settings):
    healthy(fleet, client_squids, health_settings, count=3, max_leases=3)
    relay = SlowRelay(api.url, delay=2.0, count=1)  # the first release reaches the API 2 s late
    try:
        with Client(relay.url, api.token, wait=0, timeout=0.5) as client:
            lease = client.lease(target="late.example", ttl=60)
            done = lease.report("blocked")  # no TransportError: the retry's answer tells
            assert done.outcome == "blocked" and done.recorded
            assert relay.held == 1
            assert _active(api, lease.egress_ip) == ["late.example"]
    finally:
        relay.stop()
