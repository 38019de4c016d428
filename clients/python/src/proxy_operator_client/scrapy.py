"""A Scrapy downloader middleware that sends every request through a proxy leased from
proxy-operator, rotates on bans and gives every lease back when the spider closes.

Enable it in the project's settings (needs ``pip install 'proxy-operator-client[scrapy]'``)::

    DOWNLOADER_MIDDLEWARES = {"proxy_operator_client.scrapy.ProxyLeaseMiddleware": 580}
    PROXY_OPERATOR_URL = "http://proxy-api:8080"
    PROXY_OPERATOR_TOKEN = "..."            # or the environment variable PROXY_OPERATOR_TOKEN

The priority must stay between 550 (``RetryMiddleware``) and 590
(``HttpCompressionMiddleware``): requests then get their proxy before
``HttpProxyMiddleware`` (750) turns its credentials into a ``Proxy-Authorization`` header,
and responses reach the ban detection decompressed and before ``RetryMiddleware`` retries a
429 through the banned proxy.

Settings:

========================================  ==========================================================
``PROXY_OPERATOR_URL``                    the API's base URL (required unless disabled)
``PROXY_OPERATOR_TOKEN``                  bearer token (else the ``PROXY_OPERATOR_TOKEN`` env var)
``PROXY_OPERATOR_ENABLED``                ``True``; ``False`` turns the middleware off
``PROXY_OPERATOR_POOL``                   only members of this ProxyPool (``name`` or
                                          ``namespace/name``)
``PROXY_OPERATOR_NAMESPACE``              only Proxies of this namespace
``PROXY_OPERATOR_PROVIDER``, ``_ZONE``    only proxies of this provider / zone
``PROXY_OPERATOR_LABELS``                 dict (every label must match) or a label-selector string
``PROXY_OPERATOR_TTL``                    lease TTL, seconds (300); renewed in the background
``PROXY_OPERATOR_WAIT``                   seconds to wait for a proxy when none is free (60)
``PROXY_OPERATOR_TIMEOUT``                seconds per API call (10)
``PROXY_OPERATOR_BAN_CODES``              statuses that mean "banned" (``[403, 429]``)
``PROXY_OPERATOR_BAN_DETECTOR``           callable ``(request, response) -> bool`` (or its import
                                          path) that also detects bans, e.g. a captcha page
``PROXY_OPERATOR_BAN_RETRY_TIMES``        retries of a banned request (default: the request's
                                          ``max_retry_times`` meta, else ``RETRY_TIMES``)
``PROXY_OPERATOR_THREADS``                threads for API calls (8), apart from the reactor's pool
``PROXY_OPERATOR_TARGETS``                ``True``: lease for the request's host as ``target`` (bans
                                          per site, one crawler per site and egress IP);
                                          ``False``: leases for no site in particular
========================================  ==========================================================

Behaviour:

* One lease per download slot (by default one per domain), or per
  ``request.meta["proxy_session"]`` when set: a sticky session for multi-step flows (sent to the
  API as ``sessionKey``; keys outside ``A-Za-z0-9._:-`` or over 128 characters are hashed).
  With ``PROXY_OPERATOR_TARGETS`` (the default) the lease is asked for the request's host as
  ``target``, and slots and sessions are keyed on the target too: a ban then holds for that
  site only, and the API never gives two crawlers one egress IP for one site at once.  A site
  refusing every egress IP (``429 target_refusing``) is waited out within
  ``PROXY_OPERATOR_WAIT``, else its requests fail with that :class:`~proxy_operator_client.ApiError`
  (stat ``errors/target_refusing``, a log line naming the site); no proxy is cooled down.
  ``request.meta["dont_proxy_operator"] = True`` leaves a request alone (it is then fetched
  without a leased proxy).  Every other request waits for its lease; when none can be had
  within ``PROXY_OPERATOR_WAIT`` the request fails with :class:`~proxy_operator_client.ApiError`
  (``no_proxy_available``): a page is never fetched without a proxy.
* A response the proxy made itself is never a ban (:func:`proxy_refusal`): Squid's error
  pages (``X-Squid-Error``; the operator's Squid also marks them ``X-Proxy-Operator-Error`` and
  names the class of the rule that refused in ``X-Proxy-Operator-Denied``) and ``407``.  It is
  logged as the proxy's refusal with Squid's reason (and the rule class), counted, and goes on
  (the lease is kept; ``RetryMiddleware`` retries a ``502``/``503``/``504`` as it does any).
* A response whose status is in ``PROXY_OPERATOR_BAN_CODES``, or that the ban detector flags,
  ends its lease as ``blocked`` (with a target: that egress IP is banned for that site; else
  the proxy cools down for this client), and the request is
  retried through a new lease with :func:`scrapy.downloadermiddlewares.retry.get_retry_request`
  (reason ``proxy_operator_ban``: ``retry_times`` meta, ``retry/*`` stats, give-up log).  When
  its retries are used up the banned response goes on to the spider.  The next lease for that
  site waits until the API has the report (a ``blocked`` or ``failed`` release is answered):
  the banned IP is never leased again for the site by a report still in flight, and a site
  refusing everyone is known as such after its refusals, not a few IPs later.
* A refused connection to the proxy, or a CONNECT it did not answer in HTTP, ends the lease as
  ``failed``; a ``407`` (credentials changed) ends it ``ok``; the request is retried through a
  new lease (by ``RetryMiddleware`` for the exceptions).  A CONNECT the proxy refused with
  another status is its refusal (above): logged, the lease kept.
* A lease the API ends behind our back (proxy turned unhealthy or drained) is replaced at the
  next request.
* When the spider closes, every lease is released (``ok``) before the close completes; a lease
  granted during the close is given back at once.

Stats (``proxy_operator/...``): ``leases/taken``, ``leases/released/<outcome>``,
``leases/lost``, ``bans`` and ``bans/<namespace>/<name>`` (leases ended as blocked),
``banned_responses``, ``proxy_failures/<namespace>/<name>``, ``proxy_refusals`` and
``proxy_refusals/<Squid error>`` (responses the proxy made itself), ``retries``, ``errors/<code>``.
No stat, log line or ``repr`` shows the token or a proxy's credentials (the proxy URL with
credentials lives in ``request.meta["proxy"]`` only until ``HttpProxyMiddleware`` moves them
into the request's ``Proxy-Authorization`` header; a retried request is sent back to the
scheduler without either).
"""

