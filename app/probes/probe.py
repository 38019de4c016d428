"""One probe: ``GET healthCheck.url`` through a proxy, and the egress IP it exposes.

Plain-HTTP URLs are sent to the proxy as absolute-URI requests; HTTPS URLs go through a
``CONNECT`` tunnel (urllib3's ``ProxyManager`` does both).  Every failure is told apart by
reason (:data:`REASONS`) so the Healthy condition says what went wrong.  Probes are I/O-bound:
:func:`probe_many` runs a batch on a thread pool, never one after another.

Credentials for proxies with basic auth come from the caller (a ``(user, password)`` pair on
the :class:`ProbeTarget`); they are sent as ``Proxy-Authorization`` and never appear in a
result, message or log.
"""

from __future__ import annotations

import errno
import http
import http.client
import ipaddress
import json
import re
import ssl
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

import urllib3
from urllib3 import exceptions as u3
from urllib3.poolmanager import ProxyConfig

if TYPE_CHECKING:
    from app.probes.destinations import DestinationPolicy

OK = "ProbeSucceeded"
CONNECTION_REFUSED = "ConnectionRefused"
TIMEOUT = "Timeout"
PROXY_AUTH_REQUIRED = "ProxyAuthRequired"
UNEXPECTED_STATUS = "UnexpectedStatus"
TLS_ERROR = "TLSError"
TUNNEL_FAILED = "TunnelFailed"
CONNECTION_RESET = "ConnectionReset"
CONNECTION_FAILED = "ConnectionFailed"
#: The endpoint or the health URL is in a denied range (:mod:`app.probes.destinations`):
#: nothing was sent.
DESTINATION_DENIED = "DestinationDenied"
#: The health URL answered ``429 Too Many Requests`` through the proxy: the proxy works, its
#: egress IP is rate limited.  ``Retry-After`` is kept on the result (:attr:`ProbeResult.retry_after`).
RATE_LIMITED = "RateLimited"

#: Every failure reason, as shown in the Healthy condition and the failure metric.
REASONS = (CONNECTION_REFUSED, TIMEOUT, PROXY_AUTH_REQUIRED, UNEXPECTED_STATUS, TLS_ERROR,
           TUNNEL_FAILED, CONNECTION_RESET, CONNECTION_FAILED, DESTINATION_DENIED, RATE_LIMITED)

#: Longest ``Retry-After`` honoured, seconds (a larger one is cut to this).
MAX_RETRY_AFTER = 3600.0

_BODY_LIMIT = 64 * 1024
_ECHO_LIMIT = 4096
_TUNNEL = re.compile(r"Tunnel connection failed: (\d{3})\s*(.*)")
_SQUID_ERROR = re.compile(r"ERR_[A-Z0-9_]{1,40}(?: -?\d{1,6})?")


@dataclass(frozen=True)
class ProbeTarget:
    """What to probe.

    Attributes:
        uid: the Proxy's uid (for the caller's bookkeeping).
        host / port: the proxy's endpoint.
        url: ``healthCheck.url``.
        expected_status: ``healthCheck.expectedStatus``.
        timeout: ``healthCheck.timeoutSeconds`` (whole request: connect, tunnel, answer).
        want_egress: whether to fetch the IP-echo URL too (only after a successful GET).
        credentials: ``(user, password)`` for a proxy with basic auth, else ``None``.
        external: the endpoint was chosen by a Proxy author (an External Proxy): the
            destination policy's external-only ranges apply to it too.  ``False`` only for a
            Managed proxy, whose endpoint the provider gave.
    """

    uid: str
    host: str
    port: int
    url: str
    expected_status: int = 204
    timeout: float = 10.0
    want_egress: bool = False
    credentials: tuple[str, str] | None = None
    external: bool = True

    def __repr__(self) -> str:  # keep credentials out of any repr/log
        return f"ProbeTarget(uid={self.uid!r}, host={self.host!r}, port={self.port}, url={self.url!r})"


@dataclass(frozen=True)
class ProbeResult:
    """The outcome of one probe.

    Attributes:
        uid: the target's uid.
        ok: whether the GET answered ``expected_status``.
        reason: :data:`OK` or one of :data:`REASONS`.
        message: one human-readable line (no credentials).
        status: HTTP status received (of the GET, or of a refused CONNECT), else ``None``.
        latency_ms: time to the answer or the failure, milliseconds.
        started: epoch seconds when the probe started.
        egress_ip: the address the IP-echo URL saw, when asked and learnt.
        egress_error: why the egress IP could not be learnt, when asked and not learnt.
        retry_after: seconds the origin asked to wait (``Retry-After`` of a 429), capped at
            :data:`MAX_RETRY_AFTER`; ``None`` when it gave none.
    """

    uid: str
    ok: bool
    reason: str
    message: str
    status: int | None
    latency_ms: float
    started: float
    egress_ip: str | None = None
    egress_error: str | None = None
    retry_after: float | None = None


