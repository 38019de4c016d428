"""The lease index (``po:load``): a lease request reads the least-loaded proxies, not the
fleet, and the index follows health, maxLeases, withdrawal and lease expiry."""

from __future__ import annotations

import re

import time

import pytest

from api import create_app
from app.serving import leases, selectors, view as serving
from app.store import keys as redis_keys
from app.pools import demand
from app.resources import Proxy
from tests.api.helpers import NET, auth, excluded
from tests.health.fleet import start_squid

pytestmark = pytest.mark.timeout(60)


def _healthy_proxy(r, name: str, uid: str, *, max_leases: int, namespace: str = "idx",
                   host: str = "203.0.113.9", provider: str | None = None) -> str:
    """Publish one proxy (External, or Managed on ``provider``) and record it healthy as the
    health engine would; return its uid."""
    if provider:
        spec = {"mode": "Managed", "provider": provider, "cloudInit": {"inline": "#cloud-config\n"}}
    else:
        spec = {"mode": "External", "endpoint": {"host": host, "port": 3128}}
    proxy = Proxy.from_dict({"metadata": {"name": name, "namespace": namespace, "uid": uid},
                             "spec": {**spec, "maxLeases": max_leases}})
    serving.publish(r, proxy, address=host, port=3128, phase="Ready")
    r.hset(redis_keys.proxy(uid), mapping={"health": "healthy", "healthy": "1"})
    leases.reindex(r, uid)
    return uid


def _publish(r, n: int, *, max_leases: int = 2) -> list[str]:
    """Publish ``n`` healthy External proxies ``p0``… (uids ``uid-0000``…, in that order)."""
    return [_healthy_proxy(r, f"p{i}", f"uid-{i:04d}", max_leases=max_leases, host=f"203.0.113.{i % 250 + 1}")
            for i in range(n)]


def _hmget_calls(r) -> int:
    return int(r.info("commandstats").get("cmdstat_hmget", {}).get("calls", 0))


def _refused(r, client: str, filters, settings) -> tuple[str, int]:
    """Ask for a lease that must be refused, once to load the script and once measured; return
    the second refusal's message and the proxy reads (``HMGET`` calls) it made in Redis."""
    with pytest.raises(leases.LeaseError):
        leases.acquire(r, client, filters, ttl=60, settings=settings)  # loads the script
    before = _hmget_calls(r)
    with pytest.raises(leases.LeaseError) as info:
        leases.acquire(r, client, filters, ttl=60, settings=settings)
    return info.value.message, _hmget_calls(r) - before


def test_a_lease_request_reads_a_few_proxies_not_the_fleet(redis_client, lease_settings):
    _publish(redis_client, 300)
    leases.acquire(redis_client, "warm", leases.Filters(), ttl=30, settings=lease_settings)  # loads the script
    before = _hmget_calls(redis_client)
    got = leases.acquire(redis_client, "a", leases.Filters(), ttl=30, settings=lease_settings)
    # One proxy read to choose (plus one for the answer), where a scan would read all 300.
    assert _hmget_calls(redis_client) - before <= 3
    assert got.used == 1


def test_the_least_loaded_proxy_is_chosen_once_expired_leases_are_gone(redis_client, lease_settings):
    a, b = _publish(redis_client, 2, max_leases=3)
    long = leases.acquire(redis_client, "c", leases.Filters(), ttl=60, settings=lease_settings)
    short = leases.acquire(redis_client, "c", leases.Filters(), ttl=1, settings=lease_settings)
    assert (long.uid, short.uid) == (a, b)  # equal loads: uid order
    time.sleep(1.2)  # the 1 s lease expires: b now carries no lease, a still one
    third = leases.acquire(redis_client, "c", leases.Filters(), ttl=60, settings=lease_settings)
    assert third.uid == b and third.used == 1
    assert redis_client.zscore(redis_keys.LOAD, a) == pytest.approx(1 + 1 / 3 / 2)
    assert set(redis_client.zrange("po:lease-expiry", 0, -1)) == {f"{a}/{long.id}", f"{b}/{third.id}"}


