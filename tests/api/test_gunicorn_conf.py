"""The deployed gunicorn configuration (api/gunicorn_conf.py): keep-alive connections served by
gthread workers, and a malformed setting refused with its name."""

from __future__ import annotations

import http.client
import os
import subprocess
import sys
import time

import pytest

from tests.support.processes import BIN, Process
from tests.support.redis_server import free_port

pytestmark = pytest.mark.slow

TOKEN = "conf-test-token-0123456789"


def _serve(tmp_path, redis_url, extra_env=None) -> tuple[Process, int]:
    tokens = tmp_path / "tokens.yaml"
    tokens.write_text(f"clients:\n  - {{name: crawler-a, token: {TOKEN}}}\n")
    port = free_port()
    proc = Process("gunicorn-conf", [str(BIN / "gunicorn"), "-c", "python:api.gunicorn_conf", "-w", "2",
                                     "-b", f"127.0.0.1:{port}", "api:create_app()"],
                   {"REDIS_URL": redis_url, "API_TOKENS_FILE": str(tokens), **(extra_env or {})}).start()
    deadline = time.monotonic() + 30
    while True:
        try:
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=2)
            conn.request("GET", "/healthz")
            if conn.getresponse().status == 200:
                conn.close()
                return proc, port
        except OSError:
            pass
        assert time.monotonic() < deadline and proc.alive(), proc.log()
        time.sleep(0.2)


@pytest.mark.parametrize("reuse_port", ["true", "false"])
def test_a_crawler_keeps_one_connection_across_requests(tmp_path, redis_url, reuse_port):
    """Requests travel over one keep-alive connection (the sync worker would close it), with
    one listening socket per worker or one shared socket."""
    proc, port = _serve(tmp_path, redis_url, {"API_REUSE_PORT": reuse_port})
    try:
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
        headers = {"Authorization": f"Bearer {TOKEN}"}
        conn.request("GET", "/v1/proxies", headers=headers)
        first = conn.getresponse()
        first.read()
        sock = conn.sock
        assert first.status == 200 and first.getheader("Connection", "").lower() != "close"
        for _ in range(5):
            conn.request("GET", "/v1/proxies", headers=headers)
            resp = conn.getresponse()
            resp.read()
            assert resp.status == 200
        assert conn.sock is sock, "the server closed the keep-alive connection"
        conn.close()
    finally:
        proc.stop()


@pytest.mark.parametrize("name, value", [("API_THREADS", "four"), ("API_WORKERS", "0"),
                                         ("API_KEEPALIVE_SECONDS", "-1"), ("API_REUSE_PORT", "maybe")])
def test_a_malformed_setting_is_refused_with_its_name(tmp_path, redis_url, name, value):
    tokens = tmp_path / "tokens.yaml"
    tokens.write_text(f"clients:\n  - {{name: crawler-a, token: {TOKEN}}}\n")
    env = {**os.environ, "API_TOKENS_FILE": str(tokens), "REDIS_URL": redis_url, name: value}
    out = subprocess.run([str(BIN / "proxy-operator"), "api", "--bind", f"127.0.0.1:{free_port()}"],
                         env=env, capture_output=True, text=True, timeout=60)
    assert out.returncode == 2
    assert name in out.stderr and value in out.stderr
