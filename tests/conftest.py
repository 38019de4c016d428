"""Session-wide fixtures: a private Redis.  Area fixtures live in each area's conftest.py.

Shared fixtures come from plugins: the API fake (``kube``, ``kube_client``, ``kubeconfig`` and
their other names ``fake``, ``api``, ``custom_api``: tests/kubefake/fixtures.py) and the
reconcile Context on it (``make_context``: tests/support/contexts.py).  With pytest-xdist every
worker is a process of its own with its own session fixtures (its own Redis, its own kvm rig);
addresses and ports come from tests/support/loopback.py, so workers and other runs never collide.
"""

from __future__ import annotations

import pytest
import redis as redis_lib

from tests.support.redis_server import RedisServer

pytest_plugins = ["tests.kubefake.fixtures", "tests.support.contexts"]


@pytest.fixture(scope="session")
def redis_server():
    """A private redis-server for the whole session."""
    server = RedisServer()
    yield server
    server.stop()


@pytest.fixture()
def redis_url(redis_server) -> str:
    """URL of the session Redis, flushed before each test."""
    redis_lib.Redis.from_url(redis_server.url).flushall()
    return redis_server.url


@pytest.fixture()
def compute():
    """A started Compute Engine fake (:class:`tests.gcp.fake_compute.FakeCompute`), stopped after the test."""
    from tests.gcp.fake_compute import FakeCompute

    with FakeCompute() as server:
        yield server


@pytest.fixture()
def redis_client(redis_url):
    """A decode_responses client on the flushed session Redis."""
    client = redis_lib.Redis.from_url(redis_url, decode_responses=True)
    yield client
    client.close()
