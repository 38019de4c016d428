"""Fixtures of the API tests: five real Squids (``.10``-``.14`` of the area's loopback block,
:data:`tests.api.helpers.NET`), a local origin with an IP echo (``.1``), the Kubernetes API fake,
real Redis, a tokens file and the Flask app.

Proxies are made healthy the real way: Proxy objects in the fake pointing at the Squids,
probed once by the health engine.
"""

from __future__ import annotations

import threading

import pytest

from api import create_app
from api.settings import ApiSettings
from app.probes.settings import HealthSettings
from app.serving.leases import LeaseSettings
from tests.health.fleet import Fleet, start_squid
from tests.health.servers import OriginServer

from tests.api.helpers import NET, SQUID_ADDRESSES, TOKEN_A, TOKEN_B, TOKEN_C


@pytest.fixture(scope="session")
def api_origin():
    server = OriginServer(NET.host(1)).start()
    yield server
    server.stop()


@pytest.fixture(scope="session")
def api_squids():
    """Five Squids for the whole API session (each Proxy test reuses them)."""
    procs = [start_squid(a) for a in SQUID_ADDRESSES]
    yield procs
    threads = [threading.Thread(target=p.stop) for p in procs]
    for t in threads:
        t.start()
    for t in threads:
        t.join()


@pytest.fixture()
def tokens_file(tmp_path):
    import hashlib

    path = tmp_path / "tokens.yaml"
    path.write_text(
        "sharedNamespaces: [\"*\"]\n"
        "clients:\n"
        f"  - name: crawler-a\n    token: {TOKEN_A}\n"
        f"  - name: crawler-b\n    token: {TOKEN_B}\n"
        f"  - name: crawler-c\n    tokenSHA256: {hashlib.sha256(TOKEN_C.encode()).hexdigest()}\n")
    return str(path)


@pytest.fixture()
def lease_settings() -> LeaseSettings:
    return LeaseSettings(default_ttl=60, max_ttl=600, cooldown=30, sticky_ttl=600, record_grace=60)


@pytest.fixture()
def api_settings(redis_url, tokens_file, lease_settings) -> ApiSettings:
    return ApiSettings(redis_url=redis_url, tokens_file=tokens_file, leases=lease_settings)


@pytest.fixture()
def app(api_settings):
    return create_app(api_settings)


@pytest.fixture()
def client(app):
    return app.test_client()


@pytest.fixture()
def fleet(fake, redis_client, api_origin):
    api_client = fake.api_client()
    yield Fleet(api_client, redis_client, api_origin.url("/generate_204"))
    api_client.close()


@pytest.fixture()
def health_settings(api_origin) -> HealthSettings:
    # the Squids and origins of these tests are on loopback, which probes may not reach by default
    return HealthSettings(echo_url=api_origin.url("/ip"), concurrency=16, allowed_ranges=("127.0.0.0/8",))