def test_renew_counts_the_proxy_afresh(redis_client, lease_settings):
    [a] = _publish(redis_client, 1, max_leases=3)
    keep = leases.acquire(redis_client, "c", leases.Filters(), ttl=60, settings=lease_settings)
    leases.acquire(redis_client, "c", leases.Filters(), ttl=1, settings=lease_settings)
    assert redis_client.zscore(redis_keys.LOAD, a) == pytest.approx(2 + 2 / 3 / 2)
    time.sleep(1.2)
    assert leases.renew(redis_client, "c", keep.id, ttl=60, settings=lease_settings).used == 1
    assert redis_client.zscore(redis_keys.LOAD, a) == pytest.approx(1 + 1 / 3 / 2)


def test_a_full_proxy_leaves_the_index_until_a_lease_ends(redis_client, lease_settings):
    [a] = _publish(redis_client, 1, max_leases=2)
    first = leases.acquire(redis_client, "c", leases.Filters(), ttl=60, settings=lease_settings)
    leases.acquire(redis_client, "c", leases.Filters(), ttl=60, settings=lease_settings)
    assert redis_client.zscore(redis_keys.LOAD, a) is None
    with pytest.raises(leases.LeaseError) as info:
        leases.acquire(redis_client, "c", leases.Filters(), ttl=60, settings=lease_settings)
    assert info.value.message.endswith(excluded(1, full=1))
    leases.release(redis_client, "c", first.id, outcome="ok", settings=lease_settings)
    assert redis_client.zscore(redis_keys.LOAD, a) == pytest.approx(1.25)


def test_full_proxies_cost_nothing_to_a_lease(redis_client, lease_settings):
    """Many small proxies at their maximum do not sit in front of the ones with room."""
    small = _publish(redis_client, 200, max_leases=1)
    for _ in small:
        leases.acquire(redis_client, "fill", leases.Filters(), ttl=60, settings=lease_settings)
    big = _healthy_proxy(redis_client, "big", "uid-big", max_leases=50, host="203.0.113.200")
    leases.acquire(redis_client, "c", leases.Filters(), ttl=60, settings=lease_settings)
    before = _hmget_calls(redis_client)
    got = leases.acquire(redis_client, "c", leases.Filters(), ttl=60, settings=lease_settings)
    assert got.uid == big and _hmget_calls(redis_client) - before <= 3


def test_ties_go_to_the_proxy_with_the_lower_fill_ratio(redis_client, lease_settings):
    small = _publish(redis_client, 1, max_leases=2)[0]
    big = _healthy_proxy(redis_client, "big", "uid-big", max_leases=10, host="203.0.113.200")
    first, second = (leases.acquire(redis_client, "c", leases.Filters(), ttl=60, settings=lease_settings) for _ in range(2))
    assert {first.uid, second.uid} == {small, big}
    # Both carry one lease now: 1/10 beats 1/2.
    assert leases.acquire(redis_client, "c", leases.Filters(), ttl=60, settings=lease_settings).uid == big


def test_filters_read_past_proxies_that_do_not_match(redis_client, lease_settings):
    _publish(redis_client, 40)
    odd = _healthy_proxy(redis_client, "odd", "uid-odd", max_leases=1, namespace="other", host="203.0.113.201")
    # The matching proxy sorts last (uid order among equal loads) and beyond the first page.
    got = leases.acquire(redis_client, "c", leases.Filters(namespace="other"), ttl=60, settings=lease_settings)
    assert got.uid == odd
    with pytest.raises(leases.LeaseError) as info:
        leases.acquire(redis_client, "c", leases.Filters(namespace="other"), ttl=60, settings=lease_settings)
    assert info.value.message.endswith(excluded(41, full=1, filtered=40))


