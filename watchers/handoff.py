"""Handing Proxy events to the dispatcher without ever dropping one.

The watcher's callback (``watchers.events``, :meth:`app.dispatch.proxies.Dispatcher.on_event`) needs Redis:
it de-duplicates and queues tasks there.  While Redis is unreachable (a restart, an outage) it raises, and an event it
raised on must not be lost until the next resync.  :class:`Handoff` sits between the stream
and the callback:

* the stream hands over with :meth:`Handoff.submit`, which never blocks and never raises, so
  the watch keeps reading (and the liveness check keeps seeing progress) whatever the
  callback does;
* one thread (:meth:`Handoff.run`) calls the callback, in arrival order;
* an event the callback raised on stays at the head of the queue and is retried after a
  capped exponential backoff with jitter (:func:`watchers.stream.backoff_delay`: 0.5 s
  doubling to ``backoff_max``) until it goes through; nothing behind it overtakes it;
* events queue at most one entry per Proxy: a newer event for a Proxy still waiting replaces
  the waiting one's object, and the entry becomes ``SYNC`` (dispatch whatever the object
  needs now), so a change hidden behind one of our own writes is never skipped and a long
  outage costs memory per Proxy, not per event.

Logs carry the event type, namespace/name and the exception class and message only.
"""

from __future__ import annotations

import collections
import itertools
import logging
import threading
import time
from typing import Callable

from app.errors import brief
from app.resources import PLURAL
from watchers import metrics
from watchers.stream import DELETED, SYNC, OnEvent, StreamSettings, backoff_delay

log = logging.getLogger(__name__)


class _Item:
    __slots__ = ("etype", "obj", "attempts", "first_failure", "arrived")

    def __init__(self, etype: str, obj: dict, arrived: float) -> None:
        self.etype, self.obj = etype, obj
        self.attempts = 0
        self.first_failure: float | None = None
        self.arrived = arrived  # monotonic; the oldest event the entry stands for