_contexts: dict[str | None, ssl.SSLContext] = {}
_contexts_lock = threading.Lock()


def ssl_context(ca_bundle: str | None) -> ssl.SSLContext:
    """Return a shared verifying client context (loading CA certificates costs milliseconds of
    CPU, so one context per process and CA file is reused by every probe)."""
    with _contexts_lock:
        ctx = _contexts.get(ca_bundle)
        if ctx is None:
            ctx = ssl.create_default_context(cafile=ca_bundle)
            _contexts[ca_bundle] = ctx
        return ctx


def _errno_in_chain(exc: BaseException | None) -> int | None:
    seen = 0
    while exc is not None and seen < 10:
        if isinstance(exc, OSError) and exc.errno:
            return exc.errno
        exc = exc.__cause__ or exc.__context__
        seen += 1
    return None


def classify(exc: BaseException, where: str) -> tuple[str, str, int | None]:
    """Map an exception raised by urllib3 (``retries=False``) to ``(reason, message, status)``.

    Args:
        exc: the exception.
        where: ``"proxy H:P"`` — named in the message.
    """
    if isinstance(exc, u3.ProxyError):
        inner = exc.original_error if getattr(exc, "original_error", None) is not None else exc.__cause__
        if inner is not None and inner is not exc:
            return classify(inner, where)
    code = _errno_in_chain(exc)
    # urllib3 2.x: NewConnectionError subclasses ConnectTimeoutError, so look at it first.
    if isinstance(exc, u3.NewConnectionError) or code in (errno.ECONNREFUSED, errno.EHOSTUNREACH,
                                                           errno.ENETUNREACH):
        if code == errno.ECONNREFUSED:
            return CONNECTION_REFUSED, f"{where} refused the connection", None
        if code == errno.ETIMEDOUT or (code is None and "timed out" in str(exc)):
            return TIMEOUT, f"connecting to {where} timed out", None
        return CONNECTION_FAILED, f"cannot connect to {where}: {_short(exc)}", None
    if isinstance(exc, u3.ConnectTimeoutError):
        return TIMEOUT, f"connecting to {where} timed out", None
    if isinstance(exc, (u3.ReadTimeoutError, TimeoutError, u3.TimeoutError)):
        return TIMEOUT, f"no answer through {where} within the timeout", None
    if isinstance(exc, u3.SSLError) or isinstance(exc, ssl.SSLError):
        return TLS_ERROR, f"TLS with the origin through {where} failed: {_short(exc)}", None
    text = str(exc)
    m = _TUNNEL.search(text)
    if m:
        status = int(m.group(1))
        if status == 407:
            return PROXY_AUTH_REQUIRED, f"{where} requires proxy authentication (407 on CONNECT)", 407
        # The reason phrase is the peer's own text: only the standard phrase of the code is shown.
        return TUNNEL_FAILED, f"{where} refused the CONNECT tunnel: {status} {_phrase(status)}".rstrip(), status
    if isinstance(exc, u3.ProtocolError) or code in (errno.ECONNRESET, errno.EPIPE):
        return CONNECTION_RESET, f"{where} closed or reset the connection: {_short(exc)}", None
    return CONNECTION_FAILED, f"request through {where} failed: {_short(exc)}", None


def _phrase(status: int) -> str:
    try:
        return http.HTTPStatus(status).phrase
    except ValueError:
        return ""


#: What the endpoint sent when it is no HTTP proxy at all (an SSH, Redis or SMTP banner): never
#: copied into a message, which lands in the Proxy's conditions, readable by its author.
_NOT_HTTP = (http.client.BadStatusLine, http.client.LineTooLong, http.client.UnknownProtocol)


def _not_http(exc: BaseException) -> bool:
    todo, seen = [exc], 0
    while todo and seen < 20:
        cur = todo.pop()
        seen += 1
        if isinstance(cur, _NOT_HTTP):
            return True
        todo += [e for e in (cur.__cause__, cur.__context__, getattr(cur, "reason", None),
                             getattr(cur, "original_error", None), *cur.args)
                 if isinstance(e, BaseException) and e is not cur]
    return False


def _short(exc: BaseException) -> str:
    if _not_http(exc):
        return "the answer is not HTTP (its bytes are not shown)"
    inner = exc
    for _ in range(5):  # the innermost cause is the informative part
        nxt = getattr(inner, "reason", None) or inner.__cause__
        if nxt is None or nxt is inner or not isinstance(nxt, BaseException):
            break
        inner = nxt
    return (str(inner) or type(inner).__name__)[:300]


