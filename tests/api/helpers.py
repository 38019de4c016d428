"""Constants and small helpers shared by the API tests."""

from __future__ import annotations

from devcluster import loopback

#: The API tests' loopback block in this process: the origin on ``.1``, the test server on
#: ``.2``, the session Squids on ``.10``-``.14``, single-test Squids on ``.20`` and up.
NET = loopback.block("api")
TOKEN_A = "token-of-crawler-a-0123456789"
TOKEN_B = "token-of-crawler-b-9876543210"
TOKEN_C = "token-of-crawler-c-hashed-5555"
SQUID_ADDRESSES = [NET.host(n) for n in range(10, 15)]


def auth(token: str = TOKEN_A) -> dict:
    """The Authorization header for ``token``."""
    return {"Authorization": f"Bearer {token}"}


def healthy(fleet, squids, settings, *, count: int = 5, max_leases: int = 3, labels=None, provider=None,
            zones=None, namespace: str = "default", prefix: str = "px"):
    """Create ``count`` Proxies on ``squids`` (round robin) and probe them once: all healthy."""
    proxies = []
    for i in range(count):
        sq = squids[i % len(squids)]
        lab = labels(i) if callable(labels) else labels
        if provider:
            zone = zones[i % len(zones)] if zones else None
            px = fleet.managed(f"{prefix}{i}", sq.address, sq.port, provider=provider, zone=zone,
                               namespace=namespace, labels=lab, max_leases=max_leases)
        else:
            px = fleet.external(f"{prefix}{i}", sq.address, sq.port, namespace=namespace, labels=lab,
                                max_leases=max_leases)
        proxies.append(px)
    report = fleet.probe(proxies, settings)
    assert report.succeeded == count, report
    return proxies


def excluded(published: int, *, unhealthy: int = 0, draining: int = 0, full: int = 0, cooling: int = 0,
             filtered: int = 0) -> str:
    """The counts a ``no_proxy_available`` message ends with (:func:`app.serving.leases.no_proxy_message`)."""
    return (f"{published} published; excluded: {unhealthy} unhealthy or not yet probed, {draining} draining "
            f"(maxLeases 0 or leaving a pool), {full} at maxLeases, {cooling} cooling down for this client, {filtered} filtered out")
