"""The watcher process: leader election, the Proxy stream while leading, and liveness.

:func:`run` is what ``proxy-operator watch`` calls.  One process in a Deployment of several
leads (a ``coordination.k8s.io/v1`` Lease, :mod:`watchers.leader`) and streams Proxy events
(:mod:`watchers.stream`) into the callback, and ProxyPool events into their own; the others stand
by and take over when the leader's lease expires or is released.  Losing the lease stops the stream at once.

Timing comes from the environment (all seconds; defaults in parentheses):
``WATCH_TIMEOUT`` (300, server-side watch timeout), ``WATCH_READ_TIMEOUT`` (90, client-side
read timeout), ``WATCH_BACKOFF_MAX`` (30), ``LEASE_DURATION`` (15),
``LEASE_RENEW_DEADLINE`` (10), ``LEASE_RETRY_PERIOD`` (2) and ``WATCHER_LIVENESS_WINDOW``
(read timeout + backoff max + 30): how long a leader's stream may go without progress, or
a standby without reaching the Lease, before ``/healthz`` answers 503.

Events go from the stream to the callback through a :class:`watchers.handoff.Handoff`: the
stream never waits for the callback, and an event the callback fails on (Redis unreachable)
is retried with capped exponential backoff until it goes through, never dropped.  Only the
leader delivers; events still waiting when leadership is lost are delivered if it comes back
(the new leader relists anyway).  A failing hand-off does not fail ``/healthz`` (restarting
the watcher would not bring Redis back); ``/healthz`` names it in its reason.

Metrics (:mod:`watchers.metrics`; served by ``proxy-operator watch --metrics-bind``): events by
type, watch restarts, 410s, relists, leader status, event-to-enqueue latency, hand-off backlog.
"""

from __future__ import annotations

import logging
import os
import signal
import threading
from dataclasses import dataclass, field
from typing import Callable, Mapping

from kubernetes import client as k8s

from app.kube import gateway as kube
from app.config.settings import env_number
from watchers.handoff import Handoff
from watchers.liveness import Progress, serve
from watchers.leader import ElectionSettings, LeaderElector
from watchers.stream import OnEvent, ProxyStream, StreamSettings
from app.resources import POOL_PLURAL

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class WatcherSettings:
    """Everything timing-related in the watcher.

    Attributes:
        stream: :class:`watchers.stream.StreamSettings`.
        election: :class:`watchers.leader.ElectionSettings`.
        liveness_window: seconds without progress before ``/healthz`` fails (``None``:
            ``stream.read_timeout + stream.backoff_max + 30``).
    """

    stream: StreamSettings = field(default_factory=StreamSettings)
    election: ElectionSettings = field(default_factory=ElectionSettings)
    liveness_window: float | None = None

    @property
    def window(self) -> float:
        """The effective liveness window, seconds."""
        if self.liveness_window is not None:
            return self.liveness_window
        return self.stream.read_timeout + self.stream.backoff_max + 30

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> "WatcherSettings":
        """Read the settings from the environment (names in the module docstring).

        Raises:
            ValueError: a value is not a number (or negative: :func:`app.config.settings.env_number`)
                or the combination is invalid; the message names the variable or the rule.
        """
        environ: Mapping[str, str] = os.environ if env is None else env

        def num(name: str, default):
            value = env_number(name, default, env=environ)
            return type(default)(value) if isinstance(default, int) else value

        sd, ed = StreamSettings(), ElectionSettings()
        stream = StreamSettings(server_timeout=num("WATCH_TIMEOUT", sd.server_timeout),
                                read_timeout=num("WATCH_READ_TIMEOUT", sd.read_timeout),
                                backoff_max=num("WATCH_BACKOFF_MAX", sd.backoff_max),
                                backoff_initial=min(sd.backoff_initial, num("WATCH_BACKOFF_MAX", sd.backoff_max)))
        election = ElectionSettings(lease_duration=num("LEASE_DURATION", ed.lease_duration),
                                    renew_deadline=num("LEASE_RENEW_DEADLINE", ed.renew_deadline),
                                    retry_period=num("LEASE_RETRY_PERIOD", ed.retry_period))
        window = environ.get("WATCHER_LIVENESS_WINDOW")
        return cls(stream=stream, election=election,
                   liveness_window=num("WATCHER_LIVENESS_WINDOW", 0.0) if window else None)


