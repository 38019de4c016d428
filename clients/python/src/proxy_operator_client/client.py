"""The client of the discovery/lease API: :class:`Client` and the :class:`Lease` it hands out.

A lease is renewed by a background thread at half of its TTL, and released with an outcome
(``ok``, ``blocked``, ``failed``) when its ``with`` block ends or :meth:`Lease.report` /
:meth:`Lease.release` is called.  ``503`` answers (and a target's ``429 target_refusing``) are
retried as their ``Retry-After`` says, up to a deadline the caller sets.  Everything is
thread-safe.

A lease may name a ``target`` (the site it is for): bans and per-site limits then apply to
that site only (docs/discovery-api.md, "Targets and bans").  :meth:`Client.requests_session`
and :meth:`Client.httpx_client` do it per request: each request is sent through a lease for its
URL's host, released ``blocked`` when the site's answer says so.

The bearer token and a proxy's credentials never appear in a log record, a ``repr`` or an
exception message; only :attr:`Lease.proxy_url`, :attr:`Lease.proxies`,
:attr:`Lease.proxy_auth` and the sessions the helpers build carry credentials.
"""

from __future__ import annotations

import logging
import random
import re
import threading
import time
import warnings
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any, Callable, Dict, List, Mapping, Optional, Tuple, Union
from urllib.parse import urlsplit

import requests
from urllib3.exceptions import NewConnectionError

from proxy_operator_client.errors import ApiError, ClientClosed, ProxyOperatorError, TransportError, parse_retry_after

log = logging.getLogger("proxy_operator_client")

#: Release outcomes the API knows.
OUTCOMES = ("ok", "blocked", "failed")
#: Renewal errors that end a lease for good: stop renewing, :attr:`Lease.lost` says why.
LEASE_GONE = frozenset({"lease_expired", "lease_not_found", "proxy_unavailable", "not_lease_owner"})
#: Default seconds to keep retrying a 503 when asking for a lease.
DEFAULT_WAIT = 60.0
#: Default seconds one HTTP call to the API may take.
DEFAULT_TIMEOUT = 10.0
#: Seconds a release keeps retrying a 503 or an unreachable API before giving up (the lease
#: then ends by its TTL).
RELEASE_WAIT = 5.0
#: Seconds to wait between attempts when the API cannot be connected to (no Retry-After).
CONNECT_RETRY = 1.0
#: Seconds to wait after a 503 without a readable ``Retry-After``.
DEFAULT_RETRY = 1.0
#: HTTP statuses of a site that mean "this IP is banned" for the per-request helpers.
DEFAULT_BAN_CODES = (403, 429)
#: Squid's header on the error pages it makes (``ERR_ACCESS_DENIED 0``: the error, an errno).
SQUID_ERROR_HEADER = "X-Squid-Error"
#: The operator's Squid's mark of its own error pages (the error); a site's header of this name
#: never reaches the client.
ERROR_HEADER = "X-Proxy-Operator-Error"
_SQUID_ERROR = re.compile(r"^(ERR_[A-Z0-9_]{1,64})(?: -?\d{1,6})?$")
#: The status a proxy answered a CONNECT with, in urllib3's message (``Tunnel connection failed: 403 Forbidden``).
_TUNNEL_STATUS = re.compile(r"Tunnel connection failed: (\d{3})\b")
#: Shortest wait after a 503, whatever its ``Retry-After`` says: ``0``, or an HTTP-date already
#: past (clock skew), must not make the client hammer the API until its deadline.
MIN_RETRY = 0.25

Labels = Union[Mapping[str, str], str, None]


def _parse_time(value: Optional[str]) -> Optional[datetime]:
    """``2026-05-04T10:16:12.345Z`` -> aware datetime (UTC); ``None`` stays ``None``."""
    if not value:
        return None
    if value.endswith("Z"):
        value = value[:-1] + "+00:00"
    return datetime.fromisoformat(value).astimezone(timezone.utc)


def selector_of(labels: Labels) -> Optional[str]:
    """The API's ``selector`` for ``labels``: a mapping becomes ``k1=v1,k2=v2`` (every label
    must match), a string is taken as a Kubernetes label selector as is
    (``"tier=gold,region!=us"``), ``None``/empty means no selector.

    Raises:
        ValueError: a key or value that is not a non-empty string (values may be empty).
    """
    if labels is None:
        return None
    if isinstance(labels, str):
        return labels or None
    parts = []
    for key, value in labels.items():
        if not isinstance(key, str) or not key or not isinstance(value, str):
            raise ValueError(f"labels: keys must be non-empty strings and values strings, got {key!r}")
        parts.append(f"{key}={value}")
    return ",".join(parts) or None


@dataclass(frozen=True)
class ProxyRef:
    """Which Proxy a lease is on: its ``namespace`` and ``name`` (the Kubernetes object),
    ``provider`` and ``zone`` (``None`` when unknown; External proxies have no provider)."""

    namespace: str
    name: str
    provider: Optional[str] = None
    zone: Optional[str] = None

    def __str__(self) -> str:
        return f"{self.namespace}/{self.name}"


@dataclass(frozen=True)
class Released:
    """The result of releasing a lease.

    Attributes:
        lease_id: the lease.
        outcome: ``ok``, ``blocked`` or ``failed``.
        was_live: whether the lease was still live (``False``: it had expired, or its proxy
            had been withdrawn from serving; the outcome was still recorded).
        cooldown_until: when the proxy's cooldown for this client ends (UTC), or, for a lease
            with a target, the ban of its egress IP for that target; ``None`` for none.
        recorded: ``False`` when the API no longer knew the lease (it had been lost:
            :attr:`Lease.lost`), so the outcome was not recorded.
        target: the lease's target, or ``None``.
        target_refusing_until: when the target, found refusing every egress IP, may be tried
            again (UTC), or ``None``.
    """

    lease_id: str
    outcome: str
    was_live: bool
    cooldown_until: Optional[datetime]
    recorded: bool = True
    target: Optional[str] = None
    target_refusing_until: Optional[datetime] = None


