"""Strict reading of request inputs: query strings, JSON bodies, path ids.

Every problem is a 400 (415 for a body that is not JSON) whose ``field`` names the culprit;
nothing unknown is silently ignored.
"""

from __future__ import annotations

import json
import re

from flask import Request

from api.errors import ApiError, bad_field
from app import selectors
from app.leases import OUTCOMES, Filters

MAX_FILTER_LENGTH = 253
SESSION_KEY = re.compile(r"^[A-Za-z0-9._:-]{1,128}$")
LEASE_ID = re.compile(r"^[0-9a-f]{32}$")
FILTER_FIELDS = ("provider", "zone", "namespace", "selector")


def query(req: Request, allowed: tuple[str, ...]) -> dict[str, str]:
    """Return the query parameters, each given at most once and all in ``allowed``."""
    out = {}
    for key in req.args.keys():
        if key not in allowed:
            raise bad_field(key, f"unknown query parameter (allowed: {', '.join(allowed) or 'none'})",
                            "unknown_parameter")
        values = req.args.getlist(key)
        if len(values) != 1:
            raise bad_field(key, "give this parameter once")
        out[key] = values[0]
    return out


def body(req: Request, allowed: tuple[str, ...]) -> dict:
    """Return the JSON object body (``{}`` when empty), with keys only from ``allowed``.

    Raises:
        ApiError: 415 ``unsupported_media_type`` for a non-JSON content type, 400
            ``bad_json`` for malformed JSON or a non-object, 400 ``unknown_field``.
    """
    raw = req.get_data(cache=False)
    if not raw.strip():
        return {}
    mimetype = (req.mimetype or "").lower()
    if mimetype != "application/json" and not mimetype.endswith("+json"):
        raise ApiError(415, "unsupported_media_type", "send the body as application/json")
    try:
        doc = json.loads(raw)
    except (ValueError, UnicodeDecodeError) as exc:
        raise ApiError(400, "bad_json", f"the body is not valid JSON: {exc}") from None
    if not isinstance(doc, dict):
        raise ApiError(400, "bad_json", "the body must be a JSON object")
    for key in doc:
        if key not in allowed:
            raise bad_field(key, f"unknown field (allowed: {', '.join(allowed)})", "unknown_field")
    return doc


def _text(field: str, value) -> str:
    if not isinstance(value, str):
        raise bad_field(field, f"must be a string, got {type(value).__name__}")
    if not value or len(value) > MAX_FILTER_LENGTH:
        raise bad_field(field, f"must be 1 to {MAX_FILTER_LENGTH} characters")
    return value


def filters(values: dict) -> Filters:
    """Build :class:`app.leases.Filters` from ``provider zone namespace selector`` values."""
    reqs = ()
    if "selector" in values:
        sel = values["selector"]
        if not isinstance(sel, str):
            raise bad_field("selector", f"must be a string, got {type(sel).__name__}")
        try:
            reqs = selectors.parse(sel)
        except selectors.SelectorError as exc:
            raise bad_field("selector", str(exc)) from None
    return Filters(
        provider=_text("provider", values["provider"]) if "provider" in values else None,
        zone=_text("zone", values["zone"]) if "zone" in values else None,
        namespace=_text("namespace", values["namespace"]) if "namespace" in values else None,
        selector=reqs,
    )


def boolean(field: str, value: str) -> bool:
    """``"true"``/``"false"`` -> bool."""
    if value == "true":
        return True
    if value == "false":
        return False
    raise bad_field(field, "must be true or false")


def ttl(field: str, value, maximum: int) -> int:
    """A TTL in whole seconds, 1..``maximum``."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise bad_field(field, f"must be an integer number of seconds, got {type(value).__name__}")
    if not 1 <= value <= maximum:
        raise bad_field(field, f"must be between 1 and {maximum} seconds, got {value}")
    return value


def session_key(value) -> str:
    """A sticky-session key: 1-128 of ``A-Za-z0-9._:-``."""
    if not isinstance(value, str) or not SESSION_KEY.match(value):
        raise bad_field("sessionKey", "must be 1 to 128 characters of A-Z a-z 0-9 . _ : -")
    return value


def outcome(value: str | None) -> str:
    """A release outcome (default ``ok``)."""
    if value is None:
        return "ok"
    if value not in OUTCOMES:
        raise bad_field("outcome", f"must be one of {', '.join(OUTCOMES)}")
    return value


def lease_id(value: str) -> str:
    """A lease id from the path; anything else is an unknown lease (404)."""
    if not LEASE_ID.match(value):
        raise ApiError(404, "lease_not_found", "no such lease (ids are 32 lowercase hex digits)")
    return value
