"""JSON errors with a stable ``error`` code for every 4xx/5xx.

Body: ``{"error": "<code>", "message": "<text>"}`` plus ``"field"`` when one request field
is at fault.  Codes are part of the API contract (docs/discovery-api.md lists them).
"""

from __future__ import annotations

import json
import logging
from http import HTTPStatus

import orjson
import redis
from flask import Flask, Response
from werkzeug.exceptions import HTTPException

log = logging.getLogger(__name__)

#: HTTP errors raised by Flask/werkzeug itself, mapped to our codes.
_HTTP_CODES = {
    400: "bad_request", 401: "unauthorized", 403: "forbidden", 404: "not_found",
    405: "method_not_allowed", 406: "not_acceptable", 413: "payload_too_large",
    415: "unsupported_media_type", 429: "too_many_requests", 500: "internal_error",
}


def json_bytes(doc) -> bytes:
    """``doc`` as the API writes every JSON answer: compact, ASCII, one trailing newline (the
    bytes Flask's ``jsonify`` gives; used by the Flask routes and :mod:`api.fastpath` alike)."""
    return (json.dumps(doc, separators=(",", ":")) + "\n").encode("ascii")


#: orjson refuses, instead of converting, what json.dumps would refuse (dataclasses,
#: datetimes, subclasses of str, int, dict and list) and integers past 64 bits.
_ORJSON = (orjson.OPT_APPEND_NEWLINE | orjson.OPT_PASSTHROUGH_DATACLASS | orjson.OPT_PASSTHROUGH_DATETIME
           | orjson.OPT_PASSTHROUGH_SUBCLASS)


def plain_json_bytes(doc) -> bytes:
    """:func:`json_bytes` of a document without floats (dicts with string keys, lists, strings,
    integers, booleans, ``None``): the same bytes, written by orjson for a sixth of the CPU
    (the lease and release answers, api/fastpath.py).

    For these types orjson writes what ``json.dumps(..., separators=(",", ":"))`` writes,
    control characters escaped alike, except that it writes non-ASCII characters as UTF-8 and
    DEL as is, where ``json.dumps`` escapes them as ``\\uXXXX`` (and floats it formats
    differently, hence none).  So an output with a byte outside ASCII or a DEL, or a document
    orjson refuses, is written by :func:`json_bytes` instead.
    """
    try:
        out = orjson.dumps(doc, option=_ORJSON)
    except orjson.JSONEncodeError:
        return json_bytes(doc)
    if out.isascii() and b"\x7f" not in out:
        return out
    return json_bytes(doc)


def status_line(status: int) -> str:
    """``"201 CREATED"``-style WSGI status for ``status`` (Werkzeug's wording)."""
    try:
        return f"{status} {HTTPStatus(status).phrase.upper()}"
    except ValueError:
        return f"{status} UNKNOWN"


class ApiError(Exception):
    """An error answered as JSON.

    Args:
        status: HTTP status.
        code: stable error code.
        message: human-readable text (never a token or credential).
        field: the request field at fault, if any.
        headers: extra response headers.
        details: extra members of the JSON body (e.g. ``target`` of a targeted lease's refusal).
    """

    def __init__(self, status: int, code: str, message: str, *, field: str | None = None,
                 headers: dict | None = None, details: dict | None = None) -> None:
        super().__init__(message)
        self.status, self.code, self.message, self.field = status, code, message, field
        self.headers = headers or {}
        self.details = details or {}

    def body(self) -> bytes:
        """The JSON body: ``{"error", "message"}`` plus ``"field"`` when one is at fault, plus
        the details."""
        doc = {"error": self.code, "message": self.message}
        if self.field:
            doc["field"] = self.field
        doc.update(self.details)
        return json_bytes(doc)

    def response(self) -> Response:
        """The error as a Flask response."""
        return Response(self.body(), status=self.status, headers=self.headers, mimetype="application/json")

    def wsgi(self, start_response) -> list[bytes]:
        """Answer the error on a raw WSGI call (same status, headers and body as :meth:`response`)."""
        body = self.body()
        start_response(status_line(self.status), [("Content-Type", "application/json"),
                                                  ("Content-Length", str(len(body))), *self.headers.items()])
        return [body]


def redis_unavailable(exc: redis.RedisError) -> ApiError:
    """Log a Redis failure (without the command's arguments) and return the 503 for it."""
    log.error("api: Redis error: %s", exc)
    return ApiError(503, "redis_unavailable", "the lease store is unavailable; retry shortly",
                    headers={"Retry-After": "1"})


def script_failed(exc: redis.RedisError) -> bool:
    """Whether ``exc`` is a Lua script of ours failing on what it was given (a bug, e.g. input
    the script cannot decode), as opposed to Redis being unreachable, busy or read-only."""
    text = str(exc)
    return isinstance(exc, redis.ResponseError) and ("user_script" in text or "Error running script" in text)


def redis_error(exc: redis.RedisError) -> ApiError:
    """The answer to a Redis error: a failing script is a bug, answered 500 ``internal_error``
    with its traceback logged (a 503 with ``Retry-After`` would have clients retry the same
    request forever); anything else is 503 ``redis_unavailable`` (:func:`redis_unavailable`).
    Call it while handling ``exc``."""
    if script_failed(exc):
        return internal_error()
    return redis_unavailable(exc)


def internal_error() -> ApiError:
    """Log the exception being handled, with its traceback, and return the 500 for it."""
    log.exception("api: unexpected error")
    return ApiError(500, "internal_error", "internal error")


def bad_field(field: str, message: str, code: str = "invalid_field") -> ApiError:
    """A 400 naming ``field``."""
    return ApiError(400, code, f"{field}: {message}", field=field)


def install(app: Flask) -> None:
    """Register the handlers that turn every error into JSON."""

    @app.errorhandler(ApiError)
    def _api_error(exc: ApiError):
        return exc.response()

    @app.errorhandler(HTTPException)
    def _http_error(exc: HTTPException):
        code = _HTTP_CODES.get(exc.code or 500, "http_error")
        message = {404: "no such route", 405: "method not allowed on this route"}.get(
            exc.code or 500, exc.description or code)
        resp = ApiError(exc.code or 500, code, message).response()
        if exc.code == 405:
            allow = exc.get_response().headers.get("Allow")
            if allow:
                resp.headers["Allow"] = allow
        return resp

    @app.errorhandler(redis.RedisError)
    def _redis_error(exc: redis.RedisError):
        return redis_error(exc).response()

    @app.errorhandler(Exception)
    def _unexpected(exc: Exception):
        return internal_error().response()
