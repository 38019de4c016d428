"""Leader election on a coordination.k8s.io/v1 Lease, against the API fake."""

from __future__ import annotations

import threading
import time

import pytest
from kubernetes import client as k8s

from devcluster.apiserver import FakeKube
from tests.support.waiting import wait_until
from watchers.leader import ElectionSettings, LeaderElector

pytestmark = pytest.mark.timeout(60)

FAST = ElectionSettings(lease_duration=1.5, renew_deadline=1.0, retry_period=0.1, request_timeout=2.0)
NS, NAME = "proxy-operator", "proxy-operator-watcher"


class Candidate:
    """A LeaderElector running in its own thread with its own client."""

    def __init__(self, fake: FakeKube, identity: str, settings: ElectionSettings = FAST) -> None:
        self.client = fake.api_client()
        self.elector = LeaderElector(k8s.CoordinationV1Api(self.client), NS, NAME, identity=identity, settings=settings)
        self.stop = threading.Event()
        self.thread: threading.Thread | None = None

    def start(self, release: bool = True) -> "Candidate":
        self.thread = threading.Thread(target=self.elector.run, args=(self.stop,), kwargs={"release": release},
                                       daemon=True)
        self.thread.start()
        return self

    def halt(self) -> None:
        self.stop.set()
        if self.thread is not None:
            self.thread.join(timeout=5)
        self.client.close()


def holder(fake: FakeKube) -> dict:
    return (fake.store.find("leases", NS, NAME) or {}).get("spec") or {}


def test_first_candidate_creates_the_lease_and_leads(fake):
    a = Candidate(fake, "a").start()
    try:
        wait_until(lambda: a.elector.is_leader, 3, "a leads")
        spec = holder(fake)
        assert spec["holderIdentity"] == "a" and spec["leaseDurationSeconds"] == 2
        assert spec["leaseTransitions"] == 0 and spec["acquireTime"] and spec["renewTime"]
        first_renew = spec["renewTime"]
        wait_until(lambda: holder(fake)["renewTime"] != first_renew, 2, "a renews")
        assert holder(fake)["acquireTime"] == spec["acquireTime"]
    finally:
        a.halt()


def test_standby_takes_over_only_after_the_leader_stops_renewing(fake):
    a = Candidate(fake, "a").start(release=False)
    b = None
    try:
        wait_until(lambda: a.elector.is_leader, 3, "a leads")
        b = Candidate(fake, "b").start()
        time.sleep(2 * FAST.lease_duration)  # a keeps renewing: b must wait
        assert a.elector.is_leader and not b.elector.is_leader
        a.halt()  # a "crashes": no release, the lease just stops being renewed
        waited = wait_until(lambda: b.elector.is_leader, 5, "b takes over")
        assert waited >= FAST.lease_duration - 0.5, "b must wait for the lease to expire"
        spec = holder(fake)
        assert spec["holderIdentity"] == "b" and spec["leaseTransitions"] == 1
    finally:
        a.halt()
        if b:
            b.halt()


def test_release_on_shutdown_hands_over_at_once(fake):
    a = Candidate(fake, "a").start()
    b = None
    try:
        wait_until(lambda: a.elector.is_leader, 3, "a leads")
        b = Candidate(fake, "b").start()
        time.sleep(0.3)
        a.halt()
        assert not holder(fake).get("holderIdentity") or holder(fake)["holderIdentity"] == "b"
        waited = wait_until(lambda: b.elector.is_leader, 3, "b takes over")
        assert waited < FAST.lease_duration - 0.5, "a released lease is taken without waiting it out"
    finally:
        if b:
            b.halt()


def test_never_two_leaders(fake):
    cands = [Candidate(fake, f"c{i}").start() for i in range(3)]
    try:
        deadline = time.monotonic() + 3
        leaders_seen = set()
        while time.monotonic() < deadline:
            leaders = [c.elector.identity for c in cands if c.elector.is_leader]
            assert len(leaders) <= 1, leaders
            leaders_seen.update(leaders)
            time.sleep(0.01)
        assert len(leaders_seen) == 1
        assert fake.request_count("update", "leases") > 0
    finally:
        for c in cands:
            c.halt()


def test_a_lease_held_by_another_is_not_taken(fake):
    a = Candidate(fake, "a")
    coord = k8s.CoordinationV1Api(a.client)
    # b wrote the lease a moment ago: a must not overwrite it
    coord.create_namespaced_lease(NS, {"metadata": {"name": NAME}, "spec": {
        "holderIdentity": "b", "leaseDurationSeconds": 30, "renewTime": "2024-01-01T00:00:00.000000Z"}})
    assert a.elector._try_acquire_or_renew() is False and not a.elector.is_leader
    assert holder(fake)["holderIdentity"] == "b"
    a.client.close()


def test_leader_steps_down_when_it_cannot_renew_and_comes_back(fake):
    a = Candidate(fake, "a").start()
    try:
        wait_until(lambda: a.elector.is_leader, 3, "a leads")
        fake.fail_next(resource="leases", code=500, times=10_000)
        waited = wait_until(lambda: not a.elector.is_leader, 3, "a steps down")
        assert FAST.renew_deadline - 0.3 <= waited
        fake.clear_faults()
        wait_until(lambda: a.elector.is_leader, 3, "a leads again")
    finally:
        a.halt()


def test_a_leader_that_sees_another_holder_steps_down(fake):
    a = Candidate(fake, "a").start(release=False)
    try:
        wait_until(lambda: a.elector.is_leader, 3, "a leads")
        coord = k8s.CoordinationV1Api(a.client)
        lease = coord.read_namespaced_lease(NAME, NS)
        lease.spec.holder_identity = "intruder"
        coord.replace_namespaced_lease(NAME, NS, lease)
        wait_until(lambda: not a.elector.is_leader, 2, "a notices")
        # the intruder never renews: a takes the lease back once it expires
        wait_until(lambda: a.elector.is_leader, 5, "a takes it back")
        assert holder(fake)["holderIdentity"] == "a"
    finally:
        a.halt()


def test_settings_must_be_ordered():
    with pytest.raises(ValueError, match="retry_period < renew_deadline < lease_duration"):
        ElectionSettings(lease_duration=5, renew_deadline=10, retry_period=2)


class RacingCoordinationApi(k8s.CoordinationV1Api):
    """The real client, with candidate "b" taking the lease between our read and our write."""

    def read_namespaced_lease(self, name, namespace, **kwargs):
        lease = super().read_namespaced_lease(name, namespace, **kwargs)
        theirs = super().read_namespaced_lease(name, namespace)
        theirs.spec.holder_identity = "b"
        theirs.spec.lease_duration_seconds = 30
        super().replace_namespaced_lease(name, namespace, theirs)
        return lease


def test_losing_a_race_for_a_free_lease_is_a_409_and_a_lost_round(fake):
    client = fake.api_client()
    try:
        coord = k8s.CoordinationV1Api(client)
        coord.create_namespaced_lease(NS, {"metadata": {"name": NAME}, "spec": {"leaseDurationSeconds": 1}})
        a = LeaderElector(RacingCoordinationApi(client), NS, NAME, identity="a", settings=FAST)
        before = fake.request_count("update", "leases")
        assert a._try_acquire_or_renew() is False
        assert not a.is_leader
        assert fake.request_count("update", "leases") == before + 2  # b's write, then a's rejected one
        assert holder(fake)["holderIdentity"] == "b"
    finally:
        client.close()
