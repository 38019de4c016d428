"""Session-wide fixtures: a private Redis.  Area fixtures live in each area's conftest.py."""

from __future__ import annotations

import pytest
import redis as redis_lib

from tests.support.redis_server import RedisServer

pytest_plugins = ["tests.kubefake.fixtures"]


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
def redis_client(redis_url):
    """A decode_responses client on the flushed session Redis."""
    client = redis_lib.Redis.from_url(redis_url, decode_responses=True)
    yield client
    client.close()