def test_the_index_follows_health_max_leases_and_withdrawal(redis_client, fleet, health_settings, lease_settings):
    """Written by the real writers: the health engine's probes, refresh and withdraw."""
    sq = start_squid(NET.host(23))
    try:
        px = fleet.external("indexed", sq.address, sq.port, max_leases=2)
        assert redis_client.zscore(redis_keys.LOAD, px.uid) is None  # published, not yet healthy
        fleet.probe([px], health_settings)
        assert redis_client.zscore(redis_keys.LOAD, px.uid) == 0
        got = leases.acquire(redis_client, "c", leases.Filters(), ttl=60, settings=lease_settings)
        assert redis_client.zscore(redis_keys.LOAD, px.uid) == pytest.approx(1.25)

        zero = Proxy.from_dict({**px.raw, "spec": {**px.raw["spec"], "maxLeases": 0}})
        assert serving.refresh(redis_client, zero)
        assert redis_client.zscore(redis_keys.LOAD, px.uid) is None
        assert serving.refresh(redis_client, px)
        assert redis_client.zscore(redis_keys.LOAD, px.uid) == pytest.approx(1.25)

        leases.release(redis_client, "c", got.id, outcome="ok", settings=lease_settings)
        assert redis_client.zscore(redis_keys.LOAD, px.uid) == 0
        sq.stop()
        fleet.probe([px], health_settings)  # failureThreshold 1: unhealthy now
        assert redis_client.zscore(redis_keys.LOAD, px.uid) is None
        serving.publish(redis_client, px, address=sq.address, port=sq.port, phase="Ready")
        redis_client.hset(redis_keys.proxy(px.uid), "healthy", "1")
        leases.reindex(redis_client, px.uid)
        assert redis_client.zscore(redis_keys.LOAD, px.uid) == 0
        serving.withdraw(redis_client, px.uid)
        assert redis_client.zscore(redis_keys.LOAD, px.uid) is None
    finally:
        sq.stop()


def test_the_api_rebuilds_the_index_when_it_starts(redis_client, api_settings):
    """A Redis written before the index existed (an upgrade): leases work from the first request."""
    [uid] = _publish(redis_client, 1)
    redis_client.delete(redis_keys.LOAD)
    client = create_app(api_settings).test_client()
    resp = client.post("/v1/leases", headers=auth(), json={})
    assert resp.status_code == 201 and resp.get_json()["proxy"]["name"] == "p0"
    assert redis_client.zscore(redis_keys.LOAD, uid) == pytest.approx(1.25)


def test_the_api_starts_while_redis_is_down(tokens_file):
    from api.settings import ApiSettings

    from devcluster.redis_server import free_port

    app = create_app(ApiSettings(redis_url=f"redis://127.0.0.1:{free_port()}/0", tokens_file=tokens_file))
    assert app.test_client().get("/healthz").status_code >= 500


def test_a_proxy_freed_behind_a_backlog_of_expiries_is_still_leased(redis_client, lease_settings):
    """More expired leases than one request sweeps, on proxies this request cannot use, come
    before the one that would fit: the request still finds it (no false 503)."""
    _healthy_proxy(redis_client, "g", "uid-g", max_leases=200, provider="gcp")
    aws = _healthy_proxy(redis_client, "a", "uid-a", max_leases=1, provider="aws")
    for _ in range(leases.EXPIRE_BATCH + 50):
        leases.acquire(redis_client, "c", leases.Filters(provider="gcp"), ttl=1, settings=lease_settings)
    leases.acquire(redis_client, "c", leases.Filters(provider="aws"), ttl=1, settings=lease_settings)
    assert redis_client.zscore(redis_keys.LOAD, aws) is None  # full
    time.sleep(1.2)
    got = leases.acquire(redis_client, "c", leases.Filters(provider="aws"), ttl=60, settings=lease_settings)
    assert got.uid == aws and got.used == 1