class Handoff:
    """A FIFO of Proxy events, one entry per Proxy, delivered by one thread with retries.

    Args:
        on_event: the callback ``on_event(event_type, obj)``; any exception it raises means
            "not handled, try again".
        settings: backoff bounds (``backoff_initial``, ``backoff_max``) of
            :class:`watchers.stream.StreamSettings`.
        clock: monotonic clock, injectable for tests.
        resource: the plural whose events this hand-off carries (``proxies``, ``proxypools``):
            the ``resource`` label of its metrics.
    """

    def __init__(self, on_event: OnEvent, settings: StreamSettings | None = None, *,
                 clock: Callable[[], float] = time.monotonic, resource: str = PLURAL) -> None:
        self.on_event = on_event
        self.resource = resource
        self._backlog_gauge = metrics.HANDOFF_BACKLOG.labels(resource)
        self._backlog_gauge.set(0)
        self._latency = metrics.EVENT_TO_ENQUEUE.labels(resource)
        self.settings = settings or StreamSettings()
        self.clock = clock
        self._queue: collections.OrderedDict[str, _Item] = collections.OrderedDict()
        self._cond = threading.Condition()
        self._keyless = itertools.count()
        self._in_flight: str | None = None
        self._superseded: _Item | None = None  # newer event for the in-flight Proxy
        self._runner = threading.Lock()  # one deliverer at a time

    # -- producer side (the stream) --------------------------------------------------------
    def submit(self, etype: str, obj: dict) -> None:
        """Queue one event (never blocks, never raises)."""
        uid = (obj.get("metadata") or {}).get("uid") or f"no-uid-{next(self._keyless)}"
        with self._cond:
            if uid == self._in_flight:
                # being delivered right now: keep the newest object for after that attempt
                self._superseded = _merge(self._superseded, etype, obj, self.clock())
            elif uid in self._queue:
                item = self._queue[uid]
                item.etype, item.obj = _merged_type(item.etype, etype), obj
            else:
                self._queue[uid] = _Item(etype, obj, self.clock())
            self._backlog_gauge.set(len(self._queue) + (1 if self._in_flight is not None else 0))
            self._cond.notify()

    def backlog(self) -> int:
        """Events waiting (the one being delivered included)."""
        with self._cond:
            return len(self._queue) + (1 if self._in_flight is not None else 0)

    def failing_for(self) -> float:
        """Seconds the event at the head has been failing (0 when nothing fails)."""
        with self._cond:
            head = next(iter(self._queue.values()), None)
            if head is None or head.first_failure is None:
                return 0.0
            return self.clock() - head.first_failure

    # -- consumer side ---------------------------------------------------------------------
    def run(self, stop: threading.Event) -> None:
        """Deliver events until ``stop`` is set; events still queued then wait for the next run.

        Only one ``run`` delivers at a time: a second one waits for the first to return.
        Never raises for callback errors.
        """
        while not self._runner.acquire(timeout=0.2):
            if stop.is_set():
                return
        try:
            self._run(stop)
        finally:
            self._runner.release()

    def _run(self, stop: threading.Event) -> None:
        while not stop.is_set():
            with self._cond:
                if not self._queue:
                    self._cond.wait(0.2)
                    continue
                uid, item = self._queue.popitem(last=False)
                self._in_flight, self._superseded = uid, None
            ok = self._deliver(item)
            if ok:
                self._latency.observe(max(0.0, self.clock() - item.arrived))
            with self._cond:
                newer, self._in_flight, self._superseded = self._superseded, None, None
                if ok:
                    if newer is not None:  # arrived during the attempt: next in line as usual
                        self._queue[uid] = newer
                else:
                    if newer is not None:  # one entry for both, standing for whatever they meant
                        item.etype, item.obj = _merged_type(item.etype, newer.etype), newer.obj
                    self._queue[uid] = item
                    self._queue.move_to_end(uid, last=False)  # stays at the head
                self._backlog_gauge.set(len(self._queue))
            if not ok:
                stop.wait(backoff_delay(item.attempts - 1, self.settings))

    def _deliver(self, item: _Item) -> bool:
        meta = item.obj.get("metadata") or {}
        what = f"{item.etype} {meta.get('namespace')}/{meta.get('name')}"
        try:
            self.on_event(item.etype, item.obj)
        except Exception as exc:  # noqa: BLE001 - classified below
            if not _retryable(exc):
                # A fault of the event or of our code, not of Redis: retrying it would hold every
                # later event behind it forever.  Drop it; the periodic resync re-decides the Proxy.
                log.error("proxy event %s dropped after an error that retrying cannot fix (%s); the "
                          "resync will look at this Proxy again", what, brief(exc))
                return True
            item.attempts += 1
            if item.first_failure is None:
                item.first_failure = self.clock()
            if item.attempts == 1 or item.attempts % 10 == 0:
                log.warning("proxy event hand-off failed for %s (attempt %d: %s); retrying with backoff, "
                            "%d more event(s) waiting", what, item.attempts, brief(exc), len(self._queue))
            else:
                log.debug("proxy event hand-off failed for %s (attempt %d: %s)", what, item.attempts,
                          brief(exc))
            return False
        if item.attempts:
            log.info("proxy event %s handed off after %d failed attempt(s) over %.1fs", what, item.attempts,
                     self.clock() - (item.first_failure or self.clock()))
        return True


def _retryable(exc: BaseException) -> bool:
    """Whether a hand-off failure is an outage worth retrying: Redis, the broker, the network."""
    import kombu.exceptions
    import redis

    return isinstance(exc, (redis.RedisError, kombu.exceptions.OperationalError, OSError, TimeoutError))


def _merged_type(older: str, newer: str) -> str:
    """The type of one entry standing for two events of the same Proxy: ``SYNC`` (decide on
    the newest object whatever the events were), or ``DELETED`` when the Proxy is gone."""
    return newer if newer == DELETED else SYNC


def _merge(item: _Item | None, etype: str, obj: dict, arrived: float) -> _Item:
    """``item`` updated with a newer event of its Proxy (a new entry when there is none)."""
    if item is None:
        return _Item(etype, obj, arrived)
    item.etype, item.obj = _merged_type(item.etype, etype), obj
    return item


__all__ = ["Handoff"]