class _LeaseSession(requests.Session):
    """A ``requests.Session`` that sends every request through its lease's current proxy
    (credentials included, and refreshed when a renewal brings new ones)."""

    def __init__(self, lease: "Lease") -> None:
        super().__init__()
        self._lease = lease
        self.trust_env = False  # HTTP(S)_PROXY / NO_PROXY must not take precedence over the lease
        self.proxies = lease.proxies

    def request(self, method, url, *args, **kwargs):
        self.proxies = self._lease.proxies
        return super().request(method, url, *args, **kwargs)

    def __repr__(self) -> str:
        return f"<requests.Session through {self._lease!r}>"


class Lease:
    """One leased proxy.  Made by :meth:`Client.lease`; use it as a context manager::

        with client.lease(zone="europe-west1-b", ttl=300) as lease:
            session = lease.requests_session()
            session.get("https://example.org/")
            if banned:
                lease.report("blocked")

    On leaving the block the lease is released with outcome ``ok``, or ``failed`` when an
    ``Exception`` escapes it (``KeyboardInterrupt`` and ``SystemExit`` release ``ok``: they
    say nothing about the proxy).  A lease already released (:meth:`report`,
    :meth:`release`) is left as is.  Errors of that release are logged, kept in
    :attr:`release_error` and never raised from the ``with`` statement.

    While held, a background thread renews the lease at half of its TTL (retrying 503s and
    connection failures until the lease would expire).  If the API says the lease is gone
    (``lease_expired``, ``lease_not_found``, ``proxy_unavailable``: the proxy turned unhealthy
    or was drained; ``not_lease_owner``), renewing stops and :attr:`lost` holds that
    :class:`ApiError`; ask for a new lease.

    Attributes:
        id: the lease id (32 hex digits).
        host, port: the proxy's address.
        egress_ip: the address target sites see, or ``None`` when unknown.
        ttl: the TTL in seconds the lease is renewed to: the granted one, or the last one given
            to :meth:`renew`; a shorter TTL the API answered (a renewal capped at the drain
            deadline of a proxy leaving its pool) shows in :attr:`expires_at` only.
        session_key: the sticky-session key, or ``None``.
        sticky: whether the session's existing proxy was reused.
        target: the site (registrable domain) the lease is for, or ``None``.
        proxy: :class:`ProxyRef` (namespace, name, provider, zone).
        leases_used, leases_max: the proxy's live leases (this one included) and ``maxLeases``
            when the lease was granted or last renewed.
        renewals: how many times the lease has been renewed.
        release_error: the error of a failed release from ``__exit__``, else ``None``.

    Thread-safe: any thread may read it, renew it, report or release it (the first release
    wins; later calls return its :class:`Released`).
    """

    def __init__(self, client: "Client", doc: Mapping[str, Any], *, requested_at: float, renew: bool = True) -> None:
        self._client = client
        self._lock = threading.Lock()
        self._release_lock = threading.Lock()
        self._stop = threading.Event()
        self._released: Optional[Released] = None
        #: a ``blocked``/``failed`` outcome whose release did not go through: sent by the next
        #: release that asks for ``ok`` (the close's, ``__exit__``'s), so the report is not lost
        self._unsent: Optional[str] = None
        #: a release was sent and its answer lost (read timeout, dropped connection): the API may
        #: have released the lease, so a later ``lease_not_found`` means it did
        self._maybe_released = False
        self._lost: Optional[ApiError] = None
        self.release_error: Optional[ProxyOperatorError] = None
        self.renewals = 0
        self.id: str = doc["leaseId"]
        self._apply(doc, requested_at)
        self._thread: Optional[threading.Thread] = None
        if renew:
            self._thread = threading.Thread(target=self._renew_loop, name=f"proxy-lease-{self.id[:8]}", daemon=True)
            self._thread.start()

    # -- state -------------------------------------------------------------------------
    def _apply(self, doc: Mapping[str, Any], requested_at: float, renew_ttl: Optional[int] = None) -> None:
        """Take the lease document ``doc`` of a grant or renewal requested at monotonic time
        ``requested_at`` (the local expiry counts from then: never later than the server's).

        ``renew_ttl`` is the TTL the renewal asked for: it stays :attr:`ttl` when the answer's
        ``ttlSeconds`` is shorter (a proxy draining out of its pool caps renewals at its drain
        deadline), so the next renewals keep asking for it; ``None`` for a grant."""
        auth = doc.get("proxyAuth")
        px = doc.get("proxy") or {}
        counts = doc.get("leases") or {}
        with self._lock:
            self._proxy_url: str = doc["proxyUrl"]
            self._auth: Optional[Tuple[str, str]] = (auth["username"], auth["password"]) if auth else None
            self.host: str = doc["host"]
            self.port: int = int(doc["port"])
            self.egress_ip: Optional[str] = doc.get("egressIP")
            self.expires_at: Optional[datetime] = _parse_time(doc.get("expiresAt"))
            granted = int(doc["ttlSeconds"])
            self.ttl: int = granted if renew_ttl is None else renew_ttl
            self.session_key: Optional[str] = doc.get("sessionKey")
            self.sticky: bool = bool(doc.get("sticky"))
            self.target: Optional[str] = doc.get("target")
            self.proxy = ProxyRef(px.get("namespace", ""), px.get("name", ""), px.get("provider"), px.get("zone"))
            self.leases_used: Optional[int] = counts.get("used")
            self.leases_max: Optional[int] = counts.get("max")
            self._expires_mono = requested_at + granted
            # (an API that answers a capped TTL of 0 must not be asked again in a tight loop)
            self._renew_at = requested_at + max(granted / 2.0, MIN_RETRY)

    @property
    def proxy_url(self) -> str:
        """The URL to send requests to as a forward proxy: ``http://host:port``, or
        ``http://user:password@host:port`` (percent-encoded) when the proxy requires basic
        auth.  Treat it as a secret."""
        with self._lock:
            return self._proxy_url

    @property
    def proxy_auth(self) -> Optional[Tuple[str, str]]:
        """``(username, password)`` (decoded) of a basic-auth proxy, else ``None``."""
        with self._lock:
            return self._auth

    @property
    def proxies(self) -> Dict[str, str]:
        """``{"http": proxy_url, "https": proxy_url}``: the ``proxies=`` argument of requests."""
        url = self.proxy_url
        return {"http": url, "https": url}

    @property
    def lost(self) -> Optional[ApiError]:
        """The :class:`ApiError` that ended the lease behind the client's back (a renewal
        refused: ``lease_expired``, ``lease_not_found``, ``proxy_unavailable``,
        ``not_lease_owner``; or ``lease_expired`` with status 0 when no renewal got through
        before the TTL ran out), or ``None``."""
        with self._lock:
            return self._lost

    @property
    def released(self) -> Optional[Released]:
        """The :class:`Released` result once the lease has been released, else ``None``."""
        with self._lock:
            return self._released

    @property
    def alive(self) -> bool:
        """Whether the lease can still be used: not released, not lost, and (by the local
        clock) not past its expiry."""
        with self._lock:
            return self._released is None and self._lost is None and time.monotonic() < self._expires_mono

    def __repr__(self) -> str:
        with self._lock:
            state = ("released " + self._released.outcome if self._released else
                     f"lost ({self._lost.code})" if self._lost else "live")
            return (f"<Lease {self.id} proxy={self.proxy} at {self.host}:{self.port} ttl={self.ttl}s "
                    f"expires={self.expires_at.isoformat() if self.expires_at else None} {state}>")

    # -- renewal -----------------------------------------------------------------------
    def renew(self, ttl: Optional[int] = None) -> "Lease":
        """Renew now, to ``ttl`` seconds from now (default: the lease's TTL); the background
        thread does this by itself, so calling it is seldom needed.

        Returns:
            this lease (updated: :attr:`expires_at`, credentials, counts).
        Raises:
            ApiError: ``lease_expired``, ``lease_not_found``, ``proxy_unavailable`` (the lease is
                then :attr:`lost`), ``not_lease_owner``, ``invalid_field`` for a bad ``ttl``;
                a 503 that outlasted the lease's remaining time.
            TransportError: the API could not be reached.
            ClientClosed: the client was closed.
        """
        started = time.monotonic()
        with self._lock:
            remaining = max(0.0, self._expires_mono - started)
            asked = int(ttl if ttl is not None else self.ttl)
        try:
            doc = self._client._request("POST", f"/v1/leases/{self.id}/renew", body={"ttlSeconds": asked},
                                        wait=remaining, operation="renew")
        except ApiError as exc:
            if exc.code in LEASE_GONE:
                self._lose(exc)
            raise
        self._apply(doc, started, renew_ttl=asked)
        with self._lock:
            self.renewals += 1
        log.debug("lease %s renewed: proxy %s, expires %s", self.id, self.proxy, doc.get("expiresAt"))
        return self

    def _lose(self, exc: ApiError) -> None:
        with self._lock:
            # a release under way (it stops renewal first) explains a refused renewal
            if self._released is not None or self._lost is not None or self._stop.is_set():
                return
            self._lost = exc
        self._stop.set()
        log.warning("lease %s on proxy %s ended by the API: %s", self.id, self.proxy, exc.code)

    def _renew_loop(self) -> None:
        while True:
            with self._lock:
                delay = self._renew_at - time.monotonic()
            if self._stop.wait(max(0.0, delay)):
                return
            try:
                self.renew()
            except ApiError as exc:
                if self._stop.is_set():
                    return
                if exc.code in LEASE_GONE:
                    return
                self._retry_later(exc)
            except ClientClosed:
                return
            except ProxyOperatorError as exc:  # TransportError
                if self._stop.is_set():
                    return
                self._retry_later(exc)
            except Exception:  # a bug: never let the thread die silently
                log.exception("lease %s: unexpected error while renewing", self.id)
                self._retry_later(None)
            if self._stop.is_set():
                return

    def _retry_later(self, exc: Optional[ProxyOperatorError]) -> None:
        now = time.monotonic()
        with self._lock:
            expired = now >= self._expires_mono
            self._renew_at = now + CONNECT_RETRY
        if expired:
            gone = exc if isinstance(exc, ApiError) else ApiError(0, "lease_expired", "the lease could not be renewed "
                                                                  "before its TTL ran out")
            self._lose(gone)
        elif exc is not None:
            log.warning("lease %s: renewal failed, retrying: %s", self.id, exc)

    # -- release -----------------------------------------------------------------------
    def release(self, outcome: str = "ok", *, wait: Optional[float] = None) -> Released:
        """Release the lease with ``outcome`` and stop renewing it.

        Args:
            outcome: ``ok`` (the proxy worked), ``blocked`` (the target site banned it: starts
                its cooldown for this client) or ``failed`` (the proxy did not work: cooldown too).
            wait: seconds to keep retrying a 503 or an unreachable API (default
                :data:`RELEASE_WAIT`).
        Returns:
            :class:`Released`.  Releasing again returns the first result without calling the API.
            A lease the API no longer knows after it was :attr:`lost` gives
            ``Released(recorded=False)``.
        Raises:
            ValueError: an unknown outcome.
            ApiError: the API refused (``not_lease_owner``; ``lease_not_found`` for a lease not
                known to be lost; a 503 past ``wait``).  The lease is then no longer renewed
                and ends by its TTL; releasing may be tried again.  A ``blocked``/``failed``
                outcome that did not go through is kept: a later release asking for ``ok``
                (:meth:`Client.close`, :meth:`Client.release_all`, leaving the ``with`` block)
                sends it instead, so the report is not lost.
            TransportError: the API could not be reached within ``wait``, or answered neither a
                release nor the one retry of it that follows a lost or late answer (a read
                timeout, a dropped connection: the retry's ``lease_not_found`` then means the
                first went through, and the lease counts as released, :attr:`Released.was_live`
                and :attr:`Released.cooldown_until` unknown).
        """
        if outcome not in OUTCOMES:
            raise ValueError(f"outcome: must be one of {', '.join(OUTCOMES)}, got {outcome!r}")
        with self._release_lock:
            with self._lock:
                if self._released is not None:
                    return self._released
                lost = self._lost
                if outcome == "ok" and self._unsent is not None:
                    outcome = self._unsent
                elif outcome != "ok":
                    self._unsent = outcome
            self._stop.set()
            deadline = RELEASE_WAIT if wait is None else wait

            def delete() -> dict:
                return self._client._request("DELETE", f"/v1/leases/{self.id}", params={"outcome": outcome},
                                             wait=deadline, operation="release", closing_ok=True)

            try:
                try:
                    doc = delete()
                except TransportError as exc:
                    if not _maybe_sent(exc):
                        raise
                    # the answer was lost or came too late (a read timeout, a dropped connection):
                    # the API may have released the lease; asking again tells (lease_not_found: it did)
                    self._maybe_released = True
                    doc = delete()
            except ApiError as exc:
                if exc.code != "lease_not_found" or (lost is None and not self._maybe_released):
                    raise
                # gone: lost before (not recorded), or released by an attempt whose answer was lost
                result = Released(self.id, outcome, False, None, recorded=lost is None, target=self.target)
            else:
                result = Released(self.id, doc.get("outcome", outcome), bool(doc.get("wasLive")),
                                  _parse_time(doc.get("cooldownUntil")), target=doc.get("target"),
                                  target_refusing_until=_parse_time(doc.get("targetRefusingUntil")))
            with self._lock:
                self._released = result
        self._client._forget(self)
        log.debug("lease %s released: proxy %s, outcome %s%s", self.id, self.proxy, result.outcome,
                  f", cooldown until {result.cooldown_until.isoformat()}" if result.cooldown_until else "")
        return result

    def report(self, outcome: str) -> Released:
        """End the lease with what happened: ``report("blocked")`` when the target site banned
        the proxy (the proxy cools down for this client and is not leased to it again for the
        API's ``LEASE_COOLDOWN_SECONDS``), ``report("failed")`` when the proxy itself did not
        work, ``report("ok")`` to end it normally.  Same as :meth:`release`; raises the same."""
        return self.release(outcome)

    def __enter__(self) -> "Lease":
        return self

    def __exit__(self, exc_type, exc, tb) -> bool:
        outcome = "failed" if exc_type is not None and issubclass(exc_type, Exception) else "ok"
        if self.released is None:
            try:
                self.release(outcome)
            except ProxyOperatorError as err:
                self.release_error = err
                log.warning("lease %s on proxy %s: release (%s) failed: %s", self.id, self.proxy, outcome, err)
        return False

    # -- HTTP client helpers -----------------------------------------------------------
    def requests_session(self) -> requests.Session:
        """A new ``requests.Session`` that sends every request through this lease's proxy
        (with its credentials, refreshed when a renewal changes them).  It ignores
        ``HTTP_PROXY``/``HTTPS_PROXY``/``NO_PROXY`` and the other environment settings of
        requests (``trust_env = False``), so nothing bypasses the proxy.  The caller closes it."""
        return _LeaseSession(self)

    def httpx_client(self, **kwargs: Any):
        """A new ``httpx.Client(proxy=<this lease's proxy>, trust_env=False, **kwargs)`` (needs
        ``httpx``: ``pip install 'proxy-operator-client[httpx]'``).  Its proxy and credentials
        are fixed when it is made; make a new one after a renewal that changed them (rare: the
        operator rotates a proxy's password only when its Secret changes).

        Raises:
            ImportError: httpx is not installed.
        """
        import httpx

        kwargs.setdefault("trust_env", False)
        return httpx.Client(proxy=self.proxy_url, **kwargs)

    def httpx_async_client(self, **kwargs: Any):
        """Like :meth:`httpx_client`, an ``httpx.AsyncClient``."""
        import httpx

        kwargs.setdefault("trust_env", False)
        return httpx.AsyncClient(proxy=self.proxy_url, **kwargs)