from __future__ import annotations

import hashlib
import logging
import os
import re
from typing import Any, Callable, Dict, List, Optional, Tuple

from scrapy import signals
from scrapy.downloadermiddlewares.retry import get_retry_request
from scrapy.exceptions import IgnoreRequest
from scrapy.utils.defer import maybe_deferred_to_future
from scrapy.utils.httpobj import urlparse_cached
from scrapy.utils.misc import load_object
from twisted.internet import defer, threads
from twisted.python.failure import Failure
from twisted.python.threadpool import ThreadPool

from proxy_operator_client.client import Client, Lease, squid_error
from proxy_operator_client.errors import ApiError, ClientClosed, ProxyOperatorError

log = logging.getLogger(__name__)

#: ``request.meta`` key of a sticky session (one lease per distinct value).
META_SESSION = "proxy_session"
#: ``request.meta`` key that, when true, leaves the request alone.
META_SKIP = "dont_proxy_operator"
#: ``request.meta`` key the middleware keeps its bookkeeping under: ``{"key", "lease", "proxy"}``
#: (plain values: requests may be serialized to a disk queue).
META_LEASE = "_proxy_operator"
DEFAULT_BAN_CODES = (403, 429)
_SESSION_KEY = re.compile(r"^[A-Za-z0-9._:-]{1,128}$")
STATS = "proxy_operator"
#: The operator's Squid's mark of a refusal by one of its rules (the rule's class); a site's
#: header of this name never reaches the client.
DENIED_HEADER = "X-Proxy-Operator-Denied"
#: The classes of the operator's Squid rules (``X-Proxy-Operator-Denied``) and what each refuses.
DENY_RULES = {
    "source": "the crawler's address is outside the proxy's allowedSourceRanges",
    "manager": "Squid's cache manager",
    "connect-port": "a CONNECT to a port outside the proxy's connectPorts",
    "http-port": "a plain-HTTP request to a port outside the proxy's httpPorts",
    "metadata-name": "a cloud metadata server's name",
    "metadata-address": "a cloud metadata server's address",
    "destination": "a destination address the proxy denies (loopback, link-local or its deniedDestinations)",
    "default": "no rule of the proxy allowed the request",
}


