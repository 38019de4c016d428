"""Redis requires a password, and every process uses it without ever showing it
(docs/security.md).

A private ``redis-server`` with ``requirepass`` (given on stdin, as deploy/ does); the real
Celery worker, beat, watcher, API and Flower started through their real commands with
``REDIS_URL`` (no password) and ``REDIS_PASSWORD``, as deploy/ and docker-compose.yml give
them.  With the password they work (beat's health sweep reaches the worker through the broker,
the schedule and lock live in the protected Redis); without it, or with a wrong one, they stop
at once with one line that says what to set; the password appears in no log, and Flower
(basic auth from ``FLOWER_BASIC_AUTH``) refuses a request without credentials.
"""

from __future__ import annotations

import secrets
from urllib.parse import quote

import pytest
import redis as redis_lib
import requests

from devcluster.redis_server import RedisServer, free_port
from tests.api.served import request, start_api
from tests.support.processes import BIN, Process, celery_beat, celery_worker, watcher
from tests.support.waiting import wait_for

pytestmark = [pytest.mark.slow, pytest.mark.timeout(180)]

#: URL-special characters, so that a leak of the percent-encoded form is caught too.
PASSWORD = f"redis/S3cret+{secrets.token_hex(6)}@pw"
FLOWER_PASSWORD = f"flower-S3cret-{secrets.token_hex(6)}"


@pytest.fixture(scope="module")
def secured():
    server = RedisServer(password=PASSWORD)
    yield server
    server.stop()


@pytest.fixture()
def base_env(secured, tmp_path, kube):
    """Environment of the operator processes, without any Redis password yet."""
    secured_client = redis_lib.Redis.from_url(secured.authed_url)
    secured_client.flushall()
    secured_client.close()
    return {"REDIS_URL": secured.url, "PROVIDERS_CONFIG": "", "LOG_LEVEL": "DEBUG",
            "KUBECONFIG": kube.write_kubeconfig(str(tmp_path / "kubeconfig")),
            "HEALTH_SWEEP_INTERVAL": "1", "RESYNC_INTERVAL": "3600", "GC_INTERVAL": "3600"}


def _leaks(text: str) -> list[str]:
    return [form for form in (PASSWORD, quote(PASSWORD, safe=""), FLOWER_PASSWORD) if form in text]


def test_every_process_works_with_the_password_and_never_shows_it(secured, base_env, tmp_path):
    env = {**base_env, "REDIS_PASSWORD": PASSWORD}
    worker = celery_worker(env, queues="health", concurrency=1).start()
    beat = celery_beat(env, str(tmp_path)).start()
    watch = watcher(env).start()
    procs = [worker, beat, watch]
    try:
        api, port = start_api(tmp_path, secured.url, env={"REDIS_PASSWORD": PASSWORD})  # /healthz pings Redis
        procs.append(api)
        worker.wait_for_log("ready.", timeout=60)
        beat.wait_for_log("beat: Starting", timeout=30)
        watch.wait_for_log("leading: streaming Proxy events", timeout=30)
        assert request(port, "GET", "/healthz")[0] == 200
        # beat -> broker -> worker, all through the protected Redis
        worker.wait_for_log("Task health.sweep[", timeout=30)
        wait_for(lambda: "succeeded" in worker.log().split("Task health.sweep[", 1)[1], 30, "a sweep to succeed")
        client = redis_lib.Redis.from_url(secured.authed_url, decode_responses=True)
        assert any(k.startswith("po:redbeat") for k in client.scan_iter("po:redbeat*"))
        client.close()
        assert "redis://:**@127.0.0.1" in worker.log()  # Celery masks the password in its banner
    finally:
        for p in procs:
            p.stop()
    for p in procs:
        assert _leaks(p.log()) == [], f"{p.name} logged the Redis password"


@pytest.mark.parametrize("password,reason", [
    (None, "Authentication required; no REDIS_PASSWORD is set"),
    ("not-the-password", "invalid username-password pair or user is disabled; REDIS_PASSWORD is set"),
])
def test_without_the_right_password_every_process_stops_with_one_clear_line(base_env, tmp_path, password, reason):
    env = dict(base_env)
    if password:
        env["REDIS_PASSWORD"] = password
    procs = [celery_worker(env, queues="health", concurrency=1).start(), celery_beat(env, str(tmp_path)).start(),
             watcher(env).start()]
    try:
        for p in procs:
            p.proc.wait(60)
            assert p.proc.returncode == 2, f"{p.name} exited {p.proc.returncode}:\n{p.log()[-3000:]}"
            assert "refused the connection's credentials" in p.log(), p.log()[-3000:]
            assert reason in p.log(), p.log()[-3000:]
            assert "set REDIS_PASSWORD" in p.log()
            assert _leaks(p.log()) == [] and (password is None or password not in p.log())
    finally:
        for p in procs:
            p.stop()


def test_flower_asks_for_credentials_and_shows_no_password(secured, base_env):
    port = free_port()
    env = {**base_env, "REDIS_PASSWORD": PASSWORD, "FLOWER_BASIC_AUTH": f"operator:{FLOWER_PASSWORD}"}
    flower = Process("flower", [str(BIN / "celery"), "-A", "workers", "flower", "--address=127.0.0.1",
                                f"--port={port}"], env).start()
    url = f"http://127.0.0.1:{port}"
    try:
        wait_for(lambda: _get(f"{url}/healthcheck"), 60, "Flower to answer")
        for path in ("/", "/broker", "/tasks", "/api/workers", "/api/tasks"):
            assert requests.get(url + path, timeout=10).status_code == 401, path
            assert requests.get(url + path, auth=("operator", "wrong"), timeout=10).status_code == 401, path
        page = requests.get(f"{url}/broker", auth=("operator", FLOWER_PASSWORD), timeout=30)
        assert page.status_code == 200 and "redis://" in page.text
        assert _leaks(page.text) == []
        # the kubelet's probes and Prometheus need no credentials (task counts only; the
        # NetworkPolicy decides who reaches the port at all)
        assert requests.get(f"{url}/healthcheck", timeout=10).status_code == 200
        metrics = requests.get(f"{url}/metrics", timeout=10)
        assert metrics.status_code == 200 and _leaks(metrics.text) == []
    finally:
        flower.stop()
    assert _leaks(flower.log()) == []


def _get(url: str) -> bool:
    try:
        return requests.get(url, timeout=2).status_code == 200
    except requests.RequestException:
        return False