def test_withdraw_forgets_the_proxy_leases_and_renewing_one_ends_it(redis_client, lease_settings):
    [a] = _publish(redis_client, 1, max_leases=3)
    got = leases.acquire(redis_client, "c", leases.Filters(), ttl=60, settings=lease_settings)
    serving.withdraw(redis_client, a)
    assert redis_client.zcard("po:lease-expiry") == 0
    with pytest.raises(leases.LeaseError) as info:
        leases.renew(redis_client, "c", got.id, ttl=None, settings=lease_settings)
    assert info.value.code == leases.PROXY_UNAVAILABLE


@pytest.mark.parametrize("filters", [leases.Filters(), leases.Filters(namespace="idx")])
def test_a_saturated_fleet_answers_503_without_reading_it(redis_client, lease_settings, filters):
    """Crawlers keep asking when every proxy is taken: each 503 must stay cheap."""
    uids = _publish(redis_client, 300, max_leases=1)
    for _ in uids:
        leases.acquire(redis_client, "fill", leases.Filters(), ttl=60, settings=lease_settings)
    message, spent = _refused(redis_client, "late", filters, lease_settings)
    assert message.endswith(excluded(300, full=300))
    # Without filters the count of full proxies is read, not the proxies; a filter must look
    # at each full proxy's placement (one read each), never at their leases.
    assert spent == (0 if filters == leases.Filters() else 300)


def test_the_503_counts_cooling_full_and_free_proxies_apart(redis_client, lease_settings):
    _, _, c = _publish(redis_client, 3, max_leases=1)
    first = leases.acquire(redis_client, "x", leases.Filters(), ttl=60, settings=lease_settings)   # a full
    leases.release(redis_client, "x", first.id, outcome="blocked", settings=lease_settings)           # a cools for x
    leases.acquire(redis_client, "y", leases.Filters(), ttl=60, settings=lease_settings)          # a full again
    leases.acquire(redis_client, "y", leases.Filters(), ttl=60, settings=lease_settings)          # b full
    second = leases.acquire(redis_client, "y", leases.Filters(), ttl=60, settings=lease_settings)  # c full
    leases.release(redis_client, "y", second.id, outcome="blocked", settings=lease_settings)          # c free, cools for y
    assert leases.acquire(redis_client, "x", leases.Filters(), ttl=60, settings=lease_settings).uid == c  # c is not cooling for x
    with pytest.raises(leases.LeaseError) as info:
        leases.acquire(redis_client, "x", leases.Filters(), ttl=60, settings=lease_settings)
    assert info.value.message.endswith(excluded(3, full=2, cooling=1))
    with pytest.raises(leases.LeaseError) as info:
        leases.acquire(redis_client, "y", leases.Filters(namespace="idx"), ttl=60, settings=lease_settings)
    assert info.value.message.endswith(excluded(3, full=2, cooling=1))


def test_rebuilding_the_index_drops_members_without_a_record(redis_client, lease_settings):
    """What an older version may leave: index members whose proxy was withdrawn."""
    [a] = _publish(redis_client, 1, max_leases=1)
    redis_client.sadd(redis_keys.FULL, "uid-gone-1")
    redis_client.zadd(redis_keys.LOAD, {"uid-gone-2": 0})
    assert leases.reindex_all(redis_client) == 1
    assert redis_client.smembers(redis_keys.FULL) == set()
    assert redis_client.zrange(redis_keys.LOAD, 0, -1) == [a]


