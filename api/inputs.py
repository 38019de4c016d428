"""Strict reading of request inputs: query strings, JSON bodies, path ids.

Every problem is a 400 (413 for a body over :data:`MAX_BODY_BYTES`, 415 for a body that is not
JSON) whose ``field`` names the culprit; nothing unknown is silently ignored, and no input
makes a 5xx.  What reaches the lease script has been checked here: no lone UTF-16 surrogate
(Redis' JSON decoder refuses them), no control character, selectors within the caps of
:mod:`app.serving.selectors`.
"""

from __future__ import annotations

import json
import re
from typing import Any
from urllib.parse import unquote_to_bytes

from flask import Request
from werkzeug.wsgi import get_content_length

from api.errors import ApiError, bad_field
from app.serving.bans import BanSettings, Target, TargetError
from app.serving import selectors
from app.serving.leases import OUTCOMES, Filters

#: Largest request body, bytes, however it is framed (Content-Length or chunked).
MAX_BODY_BYTES = 64 * 1024
#: Deepest nesting of arrays and objects a JSON body may have (the API's bodies are flat).
MAX_JSON_DEPTH = 32
MAX_FILTER_LENGTH = 253
#: Longest ``target``: a host name (253 characters at most, checked once it is taken out) or a
#: URL around one, as long as URLs commonly go.
MAX_TARGET_LENGTH = 2048
_READ_CHUNK = 16 * 1024
_STRINGS = re.compile(r'"(?:[^"\\]|\\.)*+"', re.S)
_BRACKETS = re.compile(r"[\[\]{}]")
_SURROGATE = re.compile("[\ud800-\udfff]")
#: C0 and C1 control characters and DEL: never part of a provider, zone, namespace or pool name.
_CONTROL = re.compile("[\x00-\x1f\x7f-\x9f]")
SESSION_KEY = re.compile(r"^[A-Za-z0-9._:-]{1,128}$")
LEASE_ID = re.compile(r"^[0-9a-f]{32}$")
FILTER_FIELDS = ("provider", "zone", "namespace", "pool", "selector")


def _query_is_utf8(environ: dict) -> None:
    """Refuse a query string whose names or values, percent-decoded, are not UTF-8 (werkzeug
    would replace the bad bytes with U+FFFD and go on); encoded surrogates (``%ed%a0%80``)
    are not UTF-8 either.

    Raises:
        ApiError: 400 ``invalid_field`` naming the parameter (or ``query`` when its name is
            at fault).
    """
    raw = environ.get("QUERY_STRING", "")
    if not raw:
        return
    for pair in raw.encode("latin-1", "replace").split(b"&"):
        name, _, value = pair.partition(b"=")
        try:
            key = unquote_to_bytes(name.replace(b"+", b" ")).decode("utf-8")
        except UnicodeDecodeError:
            raise bad_field("query", "a parameter name is not valid UTF-8") from None
        try:
            unquote_to_bytes(value.replace(b"+", b" ")).decode("utf-8")
        except UnicodeDecodeError:
            raise bad_field(key, "not valid UTF-8 once percent-decoded") from None


def query(req: Request, allowed: tuple[str, ...]) -> dict[str, str]:
    """Return the query parameters, each given at most once and all in ``allowed``.

    Raises:
        ApiError: 400 ``unknown_parameter`` for a parameter not in ``allowed``; 400
            ``invalid_field`` for one given twice or not UTF-8 once percent-decoded.
    """
    _query_is_utf8(req.environ)
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


def read_body(environ: dict, limit: int = MAX_BODY_BYTES) -> bytes:
    """Return the body of the WSGI request ``environ``, whole, or refuse it when it is longer
    than ``limit`` bytes.

    Reads ``wsgi.input`` directly: ``Content-Length`` bytes when given, else (a chunked body,
    which the server de-chunks and terminates) until the end, but never more than
    ``limit`` + 1 bytes, so an oversized body is refused whatever its framing, never cut to
    the limit and parsed.  Without a length and without a terminated stream the body is
    taken as empty (nothing says where it ends).

    Raises:
        ApiError: 413 ``payload_too_large``; 400 ``bad_json`` when the client sent fewer
            bytes than its ``Content-Length``.
    """
    too_large = ApiError(413, "payload_too_large", f"the body is larger than {limit} bytes")
    length = get_content_length(environ)  # None for a chunked body or a malformed header
    if length is not None and length > limit:
        raise too_large
    if length is None and not environ.get("wsgi.input_terminated"):
        return b""
    want = limit + 1 if length is None else length
    stream = environ["wsgi.input"]
    chunks, got = [], 0
    while got < want:
        chunk = stream.read(min(_READ_CHUNK, want - got))
        if not chunk:
            break
        chunks.append(chunk)
        got += len(chunk)
    if got > limit:
        raise too_large
    if length is not None and got < length:
        raise ApiError(400, "bad_json", f"the body ended after {got} of its {length} bytes")
    return b"".join(chunks)


def _no_constant(name: str):
    raise ValueError(f"{name} is not a JSON value")


#: The decoder of :func:`parse_json` (``json.loads(text, parse_constant=...)`` would build one
#: per call).
_DECODER = json.JSONDecoder(parse_constant=_no_constant)


