"""The Python SDK (clients/python) against the real API with real Squids.

Each test starts ``proxy-operator api`` (the real command) on a free port, publishes Proxy
objects pointing at real Squids (probed healthy by the health engine), and uses
:class:`proxy_operator_client.Client` as a crawler would: lease, fetch through the proxy,
renew in the background, release with an outcome, wait out 503s, read typed errors.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from urllib.parse import quote

import pytest
import requests

from app.serving import view as serving
from proxy_operator_client import ApiError, Client, ClientClosed, TransportError
from tests.api.helpers import healthy
from tests.client.conftest import PASSWORD, SQUID_ADDRESSES, USER, publish_authed
from tests.health.servers import free_port

pytestmark = [pytest.mark.slow, pytest.mark.timeout(60)]


def _used(client: Client) -> dict[str, int]:
    return {p["name"]: p["leases"]["used"] for p in client.proxies()}


def _acquire_503s(api) -> float:
    """``proxy_operator_lease_requests_total{operation="acquire",outcome="no_proxy_available"}``."""
    needle = 'proxy_operator_lease_requests_total{operation="acquire",outcome="no_proxy_available"} '
    text = requests.get(api.url + "/metrics", timeout=5).text
    return sum(float(line[len(needle):]) for line in text.splitlines() if line.startswith(needle))


def test_a_lease_gives_a_working_proxy_and_is_released_ok(api, fleet, client_squids, health_settings,
                                                         client_origin, caplog):
    caplog.set_level(logging.DEBUG)
    healthy(fleet, client_squids, health_settings, count=3, max_leases=2)
    with Client(api.url, api.token) as client:
        with client.lease(ttl=60) as lease:
            assert lease.alive and lease.proxy.namespace == "default" and lease.proxy.name.startswith("px")
            assert lease.proxy_url == f"http://{lease.host}:{lease.port}" and lease.proxy_auth is None
            assert lease.host in SQUID_ADDRESSES and lease.ttl == 60 and lease.expires_at is not None
            session = lease.requests_session()
            # the IP echo sees the Squid's own outgoing address: the request went through the proxy
            assert session.get(client_origin.url("/ip"), timeout=10).text.strip() == lease.host
            assert _used(client)[lease.proxy.name] == 1
        released = lease.released
        assert (released.outcome, released.was_live, released.cooldown_until) == ("ok", True, None)
        assert not lease.alive and client.held() == []
        assert sum(_used(client).values()) == 0
        assert lease.release("blocked") is released  # released once; later calls return the first result
    text = caplog.text + repr(lease) + repr(client)
    assert api.token not in text and lease.id in text


def test_an_exception_releases_failed_and_a_reported_ban_cools_the_proxy_down(api, fleet, client_squids,
                                                                            health_settings):
    healthy(fleet, client_squids[:2], health_settings, count=2, max_leases=3)
    client = Client(api.url, api.token, wait=0)
    with pytest.raises(RuntimeError):
        with client.lease() as failed:
            raise RuntimeError("the crawler broke")
    assert failed.released.outcome == "failed" and failed.released.cooldown_until is not None

    with client.lease() as banned:
        assert banned.proxy.name != failed.proxy.name  # the failed proxy cools down for this client
        result = banned.report("blocked")
    # cooldown 600 s: past the lease's own expiry (TTL 300 s)
    assert result.outcome == "blocked" and result.was_live and result.cooldown_until > banned.expires_at
    assert banned.released is result  # leaving the block after report() does not release again

    with pytest.raises(ApiError) as info:
        client.lease()
    err = info.value
    assert (err.status, err.code, err.retry_after) == (503, "no_proxy_available", 1.0)
    assert "2 cooling down for this client" in err.message
    client.close()


def test_the_lease_is_renewed_in_the_background_across_two_ttls(api, fleet, client_squids, health_settings,
                                                               client_origin):
    healthy(fleet, client_squids[:1], health_settings, count=1, max_leases=2)
    with Client(api.url, api.token) as client:
        unrenewed = client.lease(ttl=2, renew=False)
        with client.lease(ttl=2) as lease:
            first_expiry = lease.expires_at
            time.sleep(4.5)  # more than two TTLs
            assert lease.alive and lease.renewals >= 3 and lease.expires_at > first_expiry
            assert lease.requests_session().get(client_origin.url("/ip"), timeout=10).status_code == 200
            assert _used(client)["px0"] == 1  # the unrenewed lease has expired; this one lives
            assert not unrenewed.alive
        assert lease.released.was_live
        assert unrenewed.release().was_live is False  # expired, but its outcome is still recorded


def test_a_lease_whose_proxy_is_withdrawn_is_lost_at_its_next_renewal(api, fleet, redis_client, client_squids,
                                                                      health_settings):
    [px] = healthy(fleet, client_squids[:1], health_settings, count=1, max_leases=2)
    with Client(api.url, api.token) as client:
        lease = client.lease(ttl=2)
        serving.withdraw(redis_client, px.uid)  # the Proxy was deleted
        deadline = time.monotonic() + 5
        while lease.lost is None and time.monotonic() < deadline:
            time.sleep(0.1)
        assert lease.lost is not None and (lease.lost.status, lease.lost.code) == (409, "proxy_unavailable")
        assert not lease.alive and "lost (proxy_unavailable)" in repr(lease)
        lease.release()  # whatever the API still knows of it, releasing a lost lease does not raise


def test_a_503_is_retried_as_retry_after_says_until_the_deadline(api, fleet, client_squids, health_settings):
    healthy(fleet, client_squids[:1], health_settings, count=1, max_leases=1)
    with Client(api.url, api.token) as client:
        held = client.lease()
        before = _acquire_503s(api)
        started = time.monotonic()
        with pytest.raises(ApiError) as info:
            client.lease(wait=2.5)
        elapsed = time.monotonic() - started
        attempts = _acquire_503s(api) - before
        # Retry-After: 1 -> attempts at about 0, 1 and 2 s (fewer if the machine is slow); the
        # next would start past the deadline, so the last 503 is raised without waiting for it
        assert info.value.code == "no_proxy_available" and 2 <= attempts <= 3, attempts
        assert (attempts - 1) * 1.0 <= elapsed < 2.5 + 0.5, elapsed

        threading.Timer(1.5, held.release).start()
        started = time.monotonic()
        with client.lease(wait=10) as lease:
            waited = time.monotonic() - started
            assert 1.5 <= waited < 4.5, waited  # got the proxy at the first retry after the release
            assert lease.proxy.name == "px0"


def test_credentials_with_url_special_characters(api, fleet, redis_client, auth_squid, health_settings,
                                                 client_origin, caplog):
    caplog.set_level(logging.DEBUG)
    publish_authed(fleet, redis_client, health_settings, [auth_squid])
    encoded = quote(PASSWORD, safe="")
    client = Client(api.url, api.token)
    with client.lease(ttl=2) as lease:
        assert lease.proxy_url == f"http://{USER}:{encoded}@{auth_squid.address}:{auth_squid.port}"
        assert lease.proxy_auth == (USER, PASSWORD)
        with lease.requests_session() as session:
            seen = session.get(client_origin.url("/headers"), timeout=10)
        assert seen.status_code == 200 and "proxy-authorization" not in {k.lower() for k in seen.json()}
        with lease.httpx_client(timeout=10) as hx:
            assert hx.get(client_origin.url("/ip")).text.strip() == auth_squid.address

        async def fetch() -> int:
            async with lease.httpx_async_client(timeout=10) as ahx:
                return (await ahx.get(client_origin.url("/ip"))).status_code

        assert asyncio.run(fetch()) == 200
        bare = f"http://{auth_squid.address}:{auth_squid.port}"
        assert requests.get(client_origin.url("/ip"), proxies={"http": bare}, timeout=10).status_code == 407
        time.sleep(1.5)  # one background renewal, logged
        assert lease.renewals >= 1 and lease.proxy_auth == (USER, PASSWORD)
    shown = [caplog.text, repr(lease), str(lease), repr(client), repr(lease.released), repr(lease.proxy),
             repr(lease.requests_session())]
    for text in shown:
        assert PASSWORD not in text and encoded not in text and api.token not in text, text
    assert "renewed" in caplog.text and "released" in caplog.text


def test_every_api_error_is_one_typed_exception_with_the_api_code(api, fleet, client_squids, health_settings):
    healthy(fleet, client_squids[:1], health_settings, count=1, max_leases=2)
    client = Client(api.url, api.token, wait=0)
    with pytest.raises(ApiError) as info:
        client.lease(ttl=0)
    assert (info.value.status, info.value.code, info.value.field) == (400, "invalid_field", "ttlSeconds")
    with pytest.raises(ApiError) as info:
        client.lease(session_key="not a key!")
    assert (info.value.code, info.value.field) == ("invalid_field", "sessionKey")
    with pytest.raises(ApiError) as info:
        client.lease(labels={"tier": "gold"}, zone="nowhere")
    assert info.value.code == "no_proxy_available" and "1 filtered out" in info.value.message

    lease = client.lease(ttl=30)
    lease.release()
    with pytest.raises(ApiError) as info:
        lease.renew()
    assert (info.value.status, info.value.code) == (404, "lease_not_found")

    client.close()
    wrong = "wrong-token-0123456789abcdef"
    with pytest.raises(ApiError) as info, Client(api.url, wrong, wait=0) as intruder:
        intruder.lease()
    assert (info.value.status, info.value.code) == (401, "unauthorized")
    assert wrong not in str(info.value) + repr(info.value)

    nowhere = Client(f"http://127.0.0.1:{free_port()}", api.token, wait=1.5)
    started = time.monotonic()
    with pytest.raises(TransportError) as info:
        nowhere.lease()  # connection refused: retried every second until the deadline, then raised
    assert 0.9 < time.monotonic() - started < 1.5 and api.token not in str(info.value)

    with pytest.raises(ValueError):
        Client("http://user:secret@127.0.0.1:1", api.token)
    closed = Client(api.url, api.token)
    closed.close()
    with pytest.raises(ClientClosed):
        closed.lease()


def test_the_filters_choose_the_proxy(api, fleet, client_squids, health_settings):
    """``provider=``, ``zone=`` and ``labels=`` (a dict or a selector string) reach the API: only
    a matching proxy is leased, and the lease says which."""
    healthy(fleet, client_squids, health_settings, count=4, max_leases=4, provider="gcp-eu", zones=["z1", "z2"],
            labels=lambda i: {"tier": "gold" if i == 3 else "silver"})
    with Client(api.url, api.token, wait=0) as client:
        for _ in range(3):
            with client.lease(provider="gcp-eu", zone="z2", labels={"tier": "gold"}, ttl=30) as lease:
                assert (lease.proxy.provider, lease.proxy.zone, lease.proxy.name) == ("gcp-eu", "z2", "px3")
        with client.lease(zone="z1", labels="tier!=gold", ttl=30) as lease:
            assert lease.proxy.zone == "z1" and lease.proxy.name in ("px0", "px2")
        with pytest.raises(ApiError) as info:
            client.lease(provider="other")
        assert info.value.code == "no_proxy_available" and "4 filtered out" in info.value.message
        assert {p["name"] for p in client.proxies(provider="gcp-eu", zone="z2")} == {"px1", "px3"}


def test_sticky_sessions(api, fleet, client_squids, health_settings):
    healthy(fleet, client_squids, health_settings, count=3, max_leases=3)
    with Client(api.url, api.token) as client:
        first = client.lease(session_key="shop-42")
        first.release()
        again = client.lease(session_key="shop-42")
        assert again.sticky and again.session_key == "shop-42" and again.proxy == first.proxy
        other = client.lease(session_key="shop-43", labels="!nothing")
        assert not other.sticky
    assert client.held() == []  # closing released them


def test_one_client_shared_by_many_threads(api, fleet, client_squids, health_settings, client_origin):
    """Twelve threads, capacity for six: they wait their turn (503s retried) and every lease is
    released; the client's bookkeeping stays right."""
    healthy(fleet, client_squids, health_settings, count=3, max_leases=2)
    client = Client(api.url, api.token, wait=20)
    errors: list = []
    served: list = []

    def crawl() -> None:
        try:
            for _ in range(2):
                with client.lease(ttl=30) as lease:
                    with lease.requests_session() as session:
                        served.append((lease.host, session.get(client_origin.url("/ip"), timeout=10).text.strip()))
                    time.sleep(0.2)
        except Exception as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=crawl) for _ in range(12)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert not errors, errors
    assert len(served) == 24 and all(host == seen for host, seen in served)
    assert client.held() == [] and sum(_used(client).values()) == 0
    client.close()