def test_a_sticky_lease_on_a_freed_proxy_leaves_it_in_one_half_of_the_index(redis_client, lease_settings):
    """The session's proxy was full; its leases expired behind a backlog not swept yet."""
    big, p = _publish(redis_client, 2, max_leases=3)
    for uid, max_leases in ((big, "500"), (p, "0")):  # the backlog goes to big alone
        redis_client.hset(redis_keys.proxy(uid), "maxLeases", max_leases)
        leases.reindex(redis_client, uid)
    for _ in range(leases.EXPIRE_BATCH + 20):  # these expire first
        leases.acquire(redis_client, "other", leases.Filters(), ttl=1, settings=lease_settings)
    for uid, max_leases in ((big, "0"), (p, "3")):  # now the session lands on p
        redis_client.hset(redis_keys.proxy(uid), "maxLeases", max_leases)
        leases.reindex(redis_client, uid)
    for _ in range(3):
        assert leases.acquire(redis_client, "c", leases.Filters(), ttl=1, settings=lease_settings, session_key="s").uid == p
    assert redis_client.sismember(redis_keys.FULL, p)
    time.sleep(1.2)
    got = leases.acquire(redis_client, "c", leases.Filters(), ttl=60, settings=lease_settings, session_key="s")
    assert got.uid == p and got.sticky and got.used == 1
    assert not redis_client.sismember(redis_keys.FULL, p)
    assert redis_client.zscore(redis_keys.LOAD, p) == pytest.approx(1 + 1 / 3 / 2)


def test_the_503_says_why_each_published_proxy_is_excluded(redis_client, lease_settings):
    """One proxy per reason; a request whose filters match nothing counts them as filtered out."""
    full, cooling, draining, sick = _publish(redis_client, 4, max_leases=1)
    fresh = Proxy.from_dict({"metadata": {"name": "fresh", "namespace": "idx", "uid": "uid-fresh"},
                             "spec": {"mode": "External", "endpoint": {"host": "203.0.113.99", "port": 3128}}})
    serving.publish(redis_client, fresh, address="203.0.113.99", port=3128, phase="Running")  # not probed yet
    for uid, field, value in ((draining, "maxLeases", "0"), (sick, "healthy", "0")):
        redis_client.hset(redis_keys.proxy(uid), field, value)
        leases.reindex(redis_client, uid)
    assert leases.acquire(redis_client, "other", leases.Filters(), ttl=60, settings=lease_settings).uid == full
    cooled = leases.acquire(redis_client, "c", leases.Filters(), ttl=60, settings=lease_settings)
    assert cooled.uid == cooling
    leases.release(redis_client, "c", cooled.id, outcome="blocked", settings=lease_settings)
    expected = excluded(5, unhealthy=2, draining=1, full=1, cooling=1)
    for filters in (leases.Filters(), leases.Filters(namespace="idx")):
        with pytest.raises(leases.LeaseError) as info:
            leases.acquire(redis_client, "c", filters, ttl=60, settings=lease_settings)
        assert info.value.message.endswith(expected), filters
    with pytest.raises(leases.LeaseError) as info:
        leases.acquire(redis_client, "c", leases.Filters(namespace="elsewhere"), ttl=60, settings=lease_settings)
    assert info.value.message.endswith(excluded(5, filtered=5))
    # the sets follow the proxies out of the serving view
    serving.withdraw(redis_client, sick)
    serving.withdraw(redis_client, draining)
    assert redis_client.smembers(redis_keys.UNHEALTHY) == {"uid-fresh"}
    assert redis_client.scard(redis_keys.DRAINING) == 0


def test_one_unhealthy_proxy_is_not_zero_matches(redis_client, lease_settings):
    [uid] = _publish(redis_client, 1)
    redis_client.hset(redis_keys.proxy(uid), "healthy", "0")
    leases.reindex(redis_client, uid)
    with pytest.raises(leases.LeaseError) as info:
        leases.acquire(redis_client, "c", leases.Filters(), ttl=60, settings=lease_settings)
    assert info.value.message == "no proxy can be leased now: " + excluded(1, unhealthy=1)


def test_an_unhealthy_fleet_answers_503_without_reading_it(redis_client, lease_settings):
    uids = _publish(redis_client, 300)
    for uid in uids:
        redis_client.hset(redis_keys.proxy(uid), "healthy", "0")
        leases.reindex(redis_client, uid)
    message, spent = _refused(redis_client, "late", leases.Filters(), lease_settings)
    assert message.endswith(excluded(300, unhealthy=300))
    assert spent == 0