def _made_by_proxy(status: int, headers: Mapping[str, str]) -> bool:
    """Whether an answer of ``status`` with ``headers`` was made by the proxy rather than the
    site: a ``407``, or one of Squid's error pages (``X-Proxy-Operator-Error``, ``X-Squid-Error``:
    a destination its policy denies, a site it cannot reach).  Such an answer says nothing of
    the site's view of the egress IP: the per-request helpers release its lease ``ok``."""
    if status == 407:
        return True

    def header(name: str) -> str:
        value = headers.get(name)
        return value.strip() if isinstance(value, str) else ""

    return squid_error(header) is not None


def squid_error(header: Callable[[str], str]) -> Optional[str]:
    """Squid's error name (``"ERR_ACCESS_DENIED"``) on an error page Squid made, read from
    ``header(name)`` (a header's value, ``""`` when absent) for :data:`ERROR_HEADER`, then
    :data:`SQUID_ERROR_HEADER`; ``None`` when neither holds one (a value of another shape is
    ignored)."""
    for name in (ERROR_HEADER, SQUID_ERROR_HEADER):
        m = _SQUID_ERROR.match(header(name))
        if m:
            return m.group(1)
    return None


class TargetedSession(requests.Session):
    """A ``requests.Session`` that sends each request through a lease of its own, asked for the
    request URL's host as ``target``, and released as soon as the answer's head is in:
    ``blocked`` when the site's answer has a ban code (that site then bans that egress IP, not
    the proxy for every site), ``failed`` when the proxy could not be reached, else ``ok``: an
    answer the proxy made itself (Squid's error page, a 407) or a CONNECT it refused is not the
    site's, nor is a timeout or another error of the request.  Made by
    :meth:`Client.requests_session`; thread-safe as ``requests`` is.  The response carries the
    lease it went through (``response.lease``, released).  A streamed body
    (``stream=True``) is read after the release: the lease covers the request only.  Each
    redirect it follows is a request of its own, through a lease for the new URL's host (its
    response in ``response.history`` carries its lease too)."""

    def __init__(self, client: "Client", ban_codes, lease_kwargs: Dict[str, Any]) -> None:
        super().__init__()
        self._client = client
        self._ban_codes = frozenset(int(c) for c in ban_codes)
        self._lease_kwargs = dict(lease_kwargs)
        self.trust_env = False  # HTTP(S)_PROXY / NO_PROXY must not take precedence over the leases

    def send(self, request, **kwargs):
        """Send one prepared request through a lease for its host (requests' ``Session.send``),
        then follow its redirects, each hop through a lease for that hop's host (a redirect to
        another site is that site's request: its bans, its limit, its ban answer)."""
        host = urlsplit(str(request.url)).hostname
        if not host:
            raise ValueError(f"url: no host in {str(request.url)[:100]!r}")
        follow = kwargs.pop("allow_redirects", True)
        lease = self._client.lease(target=host, renew=False, **self._lease_kwargs)
        kwargs["proxies"] = lease.proxies
        outcome = "ok"
        try:
            resp = super().send(request, allow_redirects=False, **kwargs)
        except requests.exceptions.ProxyError as exc:
            # (a CONNECT the proxy answered with a status, e.g. a 403 of its policy: it works)
            if not _TUNNEL_STATUS.search(str(exc)):
                outcome = "failed"
            raise
        except requests.exceptions.ConnectTimeout:
            outcome = "failed"
            raise
        else:
            if resp.status_code in self._ban_codes and not _made_by_proxy(resp.status_code, resp.headers):
                outcome = "blocked"
            resp.lease = lease  # type: ignore[attr-defined]
        finally:
            try:
                lease.release(outcome)
            except ProxyOperatorError as exc:
                log.warning("lease %s for %s: release (%s) failed: %s", lease.id, lease.target, outcome, exc)
        if not follow or not resp.is_redirect:
            return resp
        # as Session.send does, but each hop is sent by this method (allow_redirects=False): its own lease
        kwargs.pop("proxies")
        history = [resp, *self.resolve_redirects(resp, request, **kwargs)]
        last = history.pop()
        last.history = history
        return last

    def __repr__(self) -> str:
        return f"<requests.Session through a lease per request of {self._client!r}>"


