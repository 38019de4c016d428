"""List+watch of every Proxy in the cluster, robust against expired and dead streams.

The loop follows the Kubernetes "list then watch" contract (API concepts, "Efficient
detection of changes"):

1. **List** all Proxies cluster-wide (paged) and hand each one to the callback as ``SYNC``.
   A Proxy seen before but absent from the new list is handed over as ``DELETED`` (its last
   known state), so a relist after a gap misses nothing, like client-go's informer
   ``Replace``.
2. **Watch** from the list's ``resourceVersion`` with ``allowWatchBookmarks``, a server-side
   ``timeoutSeconds`` (the server ends the stream, we resume) and a client-side read timeout
   (``_request_timeout``) so a stream the server stops answering cannot hang the process.
   The resourceVersion is taken from every event, BOOKMARKs included, so a resumed watch
   starts where the last one stopped.
3. **410 Gone** (the version fell out of the server's history): relist and start again.
   Any other failure: reconnect from the last resourceVersion after a capped exponential
   backoff with jitter.

The callback ``on_event(event_type, obj)`` gets ``"SYNC"``, ``"ADDED"``, ``"MODIFIED"`` or
``"DELETED"`` and the object as a dict.  An exception in it is logged with its traceback and
the stream carries on (the periodic resync heals a lost hand-off).  Logs carry event type,
namespace/name and resourceVersion only: never a spec (it can hold cloud-init user-data).
"""

from __future__ import annotations

import gc
import logging
import random
import threading
from dataclasses import dataclass
from typing import Any, Callable, cast

import urllib3
from kubernetes import client as k8s
from kubernetes import watch as k8s_watch

from watchers import metrics
from app.resources import GROUP, PLURAL, VERSION
from app.backoff import capped_exponential, equal_jitter

log = logging.getLogger(__name__)

OnEvent = Callable[[str, dict], None]

SYNC, ADDED, MODIFIED, DELETED, BOOKMARK = "SYNC", "ADDED", "MODIFIED", "DELETED", "BOOKMARK"


@dataclass(frozen=True)
class StreamSettings:
    """Timeouts and backoff of :class:`ProxyStream` (seconds).

    Attributes:
        server_timeout: ``timeoutSeconds`` sent with each watch; the server ends the stream
            after it and we resume from the last resourceVersion (integer, >= 1).
        read_timeout: client-side limit on silence from an open stream; must exceed the
            server's bookmark period (kube-apiserver sends one about every minute).
        connect_timeout: TCP connect limit for list and watch requests.
        list_timeout: read limit for one list page.
        page_size: ``limit`` of each list page.
        backoff_initial / backoff_max: reconnect delay grows from ``backoff_initial``,
            doubling per consecutive failure, capped at ``backoff_max``; each delay is
            jittered to 50-100 % of its value.
    """

    server_timeout: int = 300
    read_timeout: float = 90.0
    connect_timeout: float = 10.0
    list_timeout: float = 60.0
    page_size: int = 500
    backoff_initial: float = 0.5
    backoff_max: float = 30.0

    def __post_init__(self) -> None:
        if int(self.server_timeout) < 1:
            raise ValueError(f"server_timeout must be at least 1 second, got {self.server_timeout}")
        for name in ("read_timeout", "connect_timeout", "list_timeout", "backoff_initial", "backoff_max"):
            if getattr(self, name) <= 0:
                raise ValueError(f"{name} must be positive, got {getattr(self, name)}")
        if self.backoff_max < self.backoff_initial:
            raise ValueError("backoff_max must not be below backoff_initial")
        if self.page_size < 1:
            raise ValueError(f"page_size must be at least 1, got {self.page_size}")


def backoff_delay(attempt: int, settings: StreamSettings, rand: Callable[[], float] = random.random) -> float:
    """Delay before reconnect number ``attempt`` (0-based): capped exponential, 50-100 % jitter."""
    return equal_jitter(capped_exponential(attempt, settings.backoff_initial, settings.backoff_max), rand)