def run(on_event: OnEvent, *, lease_namespace: str, lease_name: str = "proxy-operator-watcher", identity: str,
        health_bind: str | None = None, stop: threading.Event | None = None,
        settings: WatcherSettings | None = None, api_client: k8s.ApiClient | None = None,
        while_leading: Callable[[threading.Event], None] | None = None,
        on_pool_event: OnEvent | None = None) -> None:
    """Run the watcher until ``stop`` is set (or SIGTERM/SIGINT when no ``stop`` is given).

    Args:
        on_event: ``on_event(event_type, obj)`` with ``"SYNC"``, ``"ADDED"``, ``"MODIFIED"``
            or ``"DELETED"`` and the Proxy as a dict; called from one thread, in order.
        lease_namespace / lease_name: the Lease that elects the leader.
        identity: this process's holder identity (unique, e.g. the Pod name).
        health_bind: ``"host:port"`` for ``/healthz``, or ``None`` for no endpoint.
        stop: an event that ends the watcher; ``None`` installs SIGTERM/SIGINT handlers
            (main thread only) that set an internal one.
        settings: :class:`WatcherSettings` (default: :meth:`WatcherSettings.from_env`).
        api_client: client to use (default: :func:`app.kube.gateway.api_client`, i.e. KUBECONFIG
            or in-cluster).
        while_leading: ``while_leading(term)`` runs in a thread of its own for each term of
            leadership and must return once ``term`` is set (the provider-health stale sweep,
            :class:`app.providers.checks.StaleSweeper`); an exception in it is logged.
        on_pool_event: like ``on_event`` for ProxyPool objects: while leading, a second
            list+watch (the same loop, :class:`watchers.stream.ProxyStream` on ``proxypools``)
            with its own hand-off delivers them (:func:`watchers.events.make_on_pool_event`).
            ``None``: no pool stream.  Liveness follows the Proxy stream only.

    On the way out the stream stops first, then the lease is released, so a standby takes
    over at once and two leaders never stream together.
    Raises:
        ValueError: bad settings or ``health_bind``.
    """
    settings = settings or WatcherSettings.from_env()
    stop = stop if stop is not None else _signal_stop()
    client = api_client or kube.api_client()
    elector = LeaderElector(k8s.CoordinationV1Api(client), lease_namespace, lease_name, identity=identity,
                            settings=settings.election)
    progress = Progress()
    handoff = Handoff(on_event, settings.stream)
    stream = ProxyStream(k8s.CustomObjectsApi(client), handoff.submit, settings.stream, on_progress=progress.mark)
    if on_pool_event is not None:
        pool_handoff = Handoff(on_pool_event, settings.stream, resource=POOL_PLURAL)
        pool_stream = ProxyStream(k8s.CustomObjectsApi(client), pool_handoff.submit, settings.stream,
                                  plural=POOL_PLURAL)
        while_leading = _with_pool_stream(pool_stream, pool_handoff, while_leading)
    elector_stop = threading.Event()
    elector_thread = threading.Thread(target=elector.run, args=(elector_stop,), name="leader-election", daemon=True)
    window = settings.window

    def check() -> tuple[bool, str]:
        if not elector_thread.is_alive() and not stop.is_set():
            return False, "leader election stopped"
        if elector.is_leader:
            age = progress.age()
            if age > window:
                return False, f"leader, but the Proxy stream made no progress for {age:.0f}s"
            failing = handoff.failing_for()
            if failing > 0:
                return True, (f"leader, streaming; event hand-off failing for {failing:.0f}s, "
                              f"{handoff.backlog()} event(s) waiting")
            return True, "leader, streaming"
        if elector.last_contact is None:
            age = progress.age()  # since start
        else:
            age = elector.clock() - elector.last_contact
        if age > window:
            return False, f"standby, but no contact with the Lease API for {age:.0f}s"
        return True, "standby"

    server = serve(health_bind, check) if health_bind else None
    log.info("watcher %s starting; lease %s/%s", identity, lease_namespace, lease_name)
    elector_thread.start()
    try:
        while elector.wait_for_leadership(stop):
            log.info("leading: streaming Proxy events")
            progress.mark()
            _stream_while_leading(stream, handoff, elector, stop, while_leading)
            if not stop.is_set():
                log.warning("leadership lost: Proxy stream stopped; standing by")
    finally:
        stop.set()
        stream.interrupt()
        elector_stop.set()
        elector_thread.join(timeout=settings.election.request_timeout * 2 + 1)
        if server is not None:
            server.shutdown()
            server.server_close()
        log.info("watcher %s stopped", identity)


