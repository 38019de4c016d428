"""Telling an outage of the health origin from failing proxies: a direct control request.

Every probe fetches ``healthCheck.url`` *through* a proxy.  When that fails, either the proxy
is broken or the URL's origin is down, and in the second case every proxy fails and none of
them is at fault.  Waiting for the whole fleet to fail before calling it an outage does not
work when probes run in small batches with a low ``failureThreshold``: the first batches are
marked Unhealthy before the outage is recognised (decision 19).  So before a failure may
count against any proxy, the engine asks the origin itself, from the worker, through no proxy
(:func:`control`): ``GET`` of the same URL, expecting the same status.

* The origin answers as expected: the failures are the proxies' own, judged as usual.
* The origin does not (refused, timeout, reset, TLS failure, another status): it is down, and
  the proxies whose probes of that URL failed keep their state: no threshold advances, no
  status is written, nothing is withdrawn, while the origin stays down.
* Inconclusive (the URL's host does not resolve here or is in a denied range, see
  :mod:`app.probes.destinations`; or the worker has never reached this origin directly, e.g.
  its egress is restricted): the failures are judged as usual, since nothing tells them apart.

A control result is shared in Redis (:func:`app.store.keys.health_origin`) and reused
for failures of probes that started before it did, so a batch asks once per URL, and batches
running together ask once between them.  The hash also remembers when the origin last answered
a control request (``okAt``); batches in which probes of a URL succeed refresh that every
:data:`REFRESH_SECONDS`, so "down" is only believed of an origin this worker can reach.

Logs and metrics name the origin as ``scheme://host:port`` only (never its path or query,
which may carry a token).
"""

from __future__ import annotations

import hashlib
import logging
import threading
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING
from urllib.parse import urlsplit

import urllib3

from app.store import keys as redis_keys
from app.probes import probe as p

if TYPE_CHECKING:
    from app.probes.destinations import DestinationPolicy

log = logging.getLogger(__name__)

UP, DOWN, UNKNOWN = "up", "down", "unknown"
#: How often a URL whose probes succeed is checked directly to learn the worker reaches it.
REFRESH_SECONDS = 600.0
#: Longest a control request may take, seconds (the probe's timeout when shorter).
MAX_CONTROL_TIMEOUT = 10.0
_KEY_TTL = 7 * 24 * 3600


@dataclass(frozen=True)
class ControlResult:
    """The outcome of one control request.

    Attributes:
        state: ``"up"`` (answered the expected status, or 429), ``"down"`` or ``"unknown"``.
        reason: a probe reason (:mod:`app.probes.probe`) or ``"ProbeSucceeded"``.
        message: one line naming the origin (scheme, host, port) only.
        started: epoch seconds the request started.
    """

    state: str
    reason: str
    message: str
    started: float


def origin_of(url: str) -> str:
    """``scheme://host:port`` of ``url`` (what logs may show of a health URL)."""
    try:
        parts = urlsplit(url)
        port = parts.port or (443 if parts.scheme == "https" else 80)
        return f"{parts.scheme}://{parts.hostname}:{port}"
    except ValueError:
        return "<malformed URL>"


def control(url: str, expected_status: int, timeout: float, *, policy: "DestinationPolicy",
            ca_bundle: str | None = None, clock=time.time) -> ControlResult:
    """``GET url`` from this process, through no proxy; never raises.

    The host is resolved and checked against ``policy`` like a probe endpoint
    (:meth:`DestinationPolicy.endpoint_address`) and the connection goes to the checked
    address, with the URL's host in ``Host`` (and as TLS server name for https).

    Args:
        url: the health URL.
        expected_status: ``healthCheck.expectedStatus``.
        timeout: seconds for the whole request (capped at :data:`MAX_CONTROL_TIMEOUT`).
        policy: the destination policy.
        ca_bundle: CA file for https (``None``: the system store).
        clock: epoch-seconds clock.
    Returns:
        a :class:`ControlResult`: ``up`` when it answered ``expected_status`` (or 429: the
        origin is there, it rate-limits), ``down`` on any other answer or failure,
        ``unknown`` when the host is denied or does not resolve here.
    """
    from app.probes.destinations import DestinationDenied

    started = clock()
    where = origin_of(url)
    try:
        parts = urlsplit(url)
        host = parts.hostname or ""
        port = parts.port or (443 if parts.scheme == "https" else 80)
        address = policy.endpoint_address(host, port)
    except DestinationDenied as exc:
        return ControlResult(UNKNOWN, p.DESTINATION_DENIED, f"health origin {where} not asked: {exc}", started)
    except (OSError, ValueError) as exc:
        return ControlResult(UNKNOWN, p.CONNECTION_FAILED, f"health origin {where} does not resolve here: "
                                                         f"{type(exc).__name__}", started)
    timeout = min(MAX_CONTROL_TIMEOUT, max(0.5, timeout))
    host_header = host if ":" not in host else f"[{host}]"
    if parts.port:
        host_header += f":{parts.port}"
    path = parts.path or "/"
    if parts.query:
        path += "?" + parts.query
    pool: urllib3.HTTPConnectionPool
    if parts.scheme == "https":
        pool = urllib3.HTTPSConnectionPool(address, port, maxsize=1, retries=False, server_hostname=host,
                                           assert_hostname=host, ssl_context=p.ssl_context(ca_bundle))
    else:
        pool = urllib3.HTTPConnectionPool(address, port, maxsize=1, retries=False)
    try:
        resp = pool.request("GET", path, redirect=False, retries=False, preload_content=False,
                            timeout=urllib3.Timeout(total=timeout),
                            headers={"Host": host_header, "User-Agent": "proxy-operator-probe-control",
                                     "Connection": "close"})
        status = resp.status
        resp.drain_conn()
        resp.release_conn()
    except Exception as exc:  # noqa: BLE001 - every failure is a verdict
        reason, message, _ = p.classify(exc, f"health origin {where}")
        return ControlResult(DOWN, reason, f"direct control request: {message}", started)
    finally:
        pool.close()
    if status == expected_status or status == 429:
        return ControlResult(UP, p.OK, f"health origin {where} answered {status} directly", started)
    return ControlResult(DOWN, p.UNEXPECTED_STATUS,
                         f"health origin {where} answered {status} directly, expected {expected_status}", started)