def test_a_filtered_503_of_a_big_unavailable_fleet_reads_a_bounded_number_of_proxies(redis_client, lease_settings):
    """A filtered request finding no proxy reads the placement of EXPLAIN_LIMIT unavailable
    proxies at most (the script blocks Redis while it runs), and its message still adds up:
    the counted reasons, the proxies filtered out and those not examined make the fleet."""
    total = leases.EXPLAIN_LIMIT + 300
    pipe = redis_client.pipeline(transaction=False)
    uids = _publish(redis_client, total)
    for i, uid in enumerate(uids):
        pipe.hset(redis_keys.proxy(uid), mapping={"healthy": "0", "namespace": "idx" if i % 2 else "other"})
    pipe.execute()
    for uid in uids:
        leases.reindex(redis_client, uid)
    filters = leases.Filters(namespace="idx")
    message, spent = _refused(redis_client, "c", filters, lease_settings)
    assert spent <= leases.EXPLAIN_LIMIT
    m = re.search(r"(\d+) published; excluded: (\d+) unhealthy or not yet probed, 0 draining .*?, 0 at maxLeases, "
                  r"0 cooling down for this client, (\d+) filtered out, (\d+) not examined \(a filtered request "
                  rf"reads {leases.EXPLAIN_LIMIT} unavailable proxies at most\)$", message)
    assert m, message
    published, unhealthy, filtered_out, unexamined = map(int, m.groups())
    assert published == total and unexamined == 300
    assert unhealthy + filtered_out == leases.EXPLAIN_LIMIT and unhealthy > 0 and filtered_out > 0
    # Without filters nothing is read per proxy: every one is counted.
    with pytest.raises(leases.LeaseError) as info:
        leases.acquire(redis_client, "c", leases.Filters(), ttl=60, settings=lease_settings)
    assert info.value.message.endswith(excluded(total, unhealthy=total))


def test_rebuilding_the_index_restores_the_exclusion_sets(redis_client):
    """A Redis written before po:unhealthy and po:draining existed (an upgrade)."""
    ok, drained, sick = _publish(redis_client, 3)
    redis_client.hset(redis_keys.proxy(drained), "maxLeases", "0")
    redis_client.hset(redis_keys.proxy(sick), "healthy", "0")
    redis_client.delete(redis_keys.UNHEALTHY, redis_keys.DRAINING, redis_keys.LOAD)
    assert leases.reindex_all(redis_client) == 1
    assert redis_client.smembers(redis_keys.UNHEALTHY) == {sick}
    assert redis_client.smembers(redis_keys.DRAINING) == {drained}
    assert redis_client.zrange(redis_keys.LOAD, 0, -1) == [ok]


_MESSAGE = re.compile(
    r"^no proxy can be leased now: (?P<published>\d+) published; excluded: (?P<unhealthy>\d+) unhealthy or not yet "
    r"probed, (?P<draining>\d+) draining \(maxLeases 0 or leaving a pool\), (?P<full>\d+) at maxLeases, "
    r"(?P<cooling>\d+) cooling down for this client, (?P<filtered>\d+) filtered out"
    r"(?:, (?P<unexamined>\d+) not examined \(a filtered request reads "
    rf"{leases.EXPLAIN_LIMIT} unavailable proxies at most\))?$")


def _counts(message: str) -> dict[str, int]:
    """The counts of a ``no_proxy_available`` message (no basic-auth proxies), checked to add
    up to the published count: ``{"published", "unhealthy", ..., "unexamined"}``."""
    m = _MESSAGE.match(message)
    assert m, message
    counts = {k: int(v or 0) for k, v in m.groupdict().items()}
    assert counts["published"] == sum(v for k, v in counts.items() if k != "published"), message
    return counts