class ProxyRefusal:
    """A response the proxy made itself (see :func:`proxy_refusal`).

    Attributes:
        status: its HTTP status.
        error: Squid's error (``"ERR_ACCESS_DENIED"``), or ``None`` (a bare ``407``).
        rule: the class of the operator's Squid rule that refused (a key of
            :data:`DENY_RULES`: ``"destination"``...), or ``None``.
    """

    def __init__(self, status: int, error: Optional[str], rule: Optional[str]) -> None:
        self.status, self.error, self.rule = status, error, rule

    def __str__(self) -> str:
        text = f"HTTP {self.status}" + (f" {self.error}" if self.error else "")
        if self.rule:
            text += f", by its {self.rule!r} rule ({DENY_RULES[self.rule]})"
        return text

    def __repr__(self) -> str:
        return f"ProxyRefusal(status={self.status}, error={self.error!r}, rule={self.rule!r})"


def proxy_refusal(response) -> Optional[ProxyRefusal]:
    """Whether Scrapy's ``response`` was made by the proxy rather than the site: a ``407``, or
    an error page of Squid's (``X-Squid-Error``, or the operator's ``X-Proxy-Operator-Error``;
    a ``403`` for a refused destination, its ``502``/``503``/``504`` when the site cannot be
    reached).  Only Squid's error name and a known rule class are read from the headers (a
    value of another shape is ignored), never any other text of the page.

    Returns:
        the :class:`ProxyRefusal`, or ``None`` for the site's own response.  A site behind its
        own Squid that refuses a request is taken for the proxy: Squid's header does not say
        which Squid made the page (the operator's Squid says so with ``X-Proxy-Operator-Error``).
    """
    def header(name: str) -> str:
        value = response.headers.get(name)
        return value.decode("latin-1").strip() if isinstance(value, bytes) else ""

    error = squid_error(header)
    if error is None and response.status != 407:
        return None
    rule = header(DENIED_HEADER)
    return ProxyRefusal(response.status, error, rule if rule in DENY_RULES else None)


def _proxy_failures() -> Tuple[type, ...]:
    """Exceptions that say the proxy itself failed (not the target site)."""
    found: List[type] = []
    for path in ("twisted.internet.error.ConnectionRefusedError",
                 "scrapy.exceptions.DownloadConnectionRefusedError",
                 "scrapy.core.downloader.handlers.http11.TunnelError"):
        try:
            found.append(load_object(path))
        except (ImportError, AttributeError, NameError, ValueError):
            pass
    return tuple(found)


_TUNNEL_STATUS = re.compile(r"'status': (\d{3})\b")


def _tunnel_status(exception) -> Optional[int]:
    """The HTTP status the proxy answered a CONNECT with, from Scrapy's ``TunnelError``
    (``Could not open CONNECT tunnel with proxy h:p [{'status': 403, 'reason': b'Forbidden'}]``),
    or ``None`` (another exception, or an answer that was not HTTP)."""
    if type(exception).__name__ != "TunnelError":
        return None
    m = _TUNNEL_STATUS.search(str(exception))
    return int(m.group(1)) if m else None


def session_key(value: Any) -> str:
    """The API ``sessionKey`` for a ``proxy_session`` meta value: itself when it is 1-128 of
    ``A-Za-z0-9._:-``, else ``h:`` + the first 40 hex digits of its SHA-256."""
    text = str(value)
    if _SESSION_KEY.match(text):
        return text
    return "h:" + hashlib.sha256(text.encode("utf-8")).hexdigest()[:40]


