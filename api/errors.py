"""JSON errors with a stable ``error`` code for every 4xx/5xx (SPEC §7).

Body: ``{"error": "<code>", "message": "<text>"}`` plus ``"field"`` when one request field
is at fault.  Codes are part of the API contract (docs/discovery-api.md lists them).
"""

from __future__ import annotations

import logging

import redis
from flask import Flask, jsonify
from werkzeug.exceptions import HTTPException

log = logging.getLogger(__name__)

#: HTTP errors raised by Flask/werkzeug itself, mapped to our codes.
_HTTP_CODES = {
    400: "bad_request", 401: "unauthorized", 403: "forbidden", 404: "not_found",
    405: "method_not_allowed", 406: "not_acceptable", 413: "payload_too_large",
    415: "unsupported_media_type", 429: "too_many_requests", 500: "internal_error",
}


class ApiError(Exception):
    """An error answered as JSON.

    Args:
        status: HTTP status.
        code: stable error code.
        message: human-readable text (never a token or credential).
        field: the request field at fault, if any.
        headers: extra response headers.
    """

    def __init__(self, status: int, code: str, message: str, field: str | None = None,
                 headers: dict | None = None) -> None:
        super().__init__(message)
        self.status, self.code, self.message, self.field = status, code, message, field
        self.headers = headers or {}

    def response(self):
        body = {"error": self.code, "message": self.message}
        if self.field:
            body["field"] = self.field
        resp = jsonify(body)
        resp.status_code = self.status
        for k, v in self.headers.items():
            resp.headers[k] = v
        return resp


def bad_field(field: str, message: str, code: str = "invalid_field") -> ApiError:
    """A 400 naming ``field``."""
    return ApiError(400, code, f"{field}: {message}", field)


def install(app: Flask) -> None:
    """Register the handlers that turn every error into JSON."""

    @app.errorhandler(ApiError)
    def _api_error(exc: ApiError):
        return exc.response()

    @app.errorhandler(HTTPException)
    def _http_error(exc: HTTPException):
        code = _HTTP_CODES.get(exc.code or 500, "http_error")
        message = {404: "no such route", 405: "method not allowed on this route"}.get(
            exc.code, exc.description or code)
        resp = ApiError(exc.code or 500, code, message).response()
        if exc.code == 405:
            allow = exc.get_response().headers.get("Allow")
            if allow:
                resp.headers["Allow"] = allow
        return resp

    @app.errorhandler(redis.RedisError)
    def _redis_error(exc: redis.RedisError):
        log.error("api: Redis error: %s", exc)
        return ApiError(503, "redis_unavailable", "the lease store is unavailable; retry shortly",
                        headers={"Retry-After": "1"}).response()

    @app.errorhandler(Exception)
    def _unexpected(exc: Exception):
        log.exception("api: unexpected error")
        return ApiError(500, "internal_error", "internal error").response()