def parse_retry_after(value: str | None, now: float | None = None) -> float | None:
    """Return the seconds a ``Retry-After`` header asks for, or ``None``.

    Accepts both forms of RFC 9110 §10.2.3 (https://www.rfc-editor.org/rfc/rfc9110#section-10.2.3):
    a number of seconds, or an HTTP-date (seconds until then, from ``now``).  The answer is
    between 0 and :data:`MAX_RETRY_AFTER`; anything unparsable gives ``None``.
    """
    if not value:
        return None
    text = value.strip()
    if text.isdigit():
        return min(MAX_RETRY_AFTER, float(text))
    try:
        from email.utils import parsedate_to_datetime

        when = parsedate_to_datetime(text)
    except (TypeError, ValueError, IndexError):
        return None
    if when is None:
        return None
    if when.tzinfo is None:  # the asctime form carries no zone; every HTTP-date is UTC
        from datetime import timezone

        when = when.replace(tzinfo=timezone.utc)
    now = time.time() if now is None else now
    return max(0.0, min(MAX_RETRY_AFTER, when.timestamp() - now))


def parse_egress(body: bytes) -> str:
    """Return the IP address in an IP-echo answer.

    Accepts the address as plain text, or JSON ``{"ip": ...}`` / ``{"origin": ...}`` (the first
    address of a comma-separated ``origin`` counts).

    Raises:
        ValueError: no address in the answer.
    """
    text = body.decode("utf-8", "replace").strip()
    candidate = text
    if text.startswith("{"):
        try:
            doc = json.loads(text)
        except ValueError:
            raise ValueError("IP-echo answered malformed JSON") from None
        candidate = str(doc.get("ip") or doc.get("origin") or "") if isinstance(doc, dict) else ""
        candidate = candidate.split(",")[0].strip()
    try:
        return str(ipaddress.ip_address(candidate))
    except ValueError:
        raise ValueError(f"IP-echo answer is not an IP address: {text[:60]!r}") from None


class _Through:
    """GET requests through one proxy, as ``urllib3.ProxyManager`` sends them.

    A plain-HTTP URL goes to the proxy as an absolute-URI request on one connection pool to
    the proxy, built the way ``ProxyManager`` builds it (proxy, proxy headers, the ``Accept``
    and ``Host`` headers it adds), without the pool manager around it; any other URL (HTTPS: a
    ``CONNECT`` tunnel) goes through a ``ProxyManager``.

    Args:
        target: the proxy, and the credentials the probe sends it.
        ca_bundle: CA bundle for HTTPS health URLs, or ``None`` for the system's.
    """

    def __init__(self, target: ProbeTarget, ca_bundle: str | None) -> None:
        host = f"[{target.host}]" if ":" in target.host else target.host
        self.proxy_url = f"http://{host}:{target.port}"
        self.ca_bundle = ca_bundle
        self.headers = None
        if target.credentials:
            self.headers = urllib3.make_headers(proxy_basic_auth=f"{target.credentials[0]}:{target.credentials[1]}")
        self._pool: urllib3.HTTPConnectionPool | None = None
        self._manager: urllib3.ProxyManager | None = None

    def request(self, url: str, headers: dict, **kw) -> urllib3.BaseHTTPResponse:
        """``GET url`` through the proxy (``kw``: ``urlopen`` options)."""
        if not url.startswith("http://"):
            if self._manager is None:
                self._manager = urllib3.ProxyManager(
                    self.proxy_url, proxy_headers=self.headers, num_pools=2, maxsize=1, block=False,
                    retries=False, ssl_context=ssl_context(self.ca_bundle))
            return self._manager.request("GET", url, headers=headers, **kw)
        # No pool manager for plain HTTP: building it and looking its pool up again cost a fifth
        # of a probe's CPU, and a health check URL is usually plain HTTP.
        if self._pool is None:
            proxy = urllib3.util.parse_url(self.proxy_url)
            self._pool = urllib3.HTTPConnectionPool(
                proxy.host,  # type: ignore[arg-type]  # proxy_url is built with a host
                proxy.port, maxsize=1, block=False, retries=False, _proxy=proxy,
                _proxy_headers=self.headers or {}, _proxy_config=ProxyConfig(None, False, None, None))
        u = urllib3.util.parse_url(url)
        sent = {"Accept": "*/*", "Host": u.netloc} if u.netloc else {"Accept": "*/*"}
        sent.update(headers)
        return self._pool.urlopen("GET", u._replace(fragment=None).url, headers=sent, assert_same_host=False, **kw)

    def clear(self) -> None:
        """Close every connection."""
        if self._pool is not None:
            self._pool.close()
        if self._manager is not None:
            self._manager.clear()


def _get(pm: _Through, url: str, timeout: float, limit: int) -> tuple[int, dict, bytes]:
    resp = pm.request(url, redirect=False, retries=False, preload_content=False,
                      timeout=urllib3.Timeout(total=timeout),
                      headers={"User-Agent": "proxy-operator-probe", "Connection": "close"})
    try:
        body = resp.read(limit, decode_content=False) if resp.status != 204 else b""
        return resp.status, dict(resp.headers.items()), body
    finally:
        resp.close()  # closes the connection too: a partly read body must never be reused
        resp.release_conn()


