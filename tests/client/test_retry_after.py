"""``Retry-After`` and non-JSON answers: the SDK against a stand-in of the API that varies them.

The real API always answers a 503 with ``Retry-After: 1``, which is also the SDK's default, so
the tests against it cannot tell whether the header is honoured.  Here a tiny HTTP server on
this area's loopback block (:data:`tests.client.conftest.NET`, a kernel-picked port) stands in
for the API only to vary the header (delta-seconds, HTTP-dates, garbage) and to answer with
something that is not the API's JSON; the SDK itself is the real one.  Plus unit tests of the
SDK's ``Retry-After`` parser.
"""

from __future__ import annotations

import email.utils
import http.server
import json
import math
import subprocess
import sys
import threading
import time

import pytest

from proxy_operator_client import ApiError, Client
from proxy_operator_client.client import MIN_RETRY
from proxy_operator_client.errors import parse_retry_after
from tests.client.conftest import NET
from tests.support.processes import ROOT

pytestmark = pytest.mark.timeout(60)

TOKEN = "stand-in-token-0123456789abcdef"
NO_PROXY = {"error": "no_proxy_available", "message": "0 proxies: none eligible"}


class _Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *args) -> None:
        pass

    def _answer(self) -> None:
        api: StandInApi = self.server.api
        length = int(self.headers.get("Content-Length") or 0)
        if length:
            self.rfile.read(length)
        with api.lock:
            api.calls.append((time.monotonic(), self.command, self.path, self.headers.get("Authorization")))
        status, headers, body = api.answer()
        self.send_response(status)
        for name, value in headers.items():
            self.send_header(name, value)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    do_GET = do_POST = do_DELETE = _answer  # http.server API


class StandInApi:
    """An HTTP server on ``NET.host(3)`` answering every request with ``answer()``:
    ``(status, headers, body bytes)``.  ``calls``: ``(monotonic time, method, path,
    Authorization)`` of each request."""

    def __init__(self, answer) -> None:
        self.answer = answer
        self.lock = threading.Lock()
        self.calls: list[tuple[float, str, str, str]] = []
        self.server = http.server.ThreadingHTTPServer((NET.host(3), 0), _Handler)
        self.server.daemon_threads = True
        self.server.api = self
        self.url = f"http://{NET.host(3)}:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def times(self) -> list[float]:
        with self.lock:
            return [c[0] for c in self.calls]

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def unavailable(retry_after) -> tuple[int, dict, bytes]:
    """A 503 ``no_proxy_available`` as the API sends it, with ``Retry-After: retry_after()``."""
    return 503, {"Content-Type": "application/json", "Retry-After": retry_after()}, json.dumps(NO_PROXY).encode()


@pytest.fixture()
def stand_in():
    servers: list[StandInApi] = []

    def start(answer) -> StandInApi:
        servers.append(StandInApi(answer))
        return servers[-1]

    yield start
    for s in servers:
        s.stop()


def lease_until_refused(api: StandInApi, wait: float) -> tuple[ApiError, float, list[float]]:
    """``Client.lease(wait=wait)`` against ``api``: the error, the seconds it took, and the
    request times relative to the call."""
    with Client(api.url, TOKEN) as client:
        started = time.monotonic()
        with pytest.raises(ApiError) as info:
            client.lease(wait=wait)
        elapsed = time.monotonic() - started
    return info.value, elapsed, [t - started for t in api.times()]


def gaps(times: list[float]) -> list[float]:
    return [b - a for a, b in zip(times, times[1:])]


# -- the client waits as Retry-After says --------------------------------------------------
def test_retry_after_in_seconds_sets_the_wait_and_the_deadline_stops_it(stand_in):
    api = stand_in(lambda: unavailable(lambda: "2"))
    err, elapsed, times = lease_until_refused(api, wait=5.5)
    # Retry-After: 2 (+ up to 10% jitter) -> attempts at 0, ~2, ~4; the next (~6) would pass
    # the 5.5 s deadline, so the last 503 is raised at once instead of being waited for
    assert (err.status, err.code, err.retry_after) == (503, "no_proxy_available", 2.0)
    assert len(times) == 3, times
    assert all(2.0 <= g < 2.2 + 0.6 for g in gaps(times)), times
    assert elapsed < 5.5 and elapsed - times[-1] < 0.5, (elapsed, times)
    assert {c[3] for c in api.calls} == {f"Bearer {TOKEN}"} and {c[1:3] for c in api.calls} == {("POST", "/v1/leases")}

    # a Retry-After longer than what is left of the deadline: no retry at all (the SDK's 1 s
    # default would have retried once)
    api.calls.clear()
    err, elapsed, times = lease_until_refused(api, wait=1.5)
    assert len(times) == 1 and elapsed < 0.5, (elapsed, times)


def test_retry_after_as_an_http_date_sets_the_wait(stand_in):
    def later() -> str:
        # a whole second of the API's clock 2-3 s from now (an HTTP-date has no fractions)
        return email.utils.formatdate(math.ceil(time.time()) + 2, usegmt=True)

    api = stand_in(lambda: unavailable(later))
    err, elapsed, times = lease_until_refused(api, wait=7)
    assert err.code == "no_proxy_available" and 1.8 < err.retry_after <= 3.0
    assert len(times) >= 2, times
    assert all(1.9 <= g < 3.3 + 0.6 for g in gaps(times)), times  # not the 1 s default
    assert elapsed < 7 and elapsed - times[-1] < 0.5, (elapsed, times)