class ProxyLeaseMiddleware:
    """Downloader middleware leasing proxies from proxy-operator (see the module docstring for
    settings, behaviour and stats).

    Args:
        crawler: the Scrapy crawler (settings, stats, signals, engine).
        client: the :class:`~proxy_operator_client.Client` it leases with (closed when the
            spider closes).
        filters: keyword arguments of :meth:`Client.lease` (``pool``, ``namespace``, ``provider``, ``zone``,
            ``labels``, ``ttl``, ``wait``).
        ban_codes: HTTP statuses that mean the proxy is banned.
        ban_detector: ``(request, response) -> bool``, or ``None``.
        ban_retry_times: retries of a banned request, or ``None`` for Scrapy's default.
        threads: size of the thread pool the blocking API calls run in.
        targets: lease for each request's host as ``target`` (keys per target too).
    """

    def __init__(self, crawler, client: Client, *, filters: Dict[str, Any], ban_codes=DEFAULT_BAN_CODES,
                 ban_detector: Optional[Callable[[Any, Any], bool]] = None, ban_retry_times: Optional[int] = None,
                 threads: int = 8, targets: bool = True) -> None:
        from twisted.internet import reactor

        self.crawler = crawler
        self.stats = crawler.stats
        self.client = client
        self.filters = dict(filters)
        self.ban_codes = frozenset(int(c) for c in ban_codes)
        self.ban_detector = ban_detector
        self.ban_retry_times = ban_retry_times
        self.targets = targets
        self._leases: Dict[Tuple[str, str, str], Lease] = {}
        self._waiters: Dict[Tuple[str, str, str], List[defer.Deferred]] = {}
        self._releases: set = set()
        #: the ``blocked``/``failed`` releases under way, per site (``target``; the key without
        #: targets): the next lease for that site waits for them (:meth:`_lease_for`)
        self._reports: Dict[Any, set] = {}
        self._closed = False
        self._failures = _proxy_failures()
        self._pool = ThreadPool(minthreads=0, maxthreads=max(1, int(threads)), name="proxy-operator-client")
        self._pool.start()
        self._pool_stopped = False
        self._reactor = reactor
        reactor.addSystemEventTrigger("during", "shutdown", self._stop_pool)

    @classmethod
    def from_crawler(cls, crawler) -> "ProxyLeaseMiddleware":
        """Build the middleware from the crawler's settings.

        Raises:
            NotConfigured: ``PROXY_OPERATOR_ENABLED`` is false.
            ValueError: ``PROXY_OPERATOR_URL`` or the token missing, ``HTTPPROXY_ENABLED`` false,
                or a malformed setting (naming it; the token's value is never shown).
        """
        from scrapy.exceptions import NotConfigured

        s = crawler.settings
        if not s.getbool("PROXY_OPERATOR_ENABLED", True):
            raise NotConfigured("PROXY_OPERATOR_ENABLED is false")
        if not s.getbool("HTTPPROXY_ENABLED", True):
            raise ValueError("HTTPPROXY_ENABLED: must stay true: HttpProxyMiddleware sends the leased proxy's "
                             "credentials")
        url = s.get("PROXY_OPERATOR_URL")
        if not url:
            raise ValueError("PROXY_OPERATOR_URL: required (the discovery API's URL), or set "
                             "PROXY_OPERATOR_ENABLED = False")
        token = s.get("PROXY_OPERATOR_TOKEN") or os.environ.get("PROXY_OPERATOR_TOKEN")
        if not token:
            raise ValueError("PROXY_OPERATOR_TOKEN: required (setting or environment variable)")
        labels = s.get("PROXY_OPERATOR_LABELS")
        if isinstance(labels, str) and labels.strip().startswith("{"):
            labels = s.getdict("PROXY_OPERATOR_LABELS")
        detector = s.get("PROXY_OPERATOR_BAN_DETECTOR")
        if isinstance(detector, str):
            detector = load_object(detector)
        if detector is not None and not callable(detector):
            raise ValueError("PROXY_OPERATOR_BAN_DETECTOR: must be a callable (request, response) -> bool "
                             "or its import path")
        retry_times = s.get("PROXY_OPERATOR_BAN_RETRY_TIMES")
        wait = s.getfloat("PROXY_OPERATOR_WAIT", 60.0)
        client = Client(url, token, wait=wait, timeout=s.getfloat("PROXY_OPERATOR_TIMEOUT", 10.0))
        filters = {"pool": s.get("PROXY_OPERATOR_POOL") or None, "namespace": s.get("PROXY_OPERATOR_NAMESPACE") or None,
                   "provider": s.get("PROXY_OPERATOR_PROVIDER") or None,
                   "zone": s.get("PROXY_OPERATOR_ZONE") or None, "labels": labels or None,
                   "ttl": s.getint("PROXY_OPERATOR_TTL", 300), "wait": wait}
        codes = [int(c) for c in s.getlist("PROXY_OPERATOR_BAN_CODES", list(DEFAULT_BAN_CODES))]
        mw = cls(crawler, client, filters=filters, ban_codes=codes, ban_detector=detector,
                 ban_retry_times=None if retry_times in (None, "") else int(retry_times),
                 threads=s.getint("PROXY_OPERATOR_THREADS", 8),
                 targets=s.getbool("PROXY_OPERATOR_TARGETS", True))
        crawler.signals.connect(mw.spider_closed, signal=signals.spider_closed)
        return mw

    def __repr__(self) -> str:
        return f"<ProxyLeaseMiddleware {self.client!r} leases={len(self._leases)}>"

    # -- leases ------------------------------------------------------------------------
    def _key(self, request) -> Tuple[str, str, str]:
        """``(kind, value, target)``: the lease a request goes through (``target``: its host,
        ``""`` without targets)."""
        target = (urlparse_cached(request).hostname or "") if self.targets else ""
        session = request.meta.get(META_SESSION)
        if session is not None:
            return ("session", session_key(session), target)
        slot = request.meta.get("download_slot")
        if slot is None:
            downloader = self.crawler.engine.downloader
            if hasattr(downloader, "get_slot_key"):
                slot = downloader.get_slot_key(request)
            else:  # Scrapy before 2.13
                slot = downloader._get_slot_key(request, None)
        return ("slot", str(slot), target)

    def _take(self, key: Tuple[str, str, str]) -> Lease:
        """In a pool thread: lease a proxy for ``key``."""
        kind, value, target = key
        session = None
        if kind == "session":
            # one API session per site: a session key shared by two sites would rebind between them
            session = session_key(f"{value}:{target}") if target else value
        return self.client.lease(session_key=session, target=target or None, **self.filters)

    async def _lease_for(self, key: Tuple[str, str, str]) -> Lease:
        lease = self._leases.get(key)
        if lease is not None:
            if lease.alive:
                return lease
            del self._leases[key]
            self.stats.inc_value(f"{STATS}/leases/lost")
            self._release(lease, "ok")
        waiter: defer.Deferred = defer.Deferred()
        waiters = self._waiters.get(key)
        if waiters is None:
            self._waiters[key] = [waiter]
            # a ban or failure this crawler reported for the site reaches the API before its next
            # lease for the site: else that lease is granted before the API counts the report
            # (the banned IP looks free, a site refusing everyone looks like it refuses fewer)
            reports = list(self._reports.get(self._report_key(key), ()))
            task = defer.DeferredList(reports) if reports else defer.succeed(None)
            task.addCallback(lambda _: threads.deferToThreadPool(self._reactor, self._pool, self._take, key))
            task.addBoth(self._taken, key)
        else:
            waiters.append(waiter)
        return await maybe_deferred_to_future(waiter)

    def _taken(self, result, key: Tuple[str, str, str]) -> None:
        waiters = self._waiters.pop(key, [])
        if isinstance(result, Failure):
            err = result.value
            code = err.code if isinstance(err, ApiError) else type(err).__name__
            self.stats.inc_value(f"{STATS}/errors/{code}")
            if isinstance(err, ApiError) and code == "target_refusing":
                log.warning("proxy-operator: %s refuses every egress IP: its requests fail for now (retry after %s s; "
                            "no proxy is cooled down)", err.target or key[2], err.retry_after)
            elif not isinstance(err, ClientClosed):
                log.error("proxy-operator: no lease for %s %s: %s", key[0], key[1], err)
            for w in waiters:
                w.errback(result)
            return None
        lease: Lease = result
        self.stats.inc_value(f"{STATS}/leases/taken")
        if self._closed:
            self._release(lease, "ok")
            for w in waiters:
                w.errback(Failure(IgnoreRequest("proxy-operator: the spider is closing")))
            return None
        log.debug("proxy-operator: %s %s -> lease %s on %s", key[0], key[1], lease.id, lease.proxy)
        self._leases[key] = lease
        for w in waiters:
            w.callback(lease)
        return None

    def _release(self, lease: Lease, outcome: str) -> defer.Deferred:
        """Release ``lease`` in a pool thread; count it when done.  Returns the Deferred (never
        failing: errors are logged)."""
        if self._pool_stopped:  # after the close: the client released it already, this only reads the result
            d = defer.maybeDeferred(lease.release, outcome)
        else:
            d = threads.deferToThreadPool(self._reactor, self._pool, lease.release, outcome)

        def done(result):
            self._releases.discard(d)
            if isinstance(result, Failure):
                self.stats.inc_value(f"{STATS}/errors/release")
                log.warning("proxy-operator: release of lease %s on %s (%s) failed: %s", lease.id, lease.proxy,
                            outcome, result.value)
            else:
                self.stats.inc_value(f"{STATS}/leases/released/{result.outcome}")
            return None

        self._releases.add(d)
        d.addBoth(done)
        return d

    @staticmethod
    def _report_key(key: Tuple[str, str, str]) -> Any:
        """What a ``blocked``/``failed`` report applies to: the site (``target``), or without
        targets the key itself."""
        return key[2] or key

    def _end(self, info: Dict[str, Any], outcome: str) -> bool:
        """End the lease ``info`` names with ``outcome`` if it is still the current lease of its
        key (a response from an older lease of the key changes nothing).  Whether it was.  A
        ``blocked``/``failed`` release is held as under way for its site until the API answers."""
        key = tuple(info["key"])
        lease = self._leases.get(key)
        if lease is None or lease.id != info["lease"]:
            return False
        del self._leases[key]
        d = self._release(lease, outcome)
        if outcome != "ok" and not d.called:
            site = self._report_key(key)
            under_way = self._reports.setdefault(site, set())
            under_way.add(d)

            def reported(_):
                under_way.discard(d)
                if not under_way and self._reports.get(site) is under_way:
                    del self._reports[site]

            d.addBoth(reported)
        return True

    # -- downloader middleware API -----------------------------------------------------
    async def process_request(self, request, spider=None):
        """Give ``request`` the proxy of its key's lease (``request.meta["proxy"]``), leasing
        one first when needed.

        Raises:
            ApiError: no lease could be had (``no_proxy_available`` after
                ``PROXY_OPERATOR_WAIT``, ``unauthorized``, ...): the request fails.
            TransportError: the API is unreachable.
            IgnoreRequest: the spider is closing.
        """
        if request.meta.get(META_SKIP):
            return None
        if self._closed:
            raise IgnoreRequest("proxy-operator: the spider is closing")
        key = self._key(request)
        lease = await self._lease_for(key)
        request.meta["proxy"] = lease.proxy_url
        request.meta[META_LEASE] = {"key": list(key), "lease": lease.id, "proxy": str(lease.proxy)}
        return None

    def is_ban(self, request, response) -> bool:
        """Whether ``response`` says the proxy is banned: its status is one of the ban codes, or
        the ban detector says so; never a response the proxy made itself (:func:`proxy_refusal`)."""
        if proxy_refusal(response) is not None:
            return False
        if response.status in self.ban_codes:
            return True
        return bool(self.ban_detector and self.ban_detector(request, response))

    def process_response(self, request, response, spider=None):
        """Rotate on a ban (or a 407): end the lease and return a retry of the request, or the
        response itself when the request's retries are used up."""
        info = request.meta.get(META_LEASE)
        if not info or request.meta.get(META_SKIP):
            return response
        refusal = proxy_refusal(response)
        if refusal is not None:
            self._refused(request, info, refusal)
            if response.status == 407:
                self._end(info, "ok")
                return self._retry(request, response, "proxy_operator_proxy_auth")
            return response
        if not self.is_ban(request, response):
            return response
        self.stats.inc_value(f"{STATS}/banned_responses")
        if self._end(info, "blocked"):
            self.stats.inc_value(f"{STATS}/bans")
            self.stats.inc_value(f"{STATS}/bans/{info['proxy']}")
            log.info("proxy-operator: proxy %s banned by %s (HTTP %s): lease released as blocked", info["proxy"],
                     urlparse_cached(request).hostname or "?", response.status)
        return self._retry(request, response, "proxy_operator_ban")

    def _refused(self, request, info: Dict[str, Any], refusal: ProxyRefusal, what: str = "request") -> None:
        """Count and log a response the proxy made itself (the destination's host only: never
        the URL, which may carry credentials or user data)."""
        self.stats.inc_value(f"{STATS}/proxy_refusals")
        kind = refusal.error or (f"CONNECT_{refusal.status}" if what == "CONNECT" else str(refusal.status))
        self.stats.inc_value(f"{STATS}/proxy_refusals/{kind}")
        host = urlparse_cached(request).hostname or "?"
        log.warning("proxy-operator: proxy %s refused the %s to %s: %s; not a ban, the lease is %s",
                    info["proxy"], what, host, refusal, "ended ok" if refusal.status == 407 else "kept")

    def process_exception(self, request, exception, spider=None):
        """End the lease as ``failed`` when the proxy itself failed; ``RetryMiddleware`` then
        retries the request, which gets a new lease.  A CONNECT the proxy answered with an error
        status (Scrapy's ``TunnelError`` carries only the status: a ``403`` of its policy, a
        ``503`` when it cannot reach the site) is the proxy's refusal, as for a response: logged,
        the lease kept (a ``407``: the lease ends ``ok``, its credentials changed)."""
        info = request.meta.get(META_LEASE)
        status = _tunnel_status(exception)
        if info and status is not None:
            self._refused(request, info, ProxyRefusal(status, None, None), what="CONNECT")
            if status == 407:
                self._end(info, "ok")
            return None
        if info and self._failures and isinstance(exception, self._failures) and self._end(info, "failed"):
            self.stats.inc_value(f"{STATS}/proxy_failures/{info['proxy']}")
            log.warning("proxy-operator: proxy %s failed (%s): lease released as failed", info["proxy"],
                        type(exception).__name__)
        return None

    def _retry(self, request, response, reason: str):
        new = get_retry_request(request, spider=self.crawler.spider, reason=reason,
                                max_retry_times=self.ban_retry_times)
        if new is None:
            return response
        self.stats.inc_value(f"{STATS}/retries")
        # back to the scheduler (maybe a disk queue) without the old proxy or its credentials
        for name in ("proxy", "_auth_proxy", META_LEASE):
            new.meta.pop(name, None)
        if b"Proxy-Authorization" in new.headers:
            del new.headers[b"Proxy-Authorization"]
        return new

    # -- closing -----------------------------------------------------------------------
    async def spider_closed(self, spider=None, reason=None) -> None:
        """Release every lease (``ok``), wait for the releases under way, close the client
        (a lease still being granted is given back), stop the thread pool."""
        self._closed = True
        leases, self._leases = list(self._leases.values()), {}
        for lease in leases:
            self._release(lease, "ok")
        pending = list(self._releases)  # these and the releases (blocked, failed) still under way
        await maybe_deferred_to_future(defer.DeferredList(pending, consumeErrors=True))
        try:
            await maybe_deferred_to_future(threads.deferToThreadPool(self._reactor, self._pool, self.client.close))
        except ProxyOperatorError as exc:
            log.warning("proxy-operator: closing the client: %s", exc)
        # acquisitions interrupted by the close have failed their waiters by now
        self._stop_pool()
        log.info("proxy-operator: every lease released (%s this close)", len(leases))

    def _stop_pool(self) -> None:
        if not self._pool_stopped:
            self._pool_stopped = True
            self._pool.stop()