def _targeted_transport(client: "Client", ban_codes, lease_kwargs: Dict[str, Any], asynchronous: bool):
    """The httpx transport of :meth:`Client.httpx_client` / :meth:`Client.httpx_async_client`."""
    import httpx

    codes = frozenset(int(c) for c in ban_codes)

    def lease_for(request: "httpx.Request") -> Lease:
        if not request.url.host:
            raise ValueError(f"url: no host in {str(request.url)[:100]!r}")
        return client.lease(target=request.url.host, renew=False, **lease_kwargs)

    def outcome_of(status: int, headers) -> str:
        return "blocked" if status in codes and not _made_by_proxy(status, headers) else "ok"

    # the proxy could not be reached: the only errors that are the proxy's (a CONNECT it refused is
    # httpx.ProxyError, its answer; a timeout or another error is the site's or the caller's)
    proxy_down = (httpx.ConnectError, httpx.ConnectTimeout)

    def release(lease: Lease, outcome: str) -> None:
        try:
            lease.release(outcome)
        except ProxyOperatorError as exc:
            log.warning("lease %s for %s: release (%s) failed: %s", lease.id, lease.target, outcome, exc)

    class Transport(httpx.BaseTransport):
        def handle_request(self, request):
            lease = lease_for(request)
            outcome = "ok"
            try:
                with httpx.HTTPTransport(proxy=lease.proxy_url, trust_env=False) as inner:
                    resp = inner.handle_request(request)
                    raw = b"".join(resp.iter_raw())
                    resp.close()
                outcome = outcome_of(resp.status_code, resp.headers)
                return httpx.Response(resp.status_code, headers=resp.headers, content=raw,
                                      extensions={"http_version": resp.extensions.get("http_version", b"HTTP/1.1")})
            except proxy_down:
                outcome = "failed"
                raise
            finally:
                release(lease, outcome)

    class AsyncTransport(httpx.AsyncBaseTransport):
        async def handle_async_request(self, request):
            import asyncio

            lease = await asyncio.to_thread(lease_for, request)
            outcome = "ok"
            try:
                async with httpx.AsyncHTTPTransport(proxy=lease.proxy_url, trust_env=False) as inner:
                    resp = await inner.handle_async_request(request)
                    raw = b"".join([chunk async for chunk in resp.aiter_raw()])
                    await resp.aclose()
                outcome = outcome_of(resp.status_code, resp.headers)
                return httpx.Response(resp.status_code, headers=resp.headers, content=raw,
                                      extensions={"http_version": resp.extensions.get("http_version", b"HTTP/1.1")})
            except proxy_down:
                outcome = "failed"
                raise
            finally:
                await asyncio.to_thread(release, lease, outcome)

    return AsyncTransport() if asynchronous else Transport()


