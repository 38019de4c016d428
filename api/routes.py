"""The routes of the discovery and lease API.  Each reads only Redis.

The lease operations themselves (:func:`acquire`, :func:`release`, :func:`authenticate`,
:func:`lease_json`) are plain functions of the request's inputs, shared by the Flask routes
and by :mod:`api.fastpath`, which answers the two hottest routes without Flask's
per-request machinery.
"""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass, field

from redis import Redis
from flask import Flask, Response, request

from api import inputs, metrics
from api.errors import ApiError, json_bytes
from api.openapi import document
from api.settings import ApiSettings
from app.serving import leases
from app.serving.bans import BanSettings
from app.timefmt import rfc3339
from api.tokens import Client, TokenStore

log = logging.getLogger(__name__)

_LEASE_STATUS = {leases.NO_PROXY_AVAILABLE: 503, leases.LEASE_NOT_FOUND: 404, leases.NOT_LEASE_OWNER: 403,
                 leases.LEASE_EXPIRED: 404, leases.PROXY_UNAVAILABLE: 409, leases.CLIENT_LEASE_LIMIT: 429,
                 leases.POOL_NOT_FOUND: 404, leases.TARGET_REFUSING: 429}
_OPEN = {"/healthz", "/metrics", "/openapi.json"}
_CHALLENGE = {"WWW-Authenticate": 'Bearer realm="proxy-operator"'}
ACQUIRE_FIELDS = (*inputs.FILTER_FIELDS, "ttlSeconds", "sessionKey", "target")
#: Headers of every answer that carries a lease (:func:`lease_json`: the proxy's credentials):
#: no cache, shared or private, may store it (RFC 9111, section 5.2.2.5).
NO_STORE = {"Cache-Control": "no-store"}


@dataclass
class State:
    """What the routes share: Redis client, token store, settings."""

    redis: Redis
    tokens: TokenStore
    settings: ApiSettings
    _local: threading.local = field(default_factory=threading.local, init=False, repr=False)

    @property
    def thread_redis(self) -> Redis:
        """A client of the calling thread on ``redis``'s connection pool, holding one connection
        of the pool for as long as the thread lives (``single_connection_client``; returned to
        the pool when the thread ends).  The lease operations use it: a command on the shared
        client takes a connection from the pool and gives it back every time, and checks it for
        unread data with a non-blocking read (three more system calls), which costs a lease and
        release pair 14 % of the app's instructions (docs/performance.md).  A connection
        interrupted mid-command is closed by redis-py either way, so it never carries a stale
        answer into the next command."""
        client = getattr(self._local, "redis", None)
        if client is None:
            client = self._local.redis = Redis(connection_pool=self.redis.connection_pool,
                                               single_connection_client=True)
        return client


def authenticate(tokens: TokenStore, header: str) -> Client:
    """The client presenting ``header`` (the ``Authorization`` value, ``""`` when absent).

    Raises:
        ApiError: 401 ``unauthorized`` with ``WWW-Authenticate`` (the message never shows the token).
    """
    scheme, _, token = header.partition(" ")
    if scheme.lower() != "bearer" or not token.strip():
        raise ApiError(401, "unauthorized", "missing bearer token (send Authorization: Bearer <token>)",
                       headers=_CHALLENGE)
    client = tokens.authenticate(token.strip())
    if client is None:
        raise ApiError(401, "unauthorized", "invalid bearer token", headers=_CHALLENGE)
    return client


def lease_json(lease: leases.Lease) -> dict:
    """The ``Lease`` of the OpenAPI document.  The only answer that carries a proxy's
    credentials (``proxyUrl`` and ``proxyAuth``), to the client holding the lease; answered
    with :data:`NO_STORE`."""
    auth = None if lease.username is None else {"username": lease.username, "password": lease.password or ""}
    return {
        "leaseId": lease.id, "proxyUrl": lease.proxy_url, "proxyAuth": auth, "host": lease.host, "port": lease.port,
        "egressIP": lease.egress_ip, "expiresAt": lease.expires_rfc3339(), "ttlSeconds": lease.ttl,
        "sessionKey": lease.session_key, "sticky": lease.sticky, "target": lease.target,
        "proxy": {"namespace": lease.namespace, "name": lease.name, "provider": lease.provider or None,
                  "zone": lease.zone or None},
        "leases": {"used": lease.used, "max": lease.max_leases},
    }


def lease_error(operation: str, exc: leases.LeaseError, bans: BanSettings | None = None) -> ApiError:
    """Count a refused lease operation and return its HTTP error: ``Retry-After: 1`` on a
    ``503 no_proxy_available`` (for a target: the seconds until its first banned or busy egress IP
    frees up, and ``target``, ``banned``, ``busy`` in the body); on a ``429 client_lease_limit``
    the seconds until the client's earliest lease expires (none when waiting cannot help: a
    limit of 0, a refused renewal); on a ``429 target_refusing`` until the target's cool-off ends."""
    metrics.LEASE_REQUESTS.labels(operation, exc.code).inc()
    headers = None
    if exc.retry_after is not None:
        headers = {"Retry-After": str(exc.retry_after)}
    elif exc.code == leases.NO_PROXY_AVAILABLE:
        headers = {"Retry-After": "1"}
    details = None
    if exc.target is not None:
        details = {"target": exc.target, **(exc.limited or {})}
        if bans is not None:
            metrics.target_refused(bans, exc)
    return ApiError(_LEASE_STATUS[exc.code], exc.code, exc.message, headers=headers, details=details)


