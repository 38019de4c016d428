"""Leader election on a ``coordination.k8s.io/v1`` Lease, with client-go's rules.

One watcher streams; standbys wait.  The algorithm is client-go's
``tools/leaderelection`` (``tryAcquireOrRenew``):

* A candidate reads the Lease.  Missing: it creates it naming itself (an AlreadyExists race
  is a lost round).  Held by someone else: the candidate may take it only once the record
  has not changed for ``leaseDurationSeconds`` *as measured on the candidate's own clock*
  since it last saw it change (no trust in other machines' clocks).  An empty holder (a
  released lease) may be taken at once.
* Taking or renewing is a PUT carrying the resourceVersion just read, so two candidates
  racing get one success and one 409 Conflict (a lost round, retried next period).
* The leader renews every ``retry_period``; if it cannot renew for ``renew_deadline`` it
  steps down (stops leading before the lease can expire for others, since
  ``renew_deadline < lease_duration``).
* On shutdown the leader releases: holder cleared, duration 1 s, so a standby takes over
  at once instead of waiting out the lease.

The kubernetes client ships ``kubernetes.leaderelection``, but its loop cannot be stopped,
never releases the lease and blocks its caller; this module keeps the same rules with a
stop event and a release.
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Callable

from kubernetes import client as k8s

from watchers import metrics

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ElectionSettings:
    """Timing of the election (seconds; client-go's defaults).

    Attributes:
        lease_duration: how long a standby waits after the record last changed before it
            takes over.
        renew_deadline: how long the leader keeps trying to renew before it steps down.
        retry_period: pause between attempts (and between renewals).
        request_timeout: limit on each Lease API call.
    """

    lease_duration: float = 15.0
    renew_deadline: float = 10.0
    retry_period: float = 2.0
    request_timeout: float = 5.0

    def __post_init__(self) -> None:
        if not 0 < self.retry_period < self.renew_deadline < self.lease_duration:
            raise ValueError("leader election needs 0 < retry_period < renew_deadline < lease_duration, got "
                             f"{self.retry_period} / {self.renew_deadline} / {self.lease_duration}")
        if self.lease_duration < 1:
            raise ValueError(f"lease_duration must be at least 1 second, got {self.lease_duration}")


def _now() -> datetime:
    return datetime.now(timezone.utc)


class LeaderElector:
    """Competes for one Lease (see the module docstring).

    Args:
        api: a :class:`kubernetes.client.CoordinationV1Api`.
        namespace / name: the Lease.
        identity: this candidate's holder identity (unique per process, e.g. the Pod name).
        settings: :class:`ElectionSettings`.
        clock: monotonic clock (seconds), injectable for tests.

    Attributes:
        last_contact: monotonic time of the last successful Lease API call (liveness).
    """

    def __init__(self, api: k8s.CoordinationV1Api, namespace: str, name: str, *, identity: str,
                 settings: ElectionSettings | None = None, clock: Callable[[], float] = time.monotonic) -> None:
        if not identity:
            raise ValueError("leader election needs a non-empty identity")
        self.api, self.namespace, self.name, self.identity = api, namespace, name, identity
        self.settings = settings or ElectionSettings()
        self.clock = clock
        self.last_contact: float | None = None
        self._leading = threading.Event()
        self._observed: tuple | None = None        # (holder, renewTime, acquireTime, transitions)
        self._observed_at = 0.0                    # local clock when _observed last changed
        self._last_renew = 0.0

    # -- state -----------------------------------------------------------------------------
    @property
    def is_leader(self) -> bool:
        """Whether this candidate currently holds the lease."""
        return self._leading.is_set()

    def wait_for_leadership(self, stop: threading.Event, poll: float = 0.2) -> bool:
        """Block until leading (True) or ``stop`` is set (False)."""
        while not stop.is_set():
            if self._leading.wait(poll):
                return True
        return False

    # -- loop ------------------------------------------------------------------------------
    def run(self, stop: threading.Event, *, release: bool = True) -> None:
        """Campaign, lead and renew until ``stop`` is set; then release if leading.

        Args:
            stop: ends the loop.
            release: give the lease up on the way out (client-go's ``ReleaseOnCancel``);
                ``False`` leaves it to expire, as a crashed leader would.
        Never raises for API errors (they are logged; a failed round is retried).
        """
        s = self.settings
        try:
            while not stop.is_set():
                ok = self._try_acquire_or_renew()
                now = self.clock()
                if ok:
                    self._last_renew = now
                    if not self._leading.is_set():
                        log.info("%s became leader of lease %s/%s", self.identity, self.namespace, self.name)
                        self._leading.set()
                        metrics.WATCHER_LEADER.set(1)
                elif self._leading.is_set() and now - self._last_renew >= s.renew_deadline:
                    log.warning("%s could not renew lease %s/%s for %.1fs; stepping down",
                                self.identity, self.namespace, self.name, now - self._last_renew)
                    self._leading.clear()
                    metrics.WATCHER_LEADER.set(0)
                stop.wait(s.retry_period)
        finally:
            if self._leading.is_set():
                self._leading.clear()
                metrics.WATCHER_LEADER.set(0)
                if release:
                    self.release()

    # -- one round -------------------------------------------------------------------------
    def _try_acquire_or_renew(self) -> bool:
        s = self.settings
        try:
            lease = self.api.read_namespaced_lease(self.name, self.namespace, _request_timeout=s.request_timeout)
        except k8s.ApiException as exc:
            if exc.status != 404:
                log.warning("reading lease %s/%s failed: HTTP %s %s", self.namespace, self.name, exc.status, exc.reason)
                return False
            return self._create()
        except Exception as exc:  # noqa: BLE001 - network errors are a failed round
            log.warning("reading lease %s/%s failed: %s", self.namespace, self.name, type(exc).__name__)
            return False
        self.last_contact = self.clock()
        spec = lease.spec or k8s.V1LeaseSpec()
        record = (spec.holder_identity, spec.renew_time, spec.acquire_time, spec.lease_transitions)
        now = self.clock()
        if record != self._observed:
            self._observed, self._observed_at = record, now
        holder = spec.holder_identity or ""
        duration = spec.lease_duration_seconds or s.lease_duration
        if holder and holder != self.identity:
            if self._leading.is_set():
                log.warning("%s lost lease %s/%s to %s", self.identity, self.namespace, self.name, holder)
                self._leading.clear()
                metrics.WATCHER_LEADER.set(0)
            if now - self._observed_at < duration:
                return False  # held and not expired (by our clock)
            log.info("lease %s/%s held by %s expired; taking over", self.namespace, self.name, holder)
        transitions = spec.lease_transitions or 0
        if holder == self.identity and spec.acquire_time is not None:
            acquire = spec.acquire_time
        else:
            acquire = _now()
            transitions += 1 if holder else 0
        lease.spec = k8s.V1LeaseSpec(holder_identity=self.identity, lease_duration_seconds=int(round(s.lease_duration)),
                                     acquire_time=acquire, renew_time=_now(), lease_transitions=transitions)
        return self._write("updating", lambda: self.api.replace_namespaced_lease(
            self.name, self.namespace, lease, _request_timeout=s.request_timeout))

    def _create(self) -> bool:
        s = self.settings
        now = _now()
        body = k8s.V1Lease(metadata=k8s.V1ObjectMeta(name=self.name, namespace=self.namespace),
                           spec=k8s.V1LeaseSpec(holder_identity=self.identity,
                                                lease_duration_seconds=int(round(s.lease_duration)),
                                                acquire_time=now, renew_time=now, lease_transitions=0))
        return self._write("creating", lambda: self.api.create_namespaced_lease(
            self.namespace, body, _request_timeout=s.request_timeout))

    def _write(self, what: str, call: Callable[[], k8s.V1Lease]) -> bool:
        """Make one write of the Lease and remember what the API returned.

        Args:
            what: ``"updating"`` or ``"creating"``, for the log.
            call: the write.
        Returns:
            whether it went through; 409 (another writer was first) and any failure wait for
            the next round.
        """
        try:
            lease = call()
        except k8s.ApiException as exc:
            if exc.status == 409:
                log.debug("lease %s/%s changed under us (409); next round", self.namespace, self.name)
            else:
                log.warning("%s lease %s/%s failed: HTTP %s %s", what, self.namespace, self.name, exc.status,
                            exc.reason)
            return False
        except Exception as exc:  # noqa: BLE001 - a failed round is retried by the next one
            log.warning("%s lease %s/%s failed: %s", what, self.namespace, self.name, type(exc).__name__)
            return False
        self._remember(lease)
        return True

    def _remember(self, lease: k8s.V1Lease) -> None:
        self.last_contact = self.clock()
        spec = lease.spec
        # Every Lease this candidate writes or takes over carries a spec.
        self._observed = (spec.holder_identity, spec.renew_time,  # type: ignore[union-attr]
                          spec.acquire_time, spec.lease_transitions)  # type: ignore[union-attr]
        self._observed_at = self.clock()

    # -- release ---------------------------------------------------------------------------
    def release(self) -> bool:
        """Give the lease up if we hold it (holder cleared, duration 1 s); return whether it did.

        Safe to call when not leading: a lease held by someone else is left alone.
        """
        s = self.settings
        try:
            lease = self.api.read_namespaced_lease(self.name, self.namespace, _request_timeout=s.request_timeout)
            if not lease.spec or lease.spec.holder_identity != self.identity:
                return False
            now = _now()
            lease.spec = k8s.V1LeaseSpec(holder_identity=None, lease_duration_seconds=1, acquire_time=now,
                                         renew_time=now, lease_transitions=lease.spec.lease_transitions)
            self.api.replace_namespaced_lease(self.name, self.namespace, lease, _request_timeout=s.request_timeout)
        except Exception as exc:  # noqa: BLE001 - best effort: the lease expires anyway
            log.warning("releasing lease %s/%s failed (%s); it will expire", self.namespace, self.name,
                        type(exc).__name__)
            return False
        log.info("%s released lease %s/%s", self.identity, self.namespace, self.name)
        return True