class Client:
    """A client of proxy-operator's discovery/lease API.

    Args:
        url: the API's base URL, e.g. ``"http://proxy-api:8080"`` (no credentials in it).
        token: the client's bearer token (``clients[].token`` of the API's tokens file).  Never
            shown in ``repr``, logs or errors.
        wait: default seconds :meth:`lease` keeps retrying when no proxy is available (503,
            waiting as ``Retry-After`` says) or the API cannot be connected to; 0 = fail at once.
        timeout: seconds one HTTP call may take (connect and read).

    Raises:
        ValueError: a URL that is not ``http(s)://host[:port][/prefix]`` or carries credentials,
            an empty token, a negative wait or a non-positive timeout.

    Thread-safe: one client may be shared by any number of threads (each thread gets its own
    connection pool).  Use it as a context manager, or call :meth:`close`, to release the
    leases still held and close the connections.
    """

    def __init__(self, url: str, token: str, *, wait: float = DEFAULT_WAIT, timeout: float = DEFAULT_TIMEOUT) -> None:
        parts = urlsplit(url or "")
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError("url: must be http(s)://host[:port], e.g. http://proxy-api:8080")
        if parts.username is not None or parts.password is not None:
            raise ValueError("url: must not carry credentials (the token authenticates)")
        if parts.query or parts.fragment:
            raise ValueError("url: must not have a query or fragment")
        if not isinstance(token, str) or not token.strip():
            raise ValueError("token: must be a non-empty string")
        if wait < 0 or timeout <= 0:
            raise ValueError("wait must be >= 0 and timeout > 0 (seconds)")
        self.url = url.rstrip("/")
        self.wait = float(wait)
        self.timeout = float(timeout)
        self.__authorization = f"Bearer {token.strip()}"
        self._local = threading.local()
        self._lock = threading.Lock()
        self._sessions: List[requests.Session] = []
        self._leases: Dict[str, Lease] = {}
        self._closed = threading.Event()
        self._legacy_pool = False  # the API predates ProxyPools: pool= is sent as a namespace

    def __repr__(self) -> str:
        return f"Client(url={self.url!r}{', closed' if self._closed.is_set() else ''})"

    # -- HTTP ----------------------------------------------------------------------------
    def _session(self) -> requests.Session:
        session = getattr(self._local, "session", None)
        if session is None:
            session = requests.Session()
            session.headers.update({"Authorization": self.__authorization, "Accept": "application/json",
                                    "User-Agent": f"proxy-operator-client/{_version()}"})
            self._local.session = session
            with self._lock:
                self._sessions.append(session)
        return session

    def _request(self, method: str, path: str, *, body: Optional[dict] = None, params: Optional[dict] = None,
                 wait: float = 0.0, operation: str, closing_ok: bool = False) -> dict:
        """One API call; retries a 503 (as ``Retry-After`` says, default :data:`DEFAULT_RETRY`,
        at least :data:`MIN_RETRY`) and a refused connection (every :data:`CONNECT_RETRY` s)
        until ``wait`` seconds have passed.

        Returns:
            the JSON answer (a dict).
        Raises:
            ApiError, TransportError, ClientClosed (unless ``closing_ok``: releases still go out
            while the client closes).
        """
        deadline = time.monotonic() + max(0.0, wait)
        while True:
            if self._closed.is_set() and not closing_ok:
                raise ClientClosed(f"{operation}: the client is closed")
            try:
                resp = self._session().request(method, self.url + path, json=body, params=params,
                                               timeout=self.timeout)
            except requests.RequestException as exc:
                # A refused connection sent nothing, so retrying cannot grant a lease twice;
                # anything else (a read timeout) might have been acted on: not retried.
                reason = getattr(exc.args[0], "reason", None) if exc.args else None
                error = TransportError(f"{operation}: cannot reach the API at {self.url}: {type(exc).__name__}")
                if not isinstance(reason, NewConnectionError) or not self._pause(CONNECT_RETRY, deadline, closing_ok):
                    raise error from exc
                log.debug("%s: API at %s unreachable, retrying", operation, self.url)
                continue
            if resp.status_code < 400:
                try:
                    doc = resp.json()
                except ValueError:
                    doc = None
                if not isinstance(doc, dict):
                    raise ApiError(resp.status_code, "unexpected_response",
                                   f"{operation}: the answer is not a JSON object")
                return doc
            error = _api_error(resp)
            if resp.status_code == 503 or error.code == "target_refusing":
                delay = max(MIN_RETRY, error.retry_after if error.retry_after is not None else DEFAULT_RETRY)
                if self._pause(delay, deadline, closing_ok):
                    log.debug("%s: %s, retrying in %.1fs", operation, error.code, delay)
                    continue
            raise error

    def _pause(self, delay: float, deadline: float, closing_ok: bool) -> bool:
        """Sleep ``delay`` seconds (plus up to 10% jitter, so that many crawlers do not come back
        in step) if that ends before ``deadline``; ``False`` when it would not (give up).

        Raises:
            ClientClosed: the client was closed meanwhile (not with ``closing_ok``).
        """
        delay = delay * (1.0 + random.random() * 0.1)
        if time.monotonic() + delay > deadline:
            return False
        if closing_ok:
            time.sleep(delay)
        elif self._closed.wait(delay):
            raise ClientClosed("the client was closed while waiting to retry")
        return True

    def _forget(self, lease: Lease) -> None:
        with self._lock:
            self._leases.pop(lease.id, None)

    # -- filters ---------------------------------------------------------------------------
    def _filters(self, pool: Optional[str], namespace: Optional[str]) -> Dict[str, str]:
        """The ``pool``/``namespace`` filters to send.

        ``pool="<namespace>/<name>"`` is the pool ``name`` of that namespace.  Against an API
        that predates ProxyPools (it refuses the ``pool`` field) ``pool`` keeps its old meaning,
        a namespace (see :meth:`_legacy`).
        """
        out: Dict[str, str] = {}
        if pool is not None and "/" in pool:
            pool_ns, _, pool = pool.partition("/")
            if namespace is not None and namespace != pool_ns:
                raise ValueError(f"pool {pool_ns}/{pool} and namespace {namespace!r} disagree")
            namespace = pool_ns
        if namespace is not None:
            out["namespace"] = namespace
        if pool is not None:
            if self._legacy_pool:
                out.setdefault("namespace", pool)
            else:
                out["pool"] = pool
        return out

    def _legacy(self, error: "ApiError", filters: Dict[str, str]) -> Optional[Dict[str, str]]:
        """For an API that refused the ``pool`` filter as unknown (released before ProxyPools),
        the filters to send instead: ``pool`` as a namespace, its meaning in releases of this
        client before ProxyPools (warned once); ``None`` for any other error."""
        if "pool" not in filters or error.status != 400 or getattr(error, "field", None) != "pool" or \
                error.code not in ("unknown_field", "unknown_parameter"):
            return None
        if not self._legacy_pool:
            self._legacy_pool = True
            warnings.warn("the API at this URL predates ProxyPools: pool= is sent as a namespace filter, as in "
                          "earlier releases (use namespace= to mean a namespace)", DeprecationWarning, stacklevel=4)
            log.warning("the API at %s does not know the pool filter: pool=%r is sent as a namespace filter",
                        self.url, filters["pool"])
        out = {k: v for k, v in filters.items() if k != "pool"}
        out.setdefault("namespace", filters["pool"])
        return out

    # -- API -----------------------------------------------------------------------------
    def lease(self, *, pool: Optional[str] = None, provider: Optional[str] = None, zone: Optional[str] = None,
              labels: Labels = None, ttl: Optional[int] = 300, session_key: Optional[str] = None,
              wait: Optional[float] = None, renew: bool = True, namespace: Optional[str] = None,
              target: Optional[str] = None) -> Lease:
        """Lease a proxy (``POST /v1/leases``).

        Args:
            pool: only members of the ProxyPool of this name (``"<namespace>/<name>"`` names the
                namespace too).  A refusal for lack of proxies counts as demand for the pool's
                autoscaler.  Before ProxyPools ``pool`` meant a namespace: against an API that
                does not know the ``pool`` filter it still does (with a ``DeprecationWarning``).
            namespace: only Proxies of this Kubernetes namespace.
            provider: only proxies of this provider (a name from the providers config).
            zone: only proxies in this zone (kvm: the host name).
            labels: only proxies whose labels match: a mapping (every pair must match) or a
                label-selector string (``"tier=gold,region!=us"``).
            ttl: lease duration in seconds (1 to the API's ``LEASE_MAX_TTL``, 3600 by default);
                ``None`` = the API's default.  The lease is renewed to this TTL at half of it.
            session_key: sticky session (1-128 of ``A-Za-z0-9._:-``): later leases with the
                same key get the same proxy while it stays eligible.
            wait: seconds to keep retrying while no proxy is available (default: the client's
                ``wait``); the last 503 is raised after it.
            renew: renew in the background (default ``True``).
            target: the site the lease is for (a host name or URL): never a proxy whose egress IP
                that site banned or that another crawler uses for it at the limit; a release as
                ``blocked`` bans that IP for that site only.  A site refusing every IP answers
                ``429 target_refusing``, waited out within ``wait`` like a 503, else raised.
        Returns:
            a live :class:`Lease`, also a context manager that releases it.
        Raises:
            ApiError: ``no_proxy_available`` (after ``wait``; its message says why each proxy
                was excluded), ``target_refusing`` (after ``wait``: the target refuses every
                egress IP; :attr:`ApiError.retry_after` says when to try it again),
                ``pool_not_found`` (404, at once: ``pool`` names no ProxyPool
                this client may lease from), ``invalid_field`` (``field`` names it), ``unauthorized``,
                ``redis_unavailable`` (after ``wait``), ...
            TransportError: the API could not be reached (within ``wait``) or timed out.
            ClientClosed: the client is closed.
            ValueError: malformed ``labels``; ``pool="ns/name"`` and a different ``namespace``.
        """
        filters = self._filters(pool, namespace)
        body: Dict[str, Any] = dict(filters)
        for key, value in (("provider", provider), ("zone", zone),
                           ("selector", selector_of(labels)), ("sessionKey", session_key), ("target", target)):
            if value is not None:
                body[key] = value
        if ttl is not None:
            body["ttlSeconds"] = ttl
        started = time.monotonic()
        try:
            doc = self._request("POST", "/v1/leases", body=body, wait=self.wait if wait is None else wait,
                                operation="lease")
        except ApiError as exc:
            legacy = self._legacy(exc, filters)
            if legacy is None:
                raise
            body = {**{k: v for k, v in body.items() if k not in filters}, **legacy}
            doc = self._request("POST", "/v1/leases", body=body, wait=self.wait if wait is None else wait,
                                operation="lease")
        lease = Lease(self, doc, requested_at=started, renew=renew)
        log.debug("lease %s: proxy %s at %s:%s, ttl %ss%s", lease.id, lease.proxy, lease.host, lease.port, lease.ttl,
                  " (sticky)" if lease.sticky else "")
        with self._lock:
            closed = self._closed.is_set()
            if not closed:
                self._leases[lease.id] = lease
        if closed:  # closed while the lease was being granted: give it back at once
            try:
                lease.release("ok")
            except ProxyOperatorError as exc:
                log.warning("lease %s: release after close failed: %s", lease.id, exc)
            raise ClientClosed("lease: the client was closed while the lease was granted (released again)")
        return lease

    def requests_session(self, *, ban_codes=DEFAULT_BAN_CODES, **lease_kwargs: Any) -> requests.Session:
        """A ``requests.Session`` leasing a proxy per request for the request's host as target
        (:class:`TargetedSession`): every request goes out through an egress IP that site has not
        banned and no other crawler uses for it at the limit, and a ban answer (``ban_codes``)
        of the site bans that IP for that site only (not one the proxy made itself, nor a
        timeout: :class:`TargetedSession`).

        Args:
            ban_codes: the site's HTTP statuses that mean "banned" (403, 429).
            lease_kwargs: more keyword arguments of :meth:`lease` (``pool``, ``labels``, ``ttl``,
                ``wait``, ...; not ``target``).
        Returns:
            the session (the caller closes it).
        Raises:
            ValueError: ``target`` given (each request's host is its target).
        """
        if "target" in lease_kwargs:
            raise ValueError("target: each request's host is its target; lease(target=...) leases for one")
        return TargetedSession(self, ban_codes, lease_kwargs)

    def httpx_client(self, *, ban_codes=DEFAULT_BAN_CODES, lease: Optional[Dict[str, Any]] = None, **kwargs: Any):
        """An ``httpx.Client`` leasing a proxy per request for the request's host as target, as
        :meth:`requests_session` does (a transport of its own; the body is read whole before the
        lease is released).  Needs ``httpx``.

        Args:
            ban_codes: the site's HTTP statuses that mean "banned" (403, 429).
            lease: keyword arguments of :meth:`lease` (``pool``, ``labels``, ``ttl``, ``wait``).
            kwargs: more arguments of ``httpx.Client`` (not ``transport`` or ``proxy``).
        Raises:
            ImportError: httpx is not installed.
        """
        import httpx

        return httpx.Client(transport=_targeted_transport(self, ban_codes, dict(lease or {}), False), **kwargs)

    def httpx_async_client(self, *, ban_codes=DEFAULT_BAN_CODES, lease: Optional[Dict[str, Any]] = None,
                           **kwargs: Any):
        """Like :meth:`httpx_client`, an ``httpx.AsyncClient`` (API calls run in a thread)."""
        import httpx

        return httpx.AsyncClient(transport=_targeted_transport(self, ban_codes, dict(lease or {}), True), **kwargs)

    def proxies(self, *, pool: Optional[str] = None, provider: Optional[str] = None, zone: Optional[str] = None,
                labels: Labels = None, healthy: Optional[bool] = None, namespace: Optional[str] = None) -> List[dict]:
        """The published proxies (``GET /v1/proxies``), filtered like :meth:`lease`; each a dict
        as the API gives it (``namespace``, ``name``, ``address``, ``port``, ``provider``,
        ``zone``, ``egressIP``, ``labels``, ``pool``, ``draining``, ``health``,
        ``leases: {used, max}``).  No credentials.

        Raises:
            ApiError, TransportError, ClientClosed; ValueError as for :meth:`lease`.
        """
        filters = self._filters(pool, namespace)
        params: Dict[str, str] = dict(filters)
        for key, value in (("provider", provider), ("zone", zone), ("selector", selector_of(labels))):
            if value is not None:
                params[key] = value
        if healthy is not None:
            params["healthy"] = "true" if healthy else "false"
        try:
            return self._request("GET", "/v1/proxies", params=params, operation="proxies")["items"]
        except ApiError as exc:
            legacy = self._legacy(exc, filters)
            if legacy is None:
                raise
            params = {**{k: v for k, v in params.items() if k not in filters}, **legacy}
            return self._request("GET", "/v1/proxies", params=params, operation="proxies")["items"]

    def held(self) -> List[Lease]:
        """The leases made by this client and not released yet (lost ones included)."""
        with self._lock:
            return list(self._leases.values())

    def release_all(self, outcome: str = "ok") -> List[Released]:
        """Release every lease this client holds with ``outcome``; errors are logged, not raised.

        Returns:
            the :class:`Released` results of the leases released.
        """
        results = []
        for lease in self.held():
            try:
                results.append(lease.release(outcome))
            except ProxyOperatorError as exc:
                log.warning("lease %s on proxy %s: release failed: %s", lease.id, lease.proxy, exc)
        return results

    def close(self) -> None:
        """Stop: calls waiting for a proxy raise :class:`ClientClosed`, a lease granted meanwhile
        is given back, every held lease is released ``ok``, connections are closed.  Idempotent."""
        self._closed.set()
        self.release_all("ok")
        with self._lock:
            sessions, self._sessions = self._sessions, []
        for session in sessions:
            session.close()

    def __enter__(self) -> "Client":
        return self

    def __exit__(self, *exc) -> bool:
        self.close()
        return False


def _maybe_sent(exc: TransportError) -> bool:
    """Whether the request that failed with ``exc`` may have reached the API (a read timeout, a
    connection dropped after sending); ``False`` when no connection could be made at all."""
    cause = exc.__cause__
    reason = getattr(cause.args[0], "reason", None) if isinstance(cause, requests.RequestException) and cause.args \
        else None
    return not isinstance(cause, requests.exceptions.ConnectTimeout) and not isinstance(reason, NewConnectionError)


def _api_error(resp: requests.Response) -> ApiError:
    """The :class:`ApiError` of an error answer."""
    retry_after = parse_retry_after(resp.headers.get("Retry-After"))
    try:
        doc = resp.json()
    except ValueError:
        doc = None
    if isinstance(doc, dict) and isinstance(doc.get("error"), str):
        target = doc.get("target") if isinstance(doc.get("target"), str) else None
        return ApiError(resp.status_code, doc["error"], str(doc.get("message", "")), doc.get("field"), retry_after,
                        target)
    return ApiError(resp.status_code, "unexpected_response",
                    f"HTTP {resp.status_code} {resp.reason or ''}".strip() + " without the API's JSON error",
                    None, retry_after)


def _version() -> str:
    from proxy_operator_client import __version__

    return __version__