def _unavailable(r, n: int, *, state: str, start: int, namespace: str = "idx", labels=None,
                 pool: str = "") -> list[str]:
    """Publish ``n`` proxies that cannot be leased (uids ``uid-<start>``…): ``state``
    ``"unhealthy"``, ``"draining"`` (maxLeases 0) or ``"full"`` (maxLeases 1, leased once by
    the client ``fill``); ``labels(i)`` their labels, ``pool`` the ProxyPool they belong to."""
    uids = []
    for i in range(start, start + n):
        metadata = {"name": f"p{i}", "namespace": namespace, "uid": f"uid-{i:05d}", "labels": labels(i) if labels else {}}
        if pool:
            metadata["ownerReferences"] = [{"apiVersion": "crawl.example.com/v1alpha1", "kind": "ProxyPool",
                                            "name": pool, "uid": f"pool-{pool}", "controller": True}]
        proxy = Proxy.from_dict({"metadata": metadata, "spec": {
            "mode": "External", "endpoint": {"host": "203.0.113.9", "port": 3128}, "maxLeases": 1}})
        serving.publish(r, proxy, address="203.0.113.9", port=3128, phase="Ready")
        record = {"unhealthy": {"healthy": "0"}, "draining": {"healthy": "1", "maxLeases": "0"},
                  "full": {"healthy": "1"}}[state]
        r.hset(redis_keys.proxy(proxy.uid), mapping=record)
        leases.reindex(r, proxy.uid)
        uids.append(proxy.uid)
    return uids


def _fill(r, n: int, settings, *, cooling_for: str = "", cooling: int = 0) -> None:
    """Lease the ``n`` free proxies of the fleet once each (client ``fill``), after a lease of
    ``cooling_for`` released ``blocked`` on ``cooling`` of them (cooling down for that client)."""
    for _ in range(cooling):
        lease = leases.acquire(r, cooling_for, leases.Filters(), ttl=60, settings=settings)
        leases.release(r, cooling_for, lease.id, outcome="blocked", settings=settings)
    for _ in range(n):
        leases.acquire(r, "fill", leases.Filters(), ttl=60, settings=settings)


@pytest.mark.parametrize("extra", [-1, 0, 1])
def test_a_filtered_503_at_the_explain_limit(redis_client, lease_settings, extra):
    """Up to EXPLAIN_LIMIT unavailable proxies every one is read and the message is the one
    without the limit (no "not examined"); one more and exactly one is not examined."""
    total = leases.EXPLAIN_LIMIT + extra
    half = total // 2
    _unavailable(redis_client, half, state="unhealthy", start=0)
    _unavailable(redis_client, total - half, state="unhealthy", start=half, namespace="other")
    with pytest.raises(leases.LeaseError) as info:
        leases.acquire(redis_client, "c", leases.Filters(namespace="idx"), ttl=60, settings=lease_settings)
    counts = _counts(info.value.message)
    assert counts["published"] == total
    if extra <= 0:
        assert info.value.message == "no proxy can be leased now: " + excluded(total, unhealthy=half, filtered=total - half)
        assert info.value.message == leases.no_proxy_message({"published": total, "filtered": 1, "unhealthy": half})
    else:
        assert counts["unexamined"] == 1 and counts["unhealthy"] + counts["filtered"] == leases.EXPLAIN_LIMIT