@pytest.mark.parametrize("header", ["0", "-1", "Thu, 01 Jan 1970 00:00:00 GMT"])
def test_an_immediate_retry_after_does_not_hammer_the_api(stand_in, header):
    """``0``, a negative number (invalid: the default applies) or a date already past (the
    API's clock behind the client's): the client still pauses between attempts."""
    api = stand_in(lambda: unavailable(lambda: header))
    err, elapsed, times = lease_until_refused(api, wait=1.5)
    assert err.code == "no_proxy_available" and elapsed < 1.5
    assert 1 <= len(times) <= 1.5 / MIN_RETRY + 1, len(times)
    assert all(g >= MIN_RETRY for g in gaps(times)), times


def test_garbage_retry_after_falls_back_to_one_second(stand_in):
    api = stand_in(lambda: unavailable(lambda: "soon"))
    err, elapsed, times = lease_until_refused(api, wait=2.8)
    assert err.retry_after is None
    assert len(times) == 3 and all(1.0 <= g < 1.1 + 0.6 for g in gaps(times)), times


# -- answers that are not the API's JSON -----------------------------------------------------
def test_an_error_answer_that_is_not_the_apis_json_is_unexpected_response(stand_in):
    page = b"<html><body><h1>502 Bad Gateway</h1></body></html>"
    api = stand_in(lambda: (502, {"Content-Type": "text/html"}, page))
    with Client(api.url, TOKEN, wait=5) as client:
        with pytest.raises(ApiError) as info:
            client.lease()
        err = info.value
        assert (err.status, err.code, err.field, err.retry_after) == (502, "unexpected_response", None, None)
        assert "502" in err.message and "without the API's JSON error" in err.message
        assert len(api.calls) == 1  # not a 503: not retried

        # JSON, but not the API's error document
        api.answer = lambda: (500, {"Content-Type": "application/json"}, b'["oops"]')
        with pytest.raises(ApiError) as info:
            client.proxies()
        assert (info.value.status, info.value.code) == (500, "unexpected_response")

        # a 503 from a gateway (no JSON) is retried as its Retry-After says, then raised as is
        api.calls.clear()
        api.answer = lambda: (503, {"Content-Type": "text/html", "Retry-After": "1"}, b"<html>busy</html>")
        with pytest.raises(ApiError) as info:
            client.lease(wait=1.5)
        assert (info.value.status, info.value.code, info.value.retry_after) == (503, "unexpected_response", 1.0)
        assert len(api.calls) == 2

        # a success whose body is not a JSON object
        api.answer = lambda: (200, {"Content-Type": "text/plain"}, b"ok")
        with pytest.raises(ApiError) as info:
            client.proxies()
        assert (info.value.status, info.value.code) == (200, "unexpected_response")
        assert "not a JSON object" in info.value.message
    assert TOKEN not in repr(info.value) + str(info.value)


# -- the parser -----------------------------------------------------------------------------
NOW = 784111777.0  # Sun, 06 Nov 1994 08:49:37 GMT


@pytest.mark.parametrize("value, seconds", [
    ("2", 2.0), (" 120 ", 120.0), ("0", 0.0), ("1.5", 1.5),
    # HTTP-date in its three formats (RFC 9110 5.6.7), 10 s after NOW
    ("Sun, 06 Nov 1994 08:49:47 GMT", 10.0),
    ("Sunday, 06-Nov-94 08:49:47 GMT", 10.0),
    ("Sun Nov  6 08:49:47 1994", 10.0),
    ("Sun, 06 Nov 1994 08:49:47 -0000", 10.0),
    ("Sun, 06 Nov 1994 09:49:47 +0100", 10.0),
    ("Sun, 06 Nov 1994 08:49:27 GMT", 0.0),  # already past
])
def test_parse_retry_after_reads_seconds_and_http_dates(value, seconds):
    assert parse_retry_after(value, now=NOW) == pytest.approx(seconds)


@pytest.mark.parametrize("value", [None, "", "  ", "soon", "2 s", "-1", "-0.5", "nan", "inf", "-inf",
                                   "Thu, 31 Feb 1994 08:49:47 GMT", "Sun, 06 Nov 1994 25:61:47 GMT"])
def test_parse_retry_after_rejects_garbage_and_negative_values(value):
    assert parse_retry_after(value, now=NOW) is None


def test_parse_retry_after_counts_from_now_by_default():
    assert 4 <= parse_retry_after(email.utils.formatdate(time.time() + 5, usegmt=True)) <= 5


@pytest.mark.parametrize("tz", ["Asia/Tokyo", "America/New_York"])
def test_http_dates_without_a_zone_are_gmt_whatever_the_local_time_zone(tz):
    code = ("from proxy_operator_client.errors import parse_retry_after as p; "
            f"print(p('Sun Nov  6 08:49:47 1994', now={NOW}), p('Sun, 06 Nov 1994 08:49:47 -0000', now={NOW}))")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env={"PATH": "/usr/bin:/bin", "TZ": tz},
                         capture_output=True, text=True, timeout=30, check=True).stdout
    assert out.split() == ["10.0", "10.0"]
