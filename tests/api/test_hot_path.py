"""The CPU shortcuts of the lease hot path (docs/performance.md, "Leases") give exactly what
the plain code gives: the JSON answers byte for byte, the JSON body checks, the filters sent
to the lease script, the access log's records and lines, and the per-thread Redis client.
"""

from __future__ import annotations

import io
import json
import logging
import threading

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from api import inputs
from api.errors import ApiError, json_bytes, plain_json_bytes
from api.routes import State
from api.server import ACCESS_FORMAT, ACCESS_LOGGER, AccessLog, AccessTextFormatter
from app.serving.leases import Filters

pytestmark = pytest.mark.timeout(120)

# -- answers: orjson where it writes what json.dumps writes ---------------------------------------

_PLAIN = st.recursive(
    st.none() | st.booleans() | st.integers(min_value=-2 ** 70, max_value=2 ** 70) | st.text(),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=12)


@settings(max_examples=400, deadline=None)
@given(_PLAIN)
def test_plain_json_bytes_are_json_bytes(doc):
    assert plain_json_bytes(doc) == json_bytes(doc)


@pytest.mark.parametrize("text", [
    "".join(map(chr, range(128))),      # every ASCII character, controls and DEL included
    "caf\u00e9", "\U0001f600", "\ud800", "a\\b\"c/d", "",
])
def test_plain_json_bytes_of_every_kind_of_string(text):
    doc = {"leaseId": "0" * 32, "proxyAuth": {"username": text, "password": text}, text: [text, 1, None, True]}
    assert plain_json_bytes(doc) == json_bytes(doc)


def test_plain_json_bytes_refuses_what_json_bytes_refuses():
    with pytest.raises(TypeError):
        plain_json_bytes({"when": object()})


# -- JSON bodies ----------------------------------------------------------------------------------

def _reference(raw: bytes):
    """parse_json without its shortcuts: every check on every body."""
    text = raw.decode("utf-8")
    if inputs._depth(text) > inputs.MAX_JSON_DEPTH:
        return "too deep"
    try:
        doc = json.loads(text, parse_constant=inputs._no_constant)
    except ValueError as exc:
        return f"not JSON: {exc}"
    return "surrogate" if inputs._has_surrogate(doc) else doc


def _parsed(raw: bytes):
    try:
        return inputs.parse_json(raw)
    except ApiError as exc:
        message = exc.message
        if "deeper than" in message:
            return "too deep"
        if "surrogate" in message:
            return "surrogate"
        return "not JSON: " + message.removeprefix("the body is not valid JSON: ")


@pytest.mark.parametrize("raw", [
    '\ufeff{"ttlSeconds": 60}'.encode(),                     # a BOM: json.loads refuses it
    b'{"ttlSeconds": 60}', b"{}", b"[]", b'"x"', b"NaN", b'{"a": -Infinity}',
    b'{"a": "\\ud800"}', b'{"\\udfff": 1}', b'{"a": "\\\\ud800"}', b'{"a": "\\u00e9\\ud83d\\ude00"}',
    b"[" * 32 + b"]" * 32, b"[" * 33 + b"]" * 33, b'["' + b"[" * 40 + b'"]', b"{" * 40,
])
def test_parse_json_shortcuts_decide_as_the_full_checks(raw):
    assert _parsed(raw) == _reference(raw)


@settings(max_examples=300, deadline=None)
@given(st.text(alphabet='[]{}"\\u0123456789abcdefd:, \ufeffnNaI', max_size=60))
def test_parse_json_shortcuts_on_any_text(text):
    assert _parsed(text.encode()) == _reference(text.encode())


# -- the lease script's filters -------------------------------------------------------------------

def test_no_filters_are_encoded_as_before():
    assert Filters().to_json() == Filters()._encode() == json.dumps({"selector": []})
    assert json.loads(Filters(zone="z").to_json()) == {"selector": [], "zone": "z"}


# -- the access log -------------------------------------------------------------------------------

