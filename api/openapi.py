"""The OpenAPI 3.0 document served at ``/openapi.json``: every route, its inputs, its outputs
and its errors.  Limits that come from settings (the maximum TTL) are filled in per app."""

from __future__ import annotations

from app.serving import selectors
from app.serving.leases import OUTCOMES, LeaseSettings
from api.inputs import MAX_FILTER_LENGTH, MAX_TARGET_LENGTH

_FILTER = {"type": "string", "minLength": 1, "maxLength": MAX_FILTER_LENGTH,
           "pattern": "^[^\\x00-\\x1f\\x7f-\\x9f]+$", "description": "No control characters."}
_SELECTOR = {"type": "string", "maxLength": selectors.MAX_LENGTH,
             "description": (f"Kubernetes label selector: `k=v,k2!=v2,k3 in (a,b),k4 notin (c),k5,!k6`. At most "
                             f"{selectors.MAX_REQUIREMENTS} requirements, {selectors.MAX_VALUES} values in one "
                             f"`in`/`notin` list; keys: a prefix of at most {selectors.MAX_PREFIX_LENGTH} "
                             f"characters and a name of at most {selectors.MAX_NAME_LENGTH}; values at most "
                             f"{selectors.MAX_VALUE_LENGTH} characters. Beyond a cap: 400 `invalid_field` "
                             "naming it.")}


def _error_response(description: str) -> dict:
    return {"description": description,
            "content": {"application/json": {"schema": {"$ref": "#/components/schemas/Error"}}}}


def _errors(*codes: int) -> dict:
    words = {400: "Bad request: malformed JSON (not UTF-8, nested deeper than 32 levels, a lone UTF-16 "
                  "surrogate, NaN), an unknown or invalid field (named in `field`; a control character in a "
                  "filter, a selector beyond its caps), an unknown query parameter.",
             401: "Missing or invalid bearer token.",
             403: "The lease belongs to another client.",
             404: "No such lease.",
             409: "The lease's proxy is no longer healthy or leasable; the lease was ended.",
             413: "Request body over 64 KiB, however it is framed (Content-Length or chunked).",
             415: "The body is not application/json.",
             429: "`client_lease_limit`: the client holds as many live leases as its `maxLeases` in the "
                  "tokens file allows (the message names the limit). A lease request gets `Retry-After`: "
                  "seconds until the client's earliest lease expires (none for a limit of 0); a renewal "
                  "refused because the client is above its limit leaves the lease to run out. "
                  "`target_refusing`: the lease's `target` refuses every egress IP; `Retry-After`: the end "
                  "of its cool-off.",
             503: "No proxy fits (leases: the message counts the published proxies and why each was "
                  "excluded; for a `target`, the body adds `target`, `banned` and `busy` and `Retry-After` "
                  "is when the first banned or busy egress IP frees up) or the lease store is unavailable."}
    return {str(c): _error_response(words[c]) for c in codes}


