"""Fixtures of the client tests: the SDK and the Scrapy middleware against the real API.

Everything is real and local: ``proxy-operator api`` (the real command, granian) on a free
port, the session Redis, Proxy objects in the Kubernetes API fake pointing at real Squids on
the area's loopback block :data:`NET` (probed healthy by the health engine), and local origins.  The Squids may reach
loopback origins the way an operator declares it (:func:`devcluster.squid.loopback_policy`,
applied by :func:`tests.health.fleet.start_squid`).
"""

from __future__ import annotations

import threading
from dataclasses import dataclass

import pytest

from app.serving import view as serving
from app.squid import conf as squid_conf
from app.probes.settings import HealthSettings
from devcluster import loopback
from tests.api.served import TOKEN, start_api
from tests.health.fleet import Fleet, htpasswd_file, start_squid
from tests.health.servers import OriginServer
from tests.support.processes import Process

#: The client tests' loopback block in this process: the origin on ``.1``-``.2``, Squids from ``.10``.
NET = loopback.block("client")
#: Plain Squids of the SDK tests (no basic auth).
SQUID_ADDRESSES = [NET.host(n) for n in range(10, 13)]
#: The basic-auth Squid of the credentials test.
AUTH_SQUID_ADDRESS = NET.host(20)
#: A user and a password full of characters that mean something in a URL's authority.
USER = "crawler-7"
PASSWORD = "p$a@s:s%2Fw/o#r?d&+ =!"


@dataclass
class Api:
    """A running ``proxy-operator api``: its base ``url``, ``port``, ``token`` and process."""

    url: str
    port: int
    token: str
    proc: Process


def start_all(starters) -> list:
    """Run the zero-argument callables ``starters`` in parallel threads; their results in order
    (Squids start in about a second each; twelve in a row would take the test's budget)."""
    results: list = [None] * len(starters)
    errors: list = []

    def run(i, fn):
        try:
            results[i] = fn()
        except Exception as exc:  # noqa: BLE001 - re-raised below
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(i, fn)) for i, fn in enumerate(starters)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        for r in results:
            if r is not None:
                r.stop()
        raise errors[0]
    return results


def start_strict_squids(addresses, reachable: str) -> list:
    """Squids on ``addresses`` with the product's destination rules (app/squid/conf.py): every
    loopback destination denied but ``reachable`` (``403 ERR_ACCESS_DENIED``, a refused CONNECT)."""
    policy = squid_conf.SquidPolicy(http_ports=(80, 443, "1024-65535"), allowed_destinations=(f"{reachable}/32",))
    return start_all([lambda a=a: start_squid(a, policy=policy, loopback_origins=False) for a in addresses])


def stop_all(procs) -> None:
    """Stop ``procs`` (anything with ``stop()``) in parallel."""
    threads = [threading.Thread(target=p.stop) for p in procs]
    for t in threads:
        t.start()
    for t in threads:
        t.join()


@pytest.fixture(scope="session")
def client_origin():
    """Health URL, IP echo and header echo for the client tests (``.2`` of :data:`NET`)."""
    server = OriginServer(NET.host(2)).start()
    yield server
    server.stop()


@pytest.fixture(scope="session")
def client_squids():
    """Three plain Squids, each sending from its own address (the IP echo tells them apart)."""
    procs = start_all([lambda a=a: start_squid(a) for a in SQUID_ADDRESSES])
    yield procs
    stop_all(procs)


@pytest.fixture(scope="session")
def auth_squid():
    """A Squid that requires USER / PASSWORD."""
    sq = start_squid(AUTH_SQUID_ADDRESS,
                     policy=squid_conf.SquidPolicy(basic_auth_file=htpasswd_file(USER, PASSWORD)))
    yield sq
    sq.stop()


@pytest.fixture()
def fleet(fake, redis_client, client_origin):
    api_client = fake.api_client()
    yield Fleet(api_client, redis_client, client_origin.url("/generate_204"))
    api_client.close()


@pytest.fixture()
def health_settings(client_origin) -> HealthSettings:
    # the Squids and origins of these tests are on loopback, which probes may not reach by default
    return HealthSettings(echo_url=client_origin.url("/ip"), concurrency=16, allowed_ranges=("127.0.0.0/8",))


@pytest.fixture()
def api(tmp_path, redis_url):
    """``proxy-operator api`` on a free port of 127.0.0.1 (cooldown 600 s, TTLs up to 600 s)."""
    proc, port = start_api(tmp_path, redis_url, env={"LEASE_COOLDOWN_SECONDS": "600", "LEASE_MAX_TTL": "600",
                                                     "LEASE_RECORD_GRACE": "60"})
    yield Api(f"http://127.0.0.1:{port}", port, TOKEN, proc)
    proc.stop()


def publish_authed(fleet, redis_client, settings, squids, prefix: str = "authed", *, max_leases: int = 3) -> list:
    """External Proxies ``<prefix><i>`` on the basic-auth Squids ``squids``, published as the
    reconciler does for a provider with ``squid.basicAuth`` (their Secret named) and probed
    healthy in one batch with USER / PASSWORD (the probe copies them for the API, as the health
    engine does from the Secret)."""
    proxies = []
    for i, sq in enumerate(squids):
        px = fleet.external(f"{prefix}{i}", sq.address, sq.port, max_leases=max_leases)
        serving.publish(redis_client, px, address=sq.address, port=sq.port, phase="Running",
                        auth_secret=f"{px.name}-proxy-auth")
        proxies.append(px)
    report = fleet.probe(proxies, settings, credentials=lambda record: (USER, PASSWORD))
    assert report.succeeded == len(proxies), report
    return proxies