class _Records(logging.Handler):
    def __init__(self) -> None:
        super().__init__()
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


@pytest.fixture()
def access_records():
    logger, handler = logging.getLogger(ACCESS_LOGGER), _Records()
    level, propagate = logger.level, logger.propagate
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    logger.propagate = False
    yield handler.records
    logger.removeHandler(handler)
    logger.setLevel(level)
    logger.propagate = propagate


def _environ(path: str = "/v1/leases") -> dict:
    return {"REMOTE_ADDR": "192.0.2.7", "REQUEST_METHOD": "POST", "PATH_INFO": path, "QUERY_STRING": "token=x",
            "SERVER_PROTOCOL": "HTTP/1.1", "HTTP_AUTHORIZATION": "Bearer secret", "wsgi.input": io.BytesIO()}


def test_access_log_writes_granians_record(access_records):
    seen = []

    def app(environ, start_response):
        start_response("201 CREATED", [("Content-Length", "2")])
        return [b"{}"]

    body = AccessLog(app)(_environ(), lambda *a: seen.append(a))
    assert body == [b"{}"] and seen == [("201 CREATED", [("Content-Length", "2")], None)]
    (record,) = access_records
    assert record.msg == ACCESS_FORMAT and record.levelno == logging.INFO
    assert set(record.args) == {"addr", "method", "path", "protocol", "status", "dt_ms"}
    assert {k: v for k, v in record.args.items() if k != "dt_ms"} == {
        "addr": "192.0.2.7", "method": "POST", "path": "/v1/leases", "protocol": "HTTP/1.1", "status": 201}
    assert "secret" not in record.getMessage() and "token" not in record.getMessage()


def test_access_log_of_a_failing_app_says_500(access_records):
    def app(environ, start_response):
        raise RuntimeError("boom")

    with pytest.raises(RuntimeError):
        AccessLog(app)(_environ(), lambda *a: None)
    assert access_records[0].args["status"] == 500


@pytest.mark.parametrize("path", ["/v1/leases", "/x\n<forged line>", "/a\\x0a", "/caf\u00e9\x85", "/\x7f"])
def test_access_text_formatter_is_the_logging_formatter_with_escaped_paths(path):
    fmt = "%(asctime)s %(levelname)s %(name)s %(message)s"
    ours, plain = AccessTextFormatter(fmt), logging.Formatter(fmt)
    for created in (1764528000.0, 1764528000.999, 1764528001.0005, 1764531599.5, 1764528000.25):
        record = logging.LogRecord(ACCESS_LOGGER, logging.INFO, __file__, 1, ACCESS_FORMAT, None, None)
        record.args = {"addr": "a", "method": "GET", "path": path, "protocol": "HTTP/1.1", "status": 200, "dt_ms": 1.0}
        record.created, record.msecs = created, (created - int(created)) * 1000
        line = ours.format(record)
        assert line.split(" INFO ")[0] == plain.formatTime(record)
        assert "\n" not in line and "\x85" not in line and "\x7f" not in line
        assert line.endswith(f'"GET {path} HTTP/1.1" 200 1.0ms') == (path.isprintable() and "\\" not in path)


# -- one Redis client per thread ------------------------------------------------------------------

def test_each_thread_keeps_its_own_connection(redis_client, tokens_file, api_settings):
    state = State(redis=redis_client, tokens=None, settings=api_settings)
    mine = state.thread_redis
    assert mine is state.thread_redis and mine.connection is not None and mine.ping()
    theirs = []
    t = threading.Thread(target=lambda: theirs.append(  # noqa: F821 - runs before the `del theirs` below
        (state.thread_redis, state.thread_redis.connection)))
    t.start()
    t.join()
    client, connection = theirs[0]
    assert client is not mine and connection is not mine.connection
    assert mine.connection_pool is redis_client.connection_pool
    del client, theirs
    # the finished thread's client gave its connection back to the shared pool
    assert connection in redis_client.connection_pool._available_connections