def _depth(text: str) -> int:
    """How deeply arrays and objects nest in ``text`` (brackets inside strings ignored)."""
    depth = deepest = 0
    for m in _BRACKETS.finditer(_STRINGS.sub("", text)):
        if m.group() in "[{":
            depth += 1
            deepest = max(deepest, depth)
        else:
            depth -= 1
    return deepest


def _has_surrogate(value: Any) -> bool:
    if isinstance(value, str):
        return _SURROGATE.search(value) is not None
    if isinstance(value, dict):
        return any(_has_surrogate(k) or _has_surrogate(v) for k, v in value.items())
    if isinstance(value, list):
        return any(_has_surrogate(v) for v in value)
    return False


def parse_json(raw: bytes) -> Any:
    """Parse a JSON document strictly: UTF-8 (RFC 8259), nesting at most
    :data:`MAX_JSON_DEPTH`, no ``NaN``/``Infinity``, no lone UTF-16 surrogate in any string
    (``"\\ud800"``: Redis' Lua JSON decoder and any UTF-8 encoder refuse them).

    Raises:
        ApiError: 400 ``bad_json`` saying what is wrong (never echoing the body).
    """
    try:
        text = raw.decode("utf-8")  # strict: also refuses UTF-8-encoded surrogates
    except UnicodeDecodeError as exc:
        raise ApiError(400, "bad_json", f"the body is not valid UTF-8 (at byte {exc.start})") from None
    # (no more opening brackets than the limit: it cannot nest deeper, no need to look)
    if text.count("[") + text.count("{") > MAX_JSON_DEPTH and _depth(text) > MAX_JSON_DEPTH:
        raise ApiError(400, "bad_json", f"the body nests arrays or objects deeper than {MAX_JSON_DEPTH} levels")
    try:
        if text.startswith("\ufeff"):  # what json.loads refuses before decoding
            raise json.JSONDecodeError("Unexpected UTF-8 BOM (decode using utf-8-sig)", text, 0)
        doc = _DECODER.decode(text)
    except RecursionError:
        raise ApiError(400, "bad_json", "the body nests too deeply") from None
    except ValueError as exc:
        raise ApiError(400, "bad_json", f"the body is not valid JSON: {exc}") from None
    # strict UTF-8 holds no surrogate: a string can only get one from a \\u escape
    if "\\u" in text and _has_surrogate(doc):
        raise ApiError(400, "bad_json", "the body holds a lone UTF-16 surrogate (\\ud800-\\udfff) in a string")
    return doc


def body(req: Request | dict, allowed: tuple[str, ...]) -> dict:
    """Return the JSON object body (``{}`` when empty), with keys only from ``allowed``.

    Args:
        req: the Flask request, or a raw WSGI environ (:mod:`api.fastpath`).
        allowed: the field names the route knows.
    Raises:
        ApiError: 413 ``payload_too_large`` (:func:`read_body`), 415
            ``unsupported_media_type`` for a non-JSON content type, 400 ``bad_json`` for
            malformed JSON or a non-object (:func:`parse_json`), 400 ``unknown_field``.
    """
    environ = req if isinstance(req, dict) else req.environ
    raw = read_body(environ)
    if not raw:  # no body; whitespace alone is not a JSON document (400 bad_json below)
        return {}
    mimetype = environ.get("CONTENT_TYPE", "").partition(";")[0].strip().lower()
    if mimetype != "application/json" and not mimetype.endswith("+json"):
        raise ApiError(415, "unsupported_media_type", "send the body as application/json")
    doc = parse_json(raw)
    if not isinstance(doc, dict):
        raise ApiError(400, "bad_json", "the body must be a JSON object")
    for key in doc:
        if key not in allowed:
            raise bad_field(key, f"unknown field (allowed: {', '.join(allowed)})", "unknown_field")
    return doc


def _text(field: str, value, maximum: int = MAX_FILTER_LENGTH) -> str:
    if not isinstance(value, str):
        raise bad_field(field, f"must be a string, got {type(value).__name__}")
    if not value or len(value) > maximum:
        raise bad_field(field, f"must be 1 to {maximum} characters")
    if _CONTROL.search(value):
        raise bad_field(field, "must not contain control characters")
    if _SURROGATE.search(value):
        raise bad_field(field, "must not contain a lone UTF-16 surrogate")
    return value


def target(value, settings: BanSettings) -> Target:
    """The ``target`` of a lease request: a host name (or URL), as :class:`app.serving.bans.Target`.

    Raises:
        ApiError: 400 ``invalid_field`` (``target``): not a string, over
            :data:`MAX_TARGET_LENGTH` characters, or not a host name (the message says why).
    """
    value = _text("target", value, MAX_TARGET_LENGTH)
    try:
        return Target.of(value, settings)
    except TargetError as exc:
        raise bad_field("target", str(exc)) from None


def filters(values: dict) -> Filters:
    """Build :class:`app.serving.leases.Filters` from ``provider zone namespace pool selector`` values
    (a JSON body or the query string).

    Raises:
        ApiError: 400 ``invalid_field`` naming the field: not a string, empty or over
            :data:`MAX_FILTER_LENGTH` characters, a control character or lone surrogate in
            ``provider``/``zone``/``namespace``/``pool``; a selector that does not parse or exceeds a
            cap of :mod:`app.serving.selectors` (the message names the cap).
    """
    reqs: tuple[selectors.Requirement, ...] = ()
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
        pool=_text("pool", values["pool"]) if "pool" in values else None,
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