def acquire(state: State, client: Client, doc: dict) -> leases.Lease:
    """``POST /v1/leases`` for ``client`` with the JSON body ``doc`` (already read by
    :func:`api.inputs.body`): validate the fields, lease, count it.

    Raises:
        ApiError: 400 for a field, 404 ``pool_not_found`` (the ``pool`` filter names no pool in
            the client's scope), 429 ``client_lease_limit`` (the client holds its
            ``maxLeases``), 503 ``no_proxy_available`` (:func:`lease_error`).
        redis.RedisError: Redis unreachable.
    """
    filters = inputs.filters(doc)
    cfg = state.settings.leases
    ttl = inputs.ttl("ttlSeconds", doc["ttlSeconds"], cfg.max_ttl) if "ttlSeconds" in doc else cfg.default_ttl
    session = inputs.session_key(doc["sessionKey"]) if "sessionKey" in doc else None
    bans = state.settings.bans
    target = inputs.target(doc["target"], bans) if "target" in doc else None
    try:
        lease = leases.acquire(state.thread_redis, client.name, filters, ttl=ttl, settings=cfg, session_key=session,
                               client_max_leases=client.max_leases, scope=client.scope, target=target, bans=bans)
    except leases.LeaseError as exc:
        raise lease_error("acquire", exc, bans) from None
    metrics.OK["acquire"].inc()
    return lease


def release(state: State, client: Client, lease_id: str, *, outcome: str) -> dict:
    """``DELETE /v1/leases/<lease_id>?outcome=`` for ``client`` (``lease_id`` and ``outcome``
    already checked by :func:`api.inputs.lease_id` and :func:`api.inputs.outcome`); the
    ``Released`` answer.

    Raises:
        ApiError: 403 ``not_lease_owner``, 404 ``lease_not_found`` (:func:`lease_error`).
        redis.RedisError: Redis unreachable.
    """
    try:
        done = leases.release(state.thread_redis, client.name, lease_id, outcome=outcome,
                              settings=state.settings.leases, bans=state.settings.bans)
    except leases.LeaseError as exc:
        raise lease_error("release", exc) from None
    metrics.OK["release"].inc()
    answer = {"leaseId": lease_id, "released": True, "outcome": outcome, "wasLive": done.live,
              "cooldownUntil": rfc3339(done.cooldown_until, millis=True) if done.cooldown_until else None}
    if done.target is not None:
        metrics.target_released(state.settings.bans, done)
        answer["target"] = done.target
        answer["targetRefusingUntil"] = (rfc3339(done.refusing_until, millis=True)
                                         if done.refusing_until else None)
    return answer


def _json(doc, status: int = 200, headers: dict | None = None) -> Response:
    return Response(json_bytes(doc), status=status, headers=headers, mimetype="application/json")


def register(app: Flask, state: State) -> None:
    """Add every route to ``app``."""
    openapi_doc = document(state.settings.leases)

    @app.before_request
    def _authenticate():
        if request.path in _OPEN:
            return None
        # Resolve the route first so an unknown path is a 404, not a 401.
        if request.url_rule is None:
            return None
        request.environ["proxy_operator.client"] = authenticate(state.tokens,
                                                                request.environ.get("HTTP_AUTHORIZATION", ""))
        return None

    def client() -> Client:
        return request.environ["proxy_operator.client"]

    @app.get("/healthz")
    def healthz():
        state.redis.ping()
        return _json({"status": "ok"})

    @app.get("/metrics")
    def metrics_route():
        body, ctype = metrics.exposition(state.redis)
        return Response(body, content_type=ctype)

    @app.get("/openapi.json")
    def openapi():
        return _json(openapi_doc)

    @app.get("/v1/proxies")
    def list_proxies():
        q = inputs.query(request, ("provider", "zone", "namespace", "pool", "selector", "healthy"))
        filters = inputs.filters(q)
        healthy = inputs.boolean("healthy", q["healthy"]) if "healthy" in q else None
        return _json({"items": leases.discover(state.redis, filters, healthy, scope=client().scope,
                                               bans=state.settings.bans)})

    @app.post("/v1/leases")
    def acquire_route():
        inputs.query(request, ())  # the fast path takes the plain form; any parameter is refused here
        lease = acquire(state, client(), inputs.body(request, ACQUIRE_FIELDS))
        return _json(lease_json(lease), 201, {"Location": f"/v1/leases/{lease.id}", **NO_STORE})

    @app.post("/v1/leases/<lease_id>/renew")
    def renew(lease_id: str):
        lease_id = inputs.lease_id(lease_id)
        inputs.query(request, ())
        doc = inputs.body(request, ("ttlSeconds",))
        cfg = state.settings.leases
        ttl = inputs.ttl("ttlSeconds", doc["ttlSeconds"], cfg.max_ttl) if "ttlSeconds" in doc else None
        try:
            lease = leases.renew(state.thread_redis, client().name, lease_id, ttl=ttl, settings=cfg,
                                 client_max_leases=client().max_leases, scope=client().scope)
        except leases.LeaseError as exc:
            raise lease_error("renew", exc) from None
        metrics.OK["renew"].inc()
        return _json(lease_json(lease), 200, NO_STORE)

    @app.delete("/v1/leases/<lease_id>")
    def release_route(lease_id: str):
        lease_id = inputs.lease_id(lease_id)
        q = inputs.query(request, ("outcome",))
        return _json(release(state, client(), lease_id, outcome=inputs.outcome(q.get("outcome"))))