class ProxyStream:
    """The list+watch loop over every Proxy (see the module docstring).

    Args:
        api: a :class:`kubernetes.client.CustomObjectsApi`.
        on_event: the callback.
        settings: :class:`StreamSettings`.
        on_progress: called (no arguments) whenever the stream demonstrably works: a list
            completed, an event or bookmark arrived, a watch ended on its server timeout.
        plural: the resource of the group listed and watched (``proxies``; ``proxypools`` for
            the pool stream: the same loop, another callback).

    Attributes:
        resource_version: where the next watch starts (``None``: relist first).
    """

    def __init__(self, api: k8s.CustomObjectsApi, on_event: OnEvent, settings: StreamSettings | None = None,
                 *, on_progress: Callable[[], None] | None = None, plural: str = PLURAL) -> None:
        self.api = api
        self.plural = plural
        self.on_event = on_event
        self.settings = settings or StreamSettings()
        self.on_progress = on_progress or (lambda: None)
        self.resource_version: str | None = None
        self._known: dict[str, dict] = {}  # uid -> last object handed over
        self._watch: k8s_watch.Watch | None = None
        self._lock = threading.Lock()
        # Series of this resource exported (at 0) from the start, so rate() and absent() see
        # them before the first 410 or restart (docs/observability.md, "Watcher").
        metrics.WATCH_GONE.labels(self.plural)
        metrics.WATCH_RELISTS.labels(self.plural)
        for reason in ("ended", "gone", "error"):
            metrics.WATCH_RESTARTS.labels(self.plural, reason)

    # -- control ---------------------------------------------------------------------------
    def run(self, stop: threading.Event) -> None:
        """List and watch until ``stop`` is set; never raises for API or network errors.

        Call :meth:`interrupt` after setting ``stop`` to end a blocked read at once.
        """
        attempt = 0
        while not stop.is_set():
            try:
                if self.resource_version is None:
                    self._relist(stop)
                    if stop.is_set():
                        break
                progressed = self._watch_once(stop)
                if not stop.is_set():
                    metrics.WATCH_RESTARTS.labels(self.plural, "ended").inc()
                if progressed:
                    attempt = 0
                    continue
            except k8s.ApiException as exc:
                if exc.status == 410:
                    metrics.WATCH_GONE.labels(self.plural).inc()
                    metrics.WATCH_RESTARTS.labels(self.plural, "gone").inc()
                    log.info("watch resourceVersion %s expired (410 Gone); relisting", self.resource_version)
                    self.resource_version = None
                    if attempt == 0:
                        attempt = 1
                        continue  # relist at once the first time
                else:
                    metrics.WATCH_RESTARTS.labels(self.plural, "error").inc()
                    log.warning("%s list/watch failed: HTTP %s %s", self.plural, exc.status, exc.reason)
            except (urllib3.exceptions.HTTPError, OSError) as exc:
                if stop.is_set():
                    break
                metrics.WATCH_RESTARTS.labels(self.plural, "error").inc()
                log.warning("proxy watch connection failed (%s); reconnecting from resourceVersion %s",
                            _describe(exc), self.resource_version)
            except Exception:  # the stream must survive anything
                metrics.WATCH_RESTARTS.labels(self.plural, "error").inc()
                log.exception("proxy list/watch failed unexpectedly")
            if stop.is_set():
                break
            delay = backoff_delay(attempt, self.settings)
            attempt += 1
            log.debug("reconnecting in %.2fs (attempt %d)", delay, attempt)
            stop.wait(delay)

    def interrupt(self) -> None:
        """Close the open watch connection (if any) so a blocked :meth:`run` notices ``stop``."""
        with self._lock:
            w = self._watch
        if w is not None:
            w.stop()

    # -- list ------------------------------------------------------------------------------
    def _relist(self, stop: threading.Event) -> None:
        s = self.settings
        token: str | None = None
        list_rv: str | None = None
        seen: set[str] = set()
        count = 0
        while True:
            kwargs: dict[str, Any] = {"limit": s.page_size, "_request_timeout": (s.connect_timeout, s.list_timeout)}
            if token:
                kwargs["_continue"] = token
            page = cast(dict, self.api.list_cluster_custom_object(GROUP, VERSION, self.plural, **kwargs))
            meta = page.get("metadata") or {}
            if list_rv is None:
                list_rv = meta.get("resourceVersion")  # continued pages are consistent with the first
            for obj in page.get("items") or []:
                uid = (obj.get("metadata") or {}).get("uid")
                if uid:
                    seen.add(uid)
                    self._known[uid] = obj
                self._deliver(SYNC, obj)
                count += 1
            # The last-seen copies live until their Proxy changes: taken out of the cyclic
            # collector's sight page by page, its collections no longer walk the growing heap
            # (docs/performance.md, "Scale": 2.2-2.8 s -> 0.1 s of the list at 100,000).  Parsed
            # JSON holds no cycles, and a frozen copy replaced later is freed by its reference
            # count as before; only cyclic garbage pending at a freeze would stay (none in the bench).
            gc.freeze()
            token = meta.get("continue")
            if not token or stop.is_set():
                break
        if stop.is_set():
            return
        for uid in [u for u in self._known if u not in seen]:
            self._deliver(DELETED, self._known.pop(uid))
        self.resource_version = list_rv
        metrics.WATCH_RELISTS.labels(self.plural).inc()
        log.info("listed %d %s at resourceVersion %s", count, self.plural, list_rv)
        self.on_progress()

    # -- watch -----------------------------------------------------------------------------
    def _watch_once(self, stop: threading.Event) -> bool:
        """Run one watch request; return True when it made progress (events or a clean end)."""
        s = self.settings
        w = k8s_watch.Watch()
        with self._lock:
            self._watch = w
        progressed = False
        try:
            for ev in w.stream(self.api.list_cluster_custom_object, GROUP, VERSION, self.plural,
                               resource_version=self.resource_version, allow_watch_bookmarks=True,
                               timeout_seconds=int(s.server_timeout),
                               _request_timeout=(s.connect_timeout, s.read_timeout)):
                if stop.is_set():
                    break
                etype = ev.get("type")
                obj = ev.get("raw_object") or {}
                meta = obj.get("metadata") or {}
                rv = meta.get("resourceVersion")
                if etype == BOOKMARK:
                    metrics.WATCH_EVENTS.labels(self.plural, BOOKMARK).inc()
                    log.debug("bookmark resourceVersion %s", rv)
                elif etype in (ADDED, MODIFIED, DELETED):
                    uid = meta.get("uid")
                    if uid:
                        if etype == DELETED:
                            self._known.pop(uid, None)
                        else:
                            self._known[uid] = obj
                    self._deliver(etype, obj)
                else:
                    log.warning("ignoring watch event of unknown type %r", etype)
                if rv:
                    self.resource_version = rv
                progressed = True
                self.on_progress()
            else:
                if not stop.is_set():
                    # the server ended the stream (timeoutSeconds): healthy, resume
                    progressed = True
                    self.on_progress()
        finally:
            with self._lock:
                self._watch = None
        return progressed

    def _deliver(self, etype: str, obj: dict) -> None:
        metrics.WATCH_EVENTS.labels(self.plural, etype).inc()
        meta = obj.get("metadata") or {}
        log.debug("proxy %s %s/%s resourceVersion %s", etype, meta.get("namespace"), meta.get("name"),
                  meta.get("resourceVersion"))
        try:
            self.on_event(etype, obj)
        except Exception:  # one bad hand-off must not kill the stream
            log.exception("proxy event handler failed for %s %s/%s", etype, meta.get("namespace"),
                          meta.get("name"))


def _describe(exc: BaseException) -> str:
    """Exception class and message, without urllib3's long pool reprs."""
    text = str(exc)
    if len(text) > 200:
        text = text[:200] + "..."
    return f"{type(exc).__name__}: {text}"