def _stream_while_leading(stream: ProxyStream, handoff: Handoff, elector: LeaderElector,
                          stop: threading.Event,
                          while_leading: Callable[[threading.Event], None] | None = None) -> None:
    """Run the stream and the hand-off (and ``while_leading``) in threads until ``stop`` or loss
    of leadership; return when the stream and the hand-off have ended."""
    term = threading.Event()
    worker = threading.Thread(target=stream.run, args=(term,), name="proxy-stream", daemon=True)
    deliverer = threading.Thread(target=handoff.run, args=(term,), name="proxy-handoff", daemon=True)
    worker.start()
    deliverer.start()
    if while_leading is not None:
        def extra() -> None:
            try:
                while_leading(term)
            except Exception:  # never take the stream down with it
                log.exception("background work of the leader failed")
        threading.Thread(target=extra, name="leader-background", daemon=True).start()
    while worker.is_alive():
        if not term.is_set() and (stop.is_set() or not elector.is_leader):
            term.set()
        if term.is_set():
            stream.interrupt()  # repeated: a watch opened just after the first interrupt ends too
        worker.join(0.1)
    term.set()
    # An attempt in progress finishes first; should it hang, a later term's hand-off thread
    # waits for it (Handoff.run admits one deliverer at a time).
    deliverer.join(timeout=30)


def _with_pool_stream(stream: ProxyStream, handoff: Handoff,
                      also: Callable[[threading.Event], None] | None) -> Callable[[threading.Event], None]:
    """A ``while_leading(term)`` that runs the ProxyPool stream and its hand-off until ``term`` is
    set (interrupting the open watch then), and ``also(term)`` beside them."""
    def work(term: threading.Event) -> None:
        if also is not None:
            def other() -> None:
                try:
                    also(term)
                except Exception:  # never take the pool stream down with it
                    log.exception("background work of the leader failed")
            threading.Thread(target=other, name="leader-background-2", daemon=True).start()
        worker = threading.Thread(target=stream.run, args=(term,), name="pool-stream", daemon=True)
        deliverer = threading.Thread(target=handoff.run, args=(term,), name="pool-handoff", daemon=True)
        worker.start()
        deliverer.start()
        while worker.is_alive():
            if term.is_set():
                stream.interrupt()  # repeated: a watch opened just after the first interrupt ends too
            worker.join(0.1)
        deliverer.join(timeout=30)

    return work


def _signal_stop() -> threading.Event:
    """An event set by SIGTERM/SIGINT (handlers installed only from the main thread)."""
    stop = threading.Event()
    if threading.current_thread() is threading.main_thread():
        def handler(signum, frame):
            log.info("signal %d: stopping", signum)
            stop.set()
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, handler)
    return stop


__all__ = ["WatcherSettings", "run"]