def _digest(url: str, expected_status: int) -> str:
    """The part of the Redis keys of a health URL and status that names them."""
    return hashlib.sha256(f"{expected_status} {url}".encode()).hexdigest()[:32]


def _key(url: str, expected_status: int) -> str:
    return redis_keys.health_origin(_digest(url, expected_status))


class OriginControl:
    """The control requests of one probe batch, shared through Redis with every other batch.

    Args:
        r: ``redis.Redis`` (``decode_responses=True``).
        policy: the destination policy.
        ca_bundle: CA file for https origins.
        clock: epoch-seconds clock.
    """

    _warned: set[str] = set()  # origins this process warned about (cannot be reached directly)
    _warned_lock = threading.Lock()

    def __init__(self, r, policy: "DestinationPolicy", *, ca_bundle: str | None = None, clock=time.time) -> None:
        self.r, self.policy, self.ca_bundle, self.clock = r, policy, ca_bundle, clock
        self._mine: dict[str, ControlResult] = {}

    def _ask(self, url: str, expected: int, timeout: float) -> ControlResult:
        res = control(url, expected, timeout, policy=self.policy, ca_bundle=self.ca_bundle, clock=self.clock)
        key = _key(url, expected)
        fields = {"started": repr(res.started), "state": res.state, "reason": res.reason, "message": res.message}
        if res.state == UP:
            fields["okAt"] = repr(res.started)
        pipe = self.r.pipeline(transaction=False)
        pipe.hset(key, mapping=fields)
        pipe.expire(key, _KEY_TTL)
        pipe.execute()
        self._mine[key] = res
        return res

    def verdict(self, url: str, expected: int, *, timeout: float, failed_since: float) -> ControlResult:
        """Whether the origin of ``url`` is down for failures of probes started at ``failed_since``.

        Reuses a control result (this batch's or one in Redis) that started at or after
        ``failed_since``; otherwise asks.  A ``down`` answer is returned as ``unknown`` when the
        origin never answered a control request (this worker may not reach it directly: see
        the module docstring).

        Raises:
            redis.RedisError: Redis failed.
        """
        key = _key(url, expected)
        res = self._mine.get(key)
        stored = self.r.hgetall(key)
        if res is None or res.started < failed_since:
            try:
                started = float(stored.get("started") or 0)
            except ValueError:
                started = 0.0
            if stored and started >= failed_since:
                res = ControlResult(stored.get("state") or UNKNOWN, stored.get("reason") or "",
                                    stored.get("message") or "", started)
            else:
                res = self._ask(url, expected, timeout)
                stored = self.r.hgetall(key)
        if res.state == DOWN and not stored.get("okAt"):
            self._warn_once(url, res)
            return ControlResult(UNKNOWN, res.reason, res.message, res.started)
        return res

    def refresh(self, url: str, expected: int, timeout: float) -> None:
        """After probes of ``url`` succeeded: ask the origin directly if nobody did for
        :data:`REFRESH_SECONDS` (one batch of the fleet at a time), to learn this worker reaches
        it.  Never raises for network errors.

        Raises:
            redis.RedisError: Redis failed.
        """
        key = _key(url, expected)
        try:
            ok_at = float(self.r.hget(key, "okAt") or 0)
        except ValueError:
            ok_at = 0.0
        now = self.clock()
        if now - ok_at < REFRESH_SECONDS:
            return
        if not self.r.set(redis_keys.health_origin_refresh(_digest(url, expected)), "1", nx=True, ex=60):
            return  # another batch is asking
        res = self._ask(url, expected, timeout)
        if res.state == DOWN:
            self._warn_once(url, res)

    def _warn_once(self, url: str, res: ControlResult) -> None:
        where = origin_of(url)
        with self._warned_lock:
            if where in self._warned:
                return
            self._warned.add(where)
        log.warning("health: the worker cannot reach health origin %s directly (%s), while probes through "
                    "proxies may; until it can, an outage of that origin cannot be told from failing proxies",
                    where, res.reason)