def test_a_filtered_503_past_the_limit_adds_up_over_every_reason(redis_client, lease_settings):
    """Full (some cooling down for the client), unhealthy and draining members of a pool, 1,800
    in all: a pool or selector request reads EXPLAIN_LIMIT of them, counts add up, the pool's
    demand grows by one per 503; a request without filters counts all; and once the fleet
    shrinks to the limit, the filtered message is exact again."""
    r = redis_client
    tier = lambda i: {"tier": "gold" if i % 3 == 0 else "silver"}  # noqa: E731
    full = _unavailable(r, 600, state="unhealthy", start=0, labels=tier, pool="pl")
    for uid in full:  # healthy, with room: filled below
        r.hset(redis_keys.proxy(uid), "healthy", "1")
        leases.reindex(r, uid)
    _fill(r, 600, lease_settings, cooling_for="c", cooling=50)
    sick = _unavailable(r, 600, state="unhealthy", start=1000, labels=tier, pool="pl")
    drained = _unavailable(r, 600, state="draining", start=2000, labels=tier, pool="pl")
    assert r.scard(redis_keys.FULL) == 600 and r.zcard(redis_keys.LOAD) == 0
    demand.register(r, "idx", "pl")
    demand.take(r, "idx", "pl")
    gold = leases.Filters(pool="pl", selector=selectors.parse("tier=gold"))
    every = leases.Filters(selector=selectors.parse("tier in (gold,silver)"))
    for filters in (leases.Filters(pool="pl"), gold, every):
        message, spent = _refused(r, "c", filters, lease_settings)
        assert spent <= leases.EXPLAIN_LIMIT
        counts = _counts(message)
        assert counts["published"] == 1800 and counts["unexamined"] == 800, message
        assert counts["cooling"] <= 50
        if filters is gold:
            assert counts["filtered"] > 0
        else:
            assert counts["filtered"] == 0
        assert demand.take(r, "idx", "pl").refused == (2 if filters.pool else 0)  # one per 503
    with pytest.raises(leases.LeaseError) as info:
        leases.acquire(r, "c", leases.Filters(), ttl=60, settings=lease_settings)
    assert info.value.message == "no proxy can be leased now: " + excluded(
        1800, unhealthy=600, draining=600, full=550, cooling=50)
    # The sets change between requests: each 503 counts the fleet of its moment.
    for uid in sick[:300] + drained[:200]:
        serving.withdraw(r, uid)
    with pytest.raises(leases.LeaseError) as info:
        leases.acquire(r, "c", leases.Filters(pool="pl"), ttl=60, settings=lease_settings)
    counts = _counts(info.value.message)
    assert counts["published"] == 1300 and counts["unexamined"] == 300
    for uid in sick[300:]:
        serving.withdraw(r, uid)
    with pytest.raises(leases.LeaseError) as info:
        leases.acquire(r, "c", leases.Filters(pool="pl"), ttl=60, settings=lease_settings)
    assert info.value.message == "no proxy can be leased now: " + excluded(1000, draining=400, full=550, cooling=50)


def test_the_api_503_of_a_filtered_request_past_the_limit(redis_client, app):
    """The API answers the lease module's message, "not examined" tail included."""
    _unavailable(redis_client, leases.EXPLAIN_LIMIT + 100, state="unhealthy", start=0)
    resp = app.test_client().post("/v1/leases", headers=auth(), json={"namespace": "idx"})
    assert resp.status_code == 503 and resp.headers["Retry-After"] == "1"
    body = resp.get_json()
    assert body["error"] == "no_proxy_available"
    assert _counts(body["message"]) == {"published": 1100, "unhealthy": 1000, "draining": 0, "full": 0,
                                        "cooling": 0, "filtered": 0, "unexamined": 100}


def test_past_the_limit_every_reason_is_sampled_in_proportion(redis_client, lease_settings):
    """1,400 draining and 200 unhealthy proxies: the EXPLAIN_LIMIT reads are shared by the sets'
    sizes, so the unhealthy ones still show in the message (not crowded out by the bigger set)."""
    r = redis_client
    _unavailable(r, 1400, state="draining", start=0)
    _unavailable(r, 200, state="unhealthy", start=2000)
    with pytest.raises(leases.LeaseError) as info:
        leases.acquire(r, "c", leases.Filters(namespace="idx"), ttl=60, settings=lease_settings)
    counts = _counts(info.value.message)
    assert counts["unexamined"] == 1600 - leases.EXPLAIN_LIMIT
    assert counts["draining"] + counts["unhealthy"] == leases.EXPLAIN_LIMIT
    assert counts["unhealthy"] == pytest.approx(leases.EXPLAIN_LIMIT * 200 / 1600, abs=2)