def probe(target: ProbeTarget, *, echo_url: str = "", ca_bundle: str | None = None,
          policy: "DestinationPolicy | None" = None) -> ProbeResult:
    """Probe one proxy; never raises for network problems.

    Args:
        target: what to probe.
        echo_url: IP-echo URL fetched after a successful GET when ``target.want_egress``
            (operator-configured: not checked against ``policy``).
        ca_bundle: CA file for HTTPS URLs (``None`` = system store).
        policy: when given, the endpoint and ``target.url`` are checked first
            (:mod:`app.probes.destinations`): a denied one gives :data:`DESTINATION_DENIED`
            without any connection, and the probe connects to the endpoint address that was
            checked, never to the name again.  The health engine always passes one.
    Returns:
        a :class:`ProbeResult`; ``latency_ms`` covers the health GET only.
    """
    where = f"proxy {target.host}:{target.port}"
    started = time.time()
    t0 = time.perf_counter()
    if policy is not None:
        from app.probes.destinations import DestinationDenied

        try:
            address = policy.endpoint_address(target.host, target.port, external=target.external)
            policy.check_url(target.url)
        except DestinationDenied as exc:
            return ProbeResult(target.uid, False, DESTINATION_DENIED, f"not probed: {exc}", None,
                               (time.perf_counter() - t0) * 1000, started)
        except OSError as exc:
            return ProbeResult(target.uid, False, CONNECTION_FAILED, f"cannot resolve {where}: {exc}", None,
                               (time.perf_counter() - t0) * 1000, started)
        target = replace(target, host=address)
    pm = _Through(target, ca_bundle)
    status: int | None
    try:
        try:
            status, headers, _ = _get(pm, target.url, target.timeout, _BODY_LIMIT)
        except Exception as exc:  # noqa: BLE001 - every failure becomes a reason
            reason, message, status = classify(exc, where)
            return ProbeResult(target.uid, False, reason, message, status,
                               (time.perf_counter() - t0) * 1000, started)
        latency = (time.perf_counter() - t0) * 1000
        if status != target.expected_status:
            if status == 407:
                return ProbeResult(target.uid, False, PROXY_AUTH_REQUIRED,
                                   f"{where} requires proxy authentication (407)", 407, latency, started)
            if status == 429:
                wait = parse_retry_after(headers.get("Retry-After") or headers.get("retry-after"))
                after = f"; Retry-After {wait:.0f}s" if wait is not None else ""
                return ProbeResult(target.uid, False, RATE_LIMITED,
                                   f"GET {target.url} through {where} answered 429 Too Many Requests{after}",
                                   429, latency, started, retry_after=wait)
            squid_error = headers.get("X-Squid-Error") or headers.get("x-squid-error") or ""
            # Squid's own error code only (ERR_ACCESS_DENIED 0): no other text of the peer's.
            squid_error = squid_error.strip() if _SQUID_ERROR.fullmatch(squid_error.strip()) else ""
            detail = f" ({where} says {squid_error})" if squid_error else ""
            return ProbeResult(target.uid, False, UNEXPECTED_STATUS,
                               f"GET {target.url} answered {status}, expected {target.expected_status}{detail}",
                               status, latency, started)
        egress_ip = egress_error = None
        if target.want_egress and echo_url:
            try:
                estatus, _, body = _get(pm, echo_url, target.timeout, _ECHO_LIMIT)
                if estatus != 200:
                    raise ValueError(f"IP-echo answered {estatus}")
                egress_ip = parse_egress(body)
            except ValueError as exc:
                egress_error = str(exc)
            except Exception as exc:  # noqa: BLE001
                egress_error = classify(exc, where)[1]
        return ProbeResult(target.uid, True, OK,
                           f"GET {target.url} answered {status} in {latency:.0f} ms", status, latency, started,
                           egress_ip, egress_error)
    finally:
        pm.clear()


def probe_many(targets: list[ProbeTarget], *, concurrency: int = 64, echo_url: str = "",
               ca_bundle: str | None = None, policy: "DestinationPolicy | None" = None) -> list[ProbeResult]:
    """Probe ``targets`` concurrently on a thread pool; return results in the same order.

    Args:
        targets: what to probe.
        concurrency: most probes in flight at once.
        echo_url / ca_bundle / policy: see :func:`probe`.
    """
    if not targets:
        return []
    workers = max(1, min(concurrency, len(targets)))
    with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="probe") as pool:
        return list(pool.map(lambda t: probe(t, echo_url=echo_url, ca_bundle=ca_bundle, policy=policy), targets))
