"""Fixtures of the health tests: a local origin (health URL + IP echo), the Kubernetes API
fake, real Redis (``redis_client`` from tests/conftest.py) and a :class:`Fleet` helper.

Addresses: this process's loopback block :data:`NET` (``devcluster/loopback.py``): origins
on ``.1``-``.9``, Squids on ``.10`` and up.
"""

from __future__ import annotations

import itertools
import threading

import pytest

from app.probes.settings import HealthSettings
from devcluster import loopback
from tests.health.fleet import Fleet
from tests.health.servers import OriginServer

#: The health tests' loopback block in this process (another run or xdist worker has its own).
NET = loopback.block("health")
ORIGIN_ADDRESS = NET.host(1)
#: Probes may reach loopback in these tests (``PROBE_ALLOWED_RANGES``).
LOOPBACK = ("127.0.0.0/8",)
_addresses = (NET.host(n) for n in itertools.cycle(range(10, 250)))


@pytest.fixture(scope="session")
def origin():
    """The HTTP origin: /generate_204, /status/<n>, /headers, /ip (the IP echo)."""
    server = OriginServer(ORIGIN_ADDRESS).start()
    yield server
    server.stop()


@pytest.fixture()
def next_address():
    """A function returning a fresh loopback address for a Squid."""
    return lambda: next(_addresses)


@pytest.fixture()
def fleet(fake, redis_client, origin):
    client = fake.api_client()
    yield Fleet(client, redis_client, origin.url("/generate_204"))
    client.close()


@pytest.fixture()
def settings(origin) -> HealthSettings:
    """Health settings for tests: local IP echo, a long provisioning deadline; loopback allowed
    (every Squid and origin here is on loopback, which the default destination policy denies)."""
    return HealthSettings(echo_url=origin.url("/ip"), provision_deadline=600, outage_min_proxies=3,
                          concurrency=16, allowed_ranges=LOOPBACK)


@pytest.fixture()
def squids():
    """Start Squids with ``squids(start_squid(...))``; all stopped after the test."""
    started = []

    def keep(proc):
        started.append(proc)
        return proc

    yield keep
    stoppers = [threading.Thread(target=proc.stop) for proc in started]  # ~2 s each: in parallel
    for t in stoppers:
        t.start()
    for t in stoppers:
        t.join()