def document(settings: LeaseSettings) -> dict:
    """Return the OpenAPI document for an API with these lease settings."""
    filter_params = [
        {"name": "provider", "in": "query", "required": False, "schema": _FILTER,
         "description": "Only proxies of this provider."},
        {"name": "zone", "in": "query", "required": False, "schema": _FILTER,
         "description": "Only proxies in this zone (kvm: host)."},
        {"name": "namespace", "in": "query", "required": False, "schema": _FILTER,
         "description": "Only Proxies of this Kubernetes namespace."},
        {"name": "pool", "in": "query", "required": False, "schema": _FILTER,
         "description": "Only members of the ProxyPool of this name (with `namespace`: of that namespace)."},
        {"name": "selector", "in": "query", "required": False,
         "schema": {"type": "string", "maxLength": selectors.MAX_LENGTH},
         "description": _SELECTOR["description"]},
        {"name": "healthy", "in": "query", "required": False, "schema": {"type": "boolean"},
         "description": "true: only healthy proxies; false: only the others."},
    ]
    lease_id = {"name": "leaseId", "in": "path", "required": True,
                "schema": {"type": "string", "pattern": "^[0-9a-f]{32}$"}}
    lease_ok = {"application/json": {"schema": {"$ref": "#/components/schemas/Lease"}}}
    nullable_str = {"type": "string", "nullable": True}
    return {
        "openapi": "3.0.3",
        "info": {"title": "proxy-operator discovery and lease API", "version": "1",
                 "description": "Lists healthy proxies and leases them to crawlers. See docs/discovery-api.md."},
        "servers": [{"url": "/"}],
        "components": {
            "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer"}},
            "schemas": {
                "Error": {
                    "type": "object", "required": ["error", "message"], "additionalProperties": False,
                    "properties": {
                        "error": {"type": "string", "description": "Stable error code."},
                        "message": {"type": "string"},
                        "field": {"type": "string", "description": "The request field at fault."},
                        "target": {"type": "string", "description": "The target of a refused targeted lease."},
                        "banned": {"type": "integer", "description": "Targeted 503: proxies whose egress IP "
                                                                     "is banned for the target."},
                        "busy": {"type": "integer", "description": "Targeted 503: proxies whose egress IP is "
                                                                   "at the target's concurrency limit."},
                    },
                },
                "Health": {
                    "type": "object", "additionalProperties": False,
                    "required": ["healthy", "state", "reason", "lastProbeTime", "latencyMs"],
                    "properties": {
                        "healthy": {"type": "boolean"},
                        "state": {"type": "string", "enum": ["healthy", "unhealthy", "unknown"]},
                        "reason": {**nullable_str, "description": "Reason of the last probe result."},
                        "lastProbeTime": {**nullable_str, "format": "date-time"},
                        "latencyMs": {"type": "number", "nullable": True},
                    },
                },
                "Proxy": {
                    "type": "object", "additionalProperties": False,
                    "required": ["namespace", "name", "address", "port", "provider", "zone", "egressIP",
                                 "labels", "pool", "draining", "health", "leases", "bans"],
                    "properties": {
                        "namespace": {"type": "string"}, "name": {"type": "string"},
                        "address": {"type": "string"}, "port": {"type": "integer"},
                        "provider": nullable_str, "zone": nullable_str, "egressIP": nullable_str,
                        "labels": {"type": "object", "additionalProperties": {"type": "string"}},
                        "pool": {**nullable_str, "description": "The ProxyPool the proxy is a member of."},
                        "draining": {"type": "boolean",
                                     "description": "Leaving its pool: no new leases; live ones stay valid."},
                        "health": {"$ref": "#/components/schemas/Health"},
                        "leases": {"type": "object", "additionalProperties": False, "required": ["used", "max"],
                                   "properties": {"used": {"type": "integer", "minimum": 0},
                                                  "max": {"type": "integer", "minimum": 0}}},
                        "bans": {
                            "type": "object", "additionalProperties": False, "required": ["active", "recent"],
                            "description": "The per-target state of the proxy's egress IP.",
                            "properties": {
                                "active": {"type": "array", "items": {
                                    "type": "object", "additionalProperties": False, "required": ["target", "until"],
                                    "properties": {"target": {"type": "string"},
                                                   "until": {"type": "string", "format": "date-time"}}}},
                                "recent": {"type": "integer", "minimum": 0,
                                           "description": "Targets that banned it within BAN_HISTORY_SECONDS."}}},
                    },
                },
                "ProxyList": {
                    "type": "object", "additionalProperties": False, "required": ["items"],
                    "properties": {"items": {"type": "array", "items": {"$ref": "#/components/schemas/Proxy"}}},
                },
                "LeaseRequest": {
                    "type": "object", "additionalProperties": False,
                    "properties": {
                        "provider": _FILTER, "zone": _FILTER, "namespace": _FILTER,
                        "pool": {**_FILTER, "description": "Only members of the ProxyPool of this name (with "
                                                           "`namespace`: of that namespace). A 503 counts as "
                                                           "demand for the pool's autoscaler."},
                        "selector": _SELECTOR,
                        "ttlSeconds": {"type": "integer", "minimum": 1, "maximum": settings.max_ttl,
                                       "description": f"Default {settings.default_ttl}."},
                        "sessionKey": {"type": "string", "pattern": "^[A-Za-z0-9._:-]{1,128}$",
                                       "description": "Sticky session: the same key gets the same proxy "
                                                      "while it stays eligible."},
                        "target": {"type": "string", "minLength": 1, "maxLength": MAX_TARGET_LENGTH,
                                   "description": "The site the lease is for (host name or URL; its host at "
                                                  "most 253 characters): bans, per-target concurrency and "
                                                  "refusals apply to its registrable domain."},
                    },
                },
                "RenewRequest": {
                    "type": "object", "additionalProperties": False,
                    "properties": {"ttlSeconds": {"type": "integer", "minimum": 1, "maximum": settings.max_ttl,
                                                  "description": "Default: the lease's current TTL."}},
                },
                "Lease": {
                    "type": "object", "additionalProperties": False,
                    "required": ["leaseId", "proxyUrl", "proxyAuth", "host", "port", "egressIP", "expiresAt",
                                 "ttlSeconds", "sessionKey", "sticky", "proxy", "leases"],
                    "properties": {
                        "leaseId": {"type": "string", "pattern": "^[0-9a-f]{32}$"},
                        "proxyUrl": {"type": "string",
                                     "description": "`http://host:port`; for a proxy that requires basic auth "
                                                    "`http://user:password@host:port` with both percent-encoded "
                                                    "(RFC 3986, e.g. `pa%24s` for `pa$s`): usable as is as an "
                                                    "HTTP client's proxy URL. Treat it as a secret."},
                        "proxyAuth": {
                            "type": "object", "nullable": True, "additionalProperties": False,
                            "required": ["username", "password"],
                            "properties": {"username": {"type": "string"}, "password": {"type": "string"}},
                            "description": "The basic-auth credentials of a proxy that requires them "
                                           "(`squid.basicAuth`), as plain text; null when it needs none. Only "
                                           "lease answers (this one and renew) carry credentials, and only to the "
                                           "client holding the lease: never `GET /v1/proxies`, errors, logs or "
                                           "metrics."},
                        "host": {"type": "string"}, "port": {"type": "integer"},
                        "egressIP": nullable_str,
                        "expiresAt": {"type": "string", "format": "date-time"},
                        "ttlSeconds": {"type": "integer"},
                        "sessionKey": nullable_str,
                        "sticky": {"type": "boolean", "description": "The session's existing proxy was reused."},
                        "target": {**nullable_str, "description": "The lease's target (registrable domain)."},
                        "proxy": {"type": "object", "additionalProperties": False,
                                  "required": ["namespace", "name", "provider", "zone"],
                                  "properties": {"namespace": {"type": "string"}, "name": {"type": "string"},
                                                 "provider": nullable_str, "zone": nullable_str}},
                        "leases": {"type": "object", "additionalProperties": False, "required": ["used", "max"],
                                   "properties": {"used": {"type": "integer"}, "max": {"type": "integer"}}},
                    },
                },
                "Released": {
                    "type": "object", "additionalProperties": False,
                    "required": ["leaseId", "released", "outcome", "wasLive", "cooldownUntil"],
                    "properties": {
                        "leaseId": {"type": "string"}, "released": {"type": "boolean"},
                        "outcome": {"type": "string", "enum": list(OUTCOMES)},
                        "wasLive": {"type": "boolean", "description": "false if it was no longer live: it had expired, "
                                                  "or its proxy was withdrawn from serving."},
                        "cooldownUntil": {**nullable_str, "format": "date-time"},
                        "target": {"type": "string", "description": "A targeted lease's target."},
                        "targetRefusingUntil": {**nullable_str, "format": "date-time",
                                                "description": "End of the target's cool-off when it refuses "
                                                               "every egress IP."},
                    },
                },
            },
        },
        "paths": {
            "/healthz": {"get": {
                "summary": "Liveness: the API answers and reaches Redis.", "security": [],
                "responses": {
                    "200": {"description": "OK", "content": {"application/json": {"schema": {
                        "type": "object", "required": ["status"], "properties": {"status": {"type": "string"}}}}}},
                    **_errors(503)}}},
            "/metrics": {"get": {
                "summary": "Prometheus metrics.", "security": [],
                "responses": {"200": {"description": "Prometheus text format",
                                      "content": {"text/plain": {"schema": {"type": "string"}}}}}}},
            "/openapi.json": {"get": {
                "summary": "This document.", "security": [],
                "responses": {"200": {"description": "OpenAPI 3.0",
                                      "content": {"application/json": {"schema": {"type": "object"}}}}}}},
            "/v1/proxies": {"get": {
                "summary": "List published proxies with health and lease usage.",
                "security": [{"bearer": []}], "parameters": filter_params,
                "responses": {
                    "200": {"description": "Matching proxies",
                            "content": {"application/json": {"schema": {"$ref": "#/components/schemas/ProxyList"}}}},
                    **_errors(400, 401, 503)}}},
            "/v1/leases": {"post": {
                "summary": "Lease a healthy proxy with free capacity (least-loaded first).",
                "security": [{"bearer": []}],
                "requestBody": {"required": False, "content": {"application/json": {
                    "schema": {"$ref": "#/components/schemas/LeaseRequest"}}}},
                "responses": {"201": {"description": "Lease granted", "content": lease_ok},
                              **_errors(400, 401, 413, 415, 429, 503),
                              "404": _error_response(
                                  "`pool_not_found`: no proxy fits and `pool` names no ProxyPool the "
                                  "controller registered (of `namespace`, when given) that the client may "
                                  "lease from; a pool outside the client's scope answers the same. Not "
                                  "worth retrying: check the name.")}}},
            "/v1/leases/{leaseId}/renew": {"post": {
                "summary": "Extend a live lease (owner only).", "security": [{"bearer": []}],
                "parameters": [lease_id],
                "requestBody": {"required": False, "content": {"application/json": {
                    "schema": {"$ref": "#/components/schemas/RenewRequest"}}}},
                "responses": {"200": {"description": "Lease renewed", "content": lease_ok},
                              **_errors(400, 401, 403, 404, 409, 413, 415, 429, 503)}}},
            "/v1/leases/{leaseId}": {"delete": {
                "summary": "Release a lease (owner only); blocked/failed start a cooldown.",
                "security": [{"bearer": []}],
                "parameters": [lease_id, {"name": "outcome", "in": "query", "required": False,
                                          "schema": {"type": "string", "enum": list(OUTCOMES)}}],
                "responses": {"200": {"description": "Released", "content": {"application/json": {
                    "schema": {"$ref": "#/components/schemas/Released"}}}},
                    **_errors(400, 401, 403, 404, 503)}}},
        },
    }
