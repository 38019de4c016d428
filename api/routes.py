"""The routes of the discovery and lease API.  Each reads only Redis (SPEC §7)."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import datetime, timezone

from flask import Flask, Response, jsonify, request

from api import inputs, metrics
from api.errors import ApiError
from api.openapi import document
from api.settings import ApiSettings
from app import leases
from app.tokens import Client, TokenStore

log = logging.getLogger(__name__)

_LEASE_STATUS = {leases.NO_PROXY_AVAILABLE: 503, leases.LEASE_NOT_FOUND: 404, leases.NOT_LEASE_OWNER: 403,
                 leases.LEASE_EXPIRED: 404, leases.PROXY_UNAVAILABLE: 409}
_OPEN = {"/healthz", "/metrics", "/openapi.json"}


@dataclass
class State:
    """What the routes share: Redis client, token store, settings."""

    redis: object
    tokens: TokenStore
    settings: ApiSettings


def _rfc3339_ms(epoch: float) -> str:
    dt = datetime.fromtimestamp(epoch, timezone.utc)
    return dt.strftime("%Y-%m-%dT%H:%M:%S.") + f"{dt.microsecond // 1000:03d}Z"


def _client(state: State) -> Client:
    header = request.headers.get("Authorization", "")
    scheme, _, token = header.partition(" ")
    challenge = {"WWW-Authenticate": 'Bearer realm="proxy-operator"'}
    if scheme.lower() != "bearer" or not token.strip():
        raise ApiError(401, "unauthorized", "missing bearer token (send Authorization: Bearer <token>)",
                       headers=challenge)
    client = state.tokens.authenticate(token.strip())
    if client is None:
        raise ApiError(401, "unauthorized", "invalid bearer token", headers=challenge)
    return client


def _lease_json(lease: leases.Lease) -> dict:
    return {
        "leaseId": lease.id, "proxyUrl": lease.proxy_url, "host": lease.host, "port": lease.port,
        "egressIP": lease.egress_ip, "expiresAt": lease.expires_rfc3339(), "ttlSeconds": lease.ttl,
        "sessionKey": lease.session_key, "sticky": lease.sticky,
        "proxy": {"namespace": lease.namespace, "name": lease.name, "provider": lease.provider or None,
                  "zone": lease.zone or None},
        "leases": {"used": lease.used, "max": lease.max_leases},
    }


def _lease_error(operation: str, exc: leases.LeaseError) -> ApiError:
    metrics.LEASE_REQUESTS.labels(operation, exc.code).inc()
    headers = {"Retry-After": "1"} if exc.code == leases.NO_PROXY_AVAILABLE else None
    return ApiError(_LEASE_STATUS[exc.code], exc.code, exc.message, headers=headers)


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
        request.environ["proxy_operator.client"] = _client(state)
        return None

    def client() -> Client:
        return request.environ["proxy_operator.client"]

    @app.get("/healthz")
    def healthz():
        state.redis.ping()
        return jsonify(status="ok")

    @app.get("/metrics")
    def metrics_route():
        body, ctype = metrics.exposition(state.redis)
        return Response(body, content_type=ctype)

    @app.get("/openapi.json")
    def openapi():
        return jsonify(openapi_doc)

    @app.get("/v1/proxies")
    def list_proxies():
        q = inputs.query(request, ("provider", "zone", "namespace", "selector", "healthy"))
        filters = inputs.filters(q)
        healthy = inputs.boolean("healthy", q["healthy"]) if "healthy" in q else None
        return jsonify(items=leases.discover(state.redis, filters, healthy))

    @app.post("/v1/leases")
    def acquire():
        doc = inputs.body(request, (*inputs.FILTER_FIELDS, "ttlSeconds", "sessionKey"))
        filters = inputs.filters(doc)
        cfg = state.settings.leases
        ttl = inputs.ttl("ttlSeconds", doc["ttlSeconds"], cfg.max_ttl) if "ttlSeconds" in doc else cfg.default_ttl
        session = inputs.session_key(doc["sessionKey"]) if "sessionKey" in doc else None
        try:
            lease = leases.acquire(state.redis, client().name, filters, ttl, cfg, session)
        except leases.LeaseError as exc:
            raise _lease_error("acquire", exc) from None
        metrics.LEASE_REQUESTS.labels("acquire", "ok").inc()
        resp = jsonify(_lease_json(lease))
        resp.status_code = 201
        resp.headers["Location"] = f"/v1/leases/{lease.id}"
        return resp

    @app.post("/v1/leases/<lease_id>/renew")
    def renew(lease_id: str):
        lease_id = inputs.lease_id(lease_id)
        doc = inputs.body(request, ("ttlSeconds",))
        cfg = state.settings.leases
        ttl = inputs.ttl("ttlSeconds", doc["ttlSeconds"], cfg.max_ttl) if "ttlSeconds" in doc else None
        try:
            lease = leases.renew(state.redis, client().name, lease_id, ttl, cfg)
        except leases.LeaseError as exc:
            raise _lease_error("renew", exc) from None
        metrics.LEASE_REQUESTS.labels("renew", "ok").inc()
        return jsonify(_lease_json(lease))

    @app.delete("/v1/leases/<lease_id>")
    def release(lease_id: str):
        lease_id = inputs.lease_id(lease_id)
        q = inputs.query(request, ("outcome",))
        outcome = inputs.outcome(q.get("outcome"))
        try:
            done = leases.release(state.redis, client().name, lease_id, outcome, state.settings.leases)
        except leases.LeaseError as exc:
            raise _lease_error("release", exc) from None
        metrics.LEASE_REQUESTS.labels("release", "ok").inc()
        return jsonify(leaseId=lease_id, released=True, outcome=outcome, wasLive=done.live,
                       cooldownUntil=_rfc3339_ms(done.cooldown_until) if done.cooldown_until else None)
