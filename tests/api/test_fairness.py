"""API fairness and cost (docs/security.md): per-client ``maxLeases``, selector caps, a
``/metrics`` whose cost does not grow with the fleet, and invalid input always a 400.

The lease limit is checked with the Flask app in process (its rules) and through the real
``proxy-operator api`` under many concurrent threads (its atomicity); the metrics cost and the
hostile inputs through the real served API too.  Proxies are put in the serving view as the
health engine leaves a healthy one (no Squid needed: nothing connects to them, so their
addresses are documentation ones, TEST-NET-3 ``203.0.113.0/24``).
"""

from __future__ import annotations

import collections
import hashlib
import json
import os
import random
import threading
import time
from urllib.parse import quote

import pytest
import requests

from api import create_app
from api.settings import ApiSettings
from app.serving import leases, selectors, view as serving
from app.store import keys as redis_keys
from api import tokens
from app.resources import Proxy
from app.config.validation import ConfigError
from devcluster.redis_server import RedisServer
from tests.api.helpers import TOKEN_A, TOKEN_B, TOKEN_C, auth
from tests.api.served import TOKEN, request, start_api

pytestmark = pytest.mark.timeout(180)


def _publish(r, n: int, *, max_leases: int = 50, prefix: str = "fair") -> list[str]:
    """Publish ``n`` healthy External proxies; their uids."""
    uids = []
    for i in range(n):
        proxy = Proxy.from_dict({
            "metadata": {"name": f"{prefix}{i}", "namespace": "fair", "uid": f"uid-{prefix}-{i:05d}",
                         "labels": {"tier": "gold" if i % 2 else "silver"}},
            "spec": {"mode": "External", "endpoint": {"host": f"203.0.113.{i % 250 + 1}", "port": 3128},
                     "maxLeases": max_leases}})
        serving.publish(r, proxy, address=f"203.0.113.{i % 250 + 1}", port=3128, phase="Ready")
        r.hset(redis_keys.proxy(proxy.uid), mapping={"health": "healthy", "healthy": "1"})
        leases.reindex(r, proxy.uid)
        uids.append(proxy.uid)
    return uids


def _tokens_yaml(a_max: int | None = 2, b_max: int | None = None, c_max: int | None = 0) -> str:
    """crawler-a (TOKEN_A), crawler-b (TOKEN_B) and crawler-c (TOKEN_C, by digest) with these limits."""
    def limit(value):
        return "" if value is None else f"\n    maxLeases: {value}"
    return ("sharedNamespaces: [\"*\"]\nclients:\n"
            f"  - name: crawler-a\n    token: {TOKEN_A}{limit(a_max)}\n"
            f"  - name: crawler-b\n    token: {TOKEN_B}{limit(b_max)}\n"
            f"  - name: crawler-c\n    tokenSHA256: {hashlib.sha256(TOKEN_C.encode()).hexdigest()}{limit(c_max)}\n")


def _write(path, text: str) -> None:
    """Replace ``path`` atomically (a new inode: the token store sees the change at once)."""
    tmp = f"{path}.new"
    with open(tmp, "w") as fh:
        fh.write(text)
    os.replace(tmp, path)


@pytest.fixture()
def tokens_path(tmp_path):
    path = tmp_path / "tokens.yaml"
    _write(path, _tokens_yaml())
    return str(path)


@pytest.fixture()
def capped(redis_url, tokens_path, lease_settings):
    """The app with crawler-a limited to 2 leases, crawler-b unlimited, crawler-c to 0; the
    tokens file re-read on every request."""
    app = create_app(ApiSettings(redis_url=redis_url, tokens_file=tokens_path, leases=lease_settings,
                                 tokens_check_every=0))
    return app.test_client()


def lease(client, token, **body):
    return client.post("/v1/leases", headers=auth(token), json=body)


def renew(client, token, lease_id):
    return client.post(f"/v1/leases/{lease_id}/renew", headers=auth(token))


# -- per-client maxLeases ------------------------------------------------------------------------

def test_the_tokens_file_takes_max_leases_and_names_a_bad_one(tmp_path):
    parsed = tokens.parse({"clients": [{"name": "a", "token": TOKEN_A, "maxLeases": 3},
                                       {"name": "b", "token": TOKEN_B}]}, "t.yaml")
    assert [(c.name, c.max_leases) for c in parsed] == [("a", 3), ("b", None)]
    assert TOKEN_A not in repr(parsed) and parsed[0].digest.hex() not in repr(parsed)
    for value, problem in ((-1, "must be at least 0, got -1"), ("five", "must be an integer, got str"),
                           (True, "must be an integer, got bool"), (2.5, "must be an integer, got float")):
        with pytest.raises(ConfigError) as info:
            tokens.parse({"clients": [{"name": "a", "token": TOKEN_A, "maxLeases": value}]}, "t.yaml")
        assert "t.yaml" in str(info.value) and "clients[0].maxLeases" in str(info.value), info.value
        assert problem in str(info.value) and TOKEN_A not in str(info.value)


def _refusals(client) -> float:
    """``proxy_operator_lease_requests_total{operation="acquire",outcome="client_lease_limit"}``."""
    needle = 'proxy_operator_lease_requests_total{operation="acquire",outcome="client_lease_limit"} '
    text = client.get("/metrics").get_data(as_text=True)
    return sum(float(line[len(needle):]) for line in text.splitlines() if line.startswith(needle))


def test_a_client_at_its_limit_gets_429_naming_the_limit(capped, redis_client):
    _publish(redis_client, 3)
    counted = _refusals(capped)
    first, second = lease(capped, TOKEN_A), lease(capped, TOKEN_A, sessionKey="s1")
    assert first.status_code == second.status_code == 201
    for refused in (lease(capped, TOKEN_A), lease(capped, TOKEN_A, sessionKey="s1"),
                    lease(capped, TOKEN_A, selector="tier=gold")):
        assert refused.status_code == 429
        body = refused.get_json()
        assert body["error"] == "client_lease_limit", body
        assert body["message"] == ("client 'crawler-a' holds 2 live leases, its limit (maxLeases in the tokens "
                                   "file) is 2: release a lease or wait for one to expire")
        # a slot frees at the latest when the earliest lease expires (TTL 60 s here)
        assert 55 <= int(refused.headers["Retry-After"]) <= 60
    # the other clients are not affected; an unlimited one takes more than 2
    assert all(lease(capped, TOKEN_B).status_code == 201 for _ in range(3))
    # a release frees the slot at once
    assert capped.delete(f"/v1/leases/{first.get_json()['leaseId']}", headers=auth(TOKEN_A)).status_code == 200
    assert lease(capped, TOKEN_A).status_code == 201
    assert lease(capped, TOKEN_A).status_code == 429
    # renewing at the limit (not above it) is fine
    assert renew(capped, TOKEN_A, second.get_json()["leaseId"]).status_code == 200
    assert _refusals(capped) - counted == 4


def test_a_limit_of_zero_leases_nothing_but_lists(capped, redis_client):
    _publish(redis_client, 1)
    refused = lease(capped, TOKEN_C)
    assert refused.status_code == 429 and "Retry-After" not in refused.headers  # waiting cannot help
    assert refused.get_json()["message"] == "client 'crawler-c' may hold no leases (maxLeases 0 in the tokens file)"
    assert capped.get("/v1/proxies", headers=auth(TOKEN_C)).status_code == 200


def test_expired_leases_free_the_slot_and_the_expiry_sweep_counts_them_out(capped, redis_client):
    _publish(redis_client, 2)
    ids = [lease(capped, TOKEN_A, ttlSeconds=1).get_json()["leaseId"] for _ in range(2)]
    assert lease(capped, TOKEN_A).status_code == 429
    held = "po:client-leases:crawler-a"
    assert set(redis_client.zrange(held, 0, -1)) == set(ids)
    time.sleep(1.2)
    # another client's lease request sweeps the expired leases out of the expiry index, and
    # out of crawler-a's count with them
    assert lease(capped, TOKEN_B).status_code == 201
    assert redis_client.zcard(held) == 0
    assert lease(capped, TOKEN_A).status_code == 201
    # the count's key goes with the last lease
    assert 0 < redis_client.pttl(held) <= 60_000


def test_renewals_never_keep_a_client_above_its_limit(capped, redis_client, tokens_path):
    _publish(redis_client, 2)
    first, second = (lease(capped, TOKEN_A).get_json() for _ in range(2))
    assert renew(capped, TOKEN_A, first["leaseId"]).status_code == 200
    _write(tokens_path, _tokens_yaml(a_max=1))  # the operator lowers crawler-a's limit
    refused = renew(capped, TOKEN_A, first["leaseId"])
    assert refused.status_code == 429 and "Retry-After" not in refused.headers
    message = refused.get_json()["message"]
    assert message.startswith("client 'crawler-a' holds 2 live leases, more than its limit (maxLeases in the "
                              "tokens file) of 1: this lease is not renewed and ends at its expiry, ")
    # the lease is not ended by the refusal: it runs out at its expiry
    items = capped.get("/v1/proxies", headers=auth(TOKEN_A)).get_json()["items"]
    assert sum(item["leases"]["used"] for item in items) == 2
    assert lease(capped, TOKEN_A).status_code == 429
    # back under the limit, renewals work again
    capped.delete(f"/v1/leases/{second['leaseId']}", headers=auth(TOKEN_A))
    assert renew(capped, TOKEN_A, first["leaseId"]).status_code == 200
    # a limit added later counts the leases already held
    assert lease(capped, TOKEN_B).status_code == 201
    _write(tokens_path, _tokens_yaml(a_max=2, b_max=1))
    assert lease(capped, TOKEN_B).status_code == 429


def test_leases_ended_with_their_proxy_free_the_slot(capped, redis_client):
    [gone] = _publish(redis_client, 1, prefix="gone")
    assert [lease(capped, TOKEN_A).status_code for _ in range(3)] == [201, 201, 429]
    serving.withdraw(redis_client, gone)  # the Proxy is deleted: its leases no longer count
    [sick] = _publish(redis_client, 1, prefix="sick")
    held = [lease(capped, TOKEN_A).get_json()["leaseId"] for _ in range(2)]
    assert lease(capped, TOKEN_A).status_code == 429
    redis_client.hset(redis_keys.proxy(sick), mapping={"health": "unhealthy", "healthy": "0"})
    leases.reindex(redis_client, sick)
    assert renew(capped, TOKEN_A, held[0]).status_code == 409  # proxy_unavailable ends the lease
    _publish(redis_client, 1, prefix="fresh")
    assert lease(capped, TOKEN_A).status_code == 201
    assert lease(capped, TOKEN_A).status_code == 429


def test_concurrent_requests_never_take_a_client_past_its_limit(redis_url, redis_client, tmp_path):
    """48 threads of two capped clients (3 and 5 leases) through the real server, with room
    for 200 leases on the proxies: neither the threads nor Redis ever see a client above
    its limit, and renewals within the limit always pass."""
    caps = {"crawler-a": 3, "crawler-b": 5}
    text = ("sharedNamespaces: [\"*\"]\nclients:\n"
            f"  - {{name: crawler-a, token: {TOKEN_A}, maxLeases: {caps['crawler-a']}}}\n"
            f"  - {{name: crawler-b, token: {TOKEN_B}, maxLeases: {caps['crawler-b']}}}\n")
    uids = _publish(redis_client, 4)
    proc, port = start_api(tmp_path, redis_url, tokens=text)
    base = f"http://127.0.0.1:{port}"
    lock = threading.Lock()
    held: collections.Counter = collections.Counter()
    peak: collections.Counter = collections.Counter()
    redis_peak: collections.Counter = collections.Counter()
    stats: collections.Counter = collections.Counter()
    errors: list[str] = []
    done = threading.Event()

    def sampler() -> None:
        """Count each client's live leases in Redis itself, from one atomic snapshot."""
        while not done.is_set():
            pipe = redis_client.pipeline(transaction=True)
            for uid in uids:
                pipe.zrange(redis_keys.proxy_leases(uid), 0, -1)
            ids = [i for members in pipe.execute() for i in members]
            pipe = redis_client.pipeline(transaction=False)
            for i in ids:
                pipe.hget(f"po:lease:{i}", "client")
            counts = collections.Counter(owner for owner in pipe.execute() if owner)
            for name, n in counts.items():
                redis_peak[name] = max(redis_peak[name], n)
            time.sleep(0.002)

    def crawler(i: int) -> None:
        name, token = ("crawler-a", TOKEN_A) if i % 2 else ("crawler-b", TOKEN_B)
        s = requests.Session()
        try:
            for _ in range(6):
                resp = s.post(f"{base}/v1/leases", headers=auth(token), json={"ttlSeconds": 60}, timeout=30)
                if resp.status_code == 429:
                    assert resp.json()["error"] == "client_lease_limit"
                    with lock:
                        stats[f"429 {name}"] += 1
                    time.sleep(random.uniform(0, 0.01))
                    continue
                if resp.status_code != 201:
                    errors.append(f"lease: {resp.status_code} {resp.text}")
                    continue
                lid = resp.json()["leaseId"]
                with lock:
                    held[name] += 1
                    peak[name] = max(peak[name], held[name])
                    stats["granted"] += 1
                again = s.post(f"{base}/v1/leases/{lid}/renew", headers=auth(token), timeout=30)
                if again.status_code != 200:
                    errors.append(f"renew within the limit: {again.status_code} {again.text}")
                time.sleep(random.uniform(0, 0.01))
                with lock:
                    # counted from the 201 to before the release is sent: never more than Redis holds
                    held[name] -= 1
                gone = s.delete(f"{base}/v1/leases/{lid}", headers=auth(token), timeout=30)
                if gone.status_code != 200:
                    errors.append(f"release: {gone.status_code} {gone.text}")
                with lock:
                    stats["released"] += 1
        except Exception as exc:  # noqa: BLE001 - reported below
            errors.append(repr(exc))
        finally:
            s.close()

    watcher = threading.Thread(target=sampler)
    try:
        watcher.start()
        threads = [threading.Thread(target=crawler, args=(i,)) for i in range(48)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    finally:
        done.set()
        watcher.join()
        proc.stop()
    assert not errors, errors[:10]
    for name, cap in caps.items():
        assert peak[name] <= cap and redis_peak[name] <= cap, (name, peak, redis_peak)
        assert stats[f"429 {name}"] > 0, f"{name} never reached its limit: the test proves nothing"
    assert peak["crawler-b"] > caps["crawler-a"]  # crawler-b really went past crawler-a's limit
    assert stats["granted"] == stats["released"] > 0
    assert redis_client.zcard("po:client-leases:crawler-a") == redis_client.zcard("po:client-leases:crawler-b") == 0


# -- selector caps -------------------------------------------------------------------------------

OVER_CAPS = [
    (",".join(f"k{i}=v" for i in range(selectors.MAX_REQUIREMENTS + 1)),
     f"{selectors.MAX_REQUIREMENTS + 1} requirements, at most {selectors.MAX_REQUIREMENTS}"),
    (",".join(f"k{i}" for i in range(800)), "800 requirements, at most 16"),  # the selector
    ("pool in (" + ",".join(f"v{i}" for i in range(selectors.MAX_VALUES + 1)) + ")",
     f"{selectors.MAX_VALUES + 1} values, at most {selectors.MAX_VALUES} in one list"),
    ("pool notin (" + ",".join("v" for _ in range(200)) + ")", "200 values, at most 32"),
    ("a" * 250 + ".example/key=v", "the key prefix is 258 characters long, at most 253"),
    ("k" * 64 + "=v", "the key name is 64 characters long, at most 63"),
    ("k=" + "v" * 64, "a value is 64 characters long, at most 63"),
    ("k in (" + "v" * 64 + ")", "a value is 64 characters long, at most 63"),
    ("k=" + "v" * 4096, "the selector is 4098 characters long, at most 4096"),
    # blanks count: an over-long selector of (Unicode) spaces is not "no selector"
    ("\u00a0" * 4097, "the selector is 4097 characters long, at most 4096"),
    (" " * 4097, "the selector is 4097 characters long, at most 4096"),
]


@pytest.mark.parametrize("selector, problem", OVER_CAPS)
def test_selectors_beyond_the_caps_are_400_naming_the_cap(capped, redis_client, selector, problem):
    _publish(redis_client, 2)
    before = redis_client.info("commandstats").get("cmdstat_evalsha", {}).get("calls", 0)
    for resp in (lease(capped, TOKEN_B, selector=selector),
                 capped.get(f"/v1/proxies?selector={quote(selector)}", headers=auth(TOKEN_B))):
        assert resp.status_code == 400
        body = resp.get_json()
        assert (body["error"], body["field"]) == ("invalid_field", "selector") and problem in body["message"], body
    # refused before any lease script ran
    assert redis_client.info("commandstats").get("cmdstat_evalsha", {}).get("calls", 0) == before


def test_selectors_at_the_caps_are_taken(capped, redis_client):
    _publish(redis_client, 2)
    widest = ",".join(["tier in (" + ",".join(["gold"] + [f"v{i}" for i in range(selectors.MAX_VALUES - 1)]) + ")"]
                      + [f"k{i} notin (" + ",".join(f"x{j}" for j in range(selectors.MAX_VALUES)) + ")"
                         for i in range(selectors.MAX_REQUIREMENTS - 2)]
                      + ["p" * 253 + "/" + "n" * 63 + "!=" + "v" * 63])
    assert len(selectors.parse(widest)) == selectors.MAX_REQUIREMENTS
    got = lease(capped, TOKEN_B, selector=widest)
    assert got.status_code == 201 and got.get_json()["proxy"]["name"] == "fair1"  # the gold one
    items = capped.get(f"/v1/proxies?selector={quote(widest)}", headers=auth(TOKEN_B)).get_json()["items"]
    assert [item["name"] for item in items] == ["fair1"]


# -- /metrics ------------------------------------------------------------------------------------

def _scrape_commands(port: int, r) -> tuple[dict[str, int], str]:
    """Scrape ``/metrics`` once; the Redis commands it issued (name -> calls) and the text."""
    assert request(port, "GET", "/metrics", token=None)[0] == 200  # warm: the connection is fresh
    r.config_resetstat()
    status, _, body = request(port, "GET", "/metrics", token=None)
    stats = r.info("commandstats")
    assert status == 200
    calls = {name.removeprefix("cmdstat_"): int(v["calls"]) for name, v in stats.items()
             if not name.startswith("cmdstat_config")}  # not the reset itself
    return calls, body.decode()


def _active(text: str) -> float:
    line = next(line for line in text.splitlines() if line.startswith("proxy_operator_leases_active "))
    return float(line.split()[1])


def test_a_metrics_scrape_costs_the_same_with_10_and_1000_proxies(tmp_path, lease_settings):
    """The number of Redis commands one scrape issues (INFO commandstats of a private Redis)
    does not depend on the fleet's size, and the live-lease gauge stays right."""
    server = RedisServer()
    proc = None
    try:
        import redis as redis_lib

        r = redis_lib.Redis.from_url(server.url, decode_responses=True)
        _publish(r, 10)
        for _ in range(7):
            leases.acquire(r, "crawler-a", leases.Filters(), ttl=60, settings=lease_settings)
        # one worker, so every scrape reaches the same process (and its warm connection)
        proc, port = start_api(tmp_path, server.url, {"API_WORKERS": "1"})
        small, text = _scrape_commands(port, r)
        assert _active(text) == 7
        _publish(r, 990, prefix="more")
        for _ in range(500):
            leases.acquire(r, "crawler-b", leases.Filters(), ttl=60, settings=lease_settings)
        short = leases.acquire(r, "crawler-a", leases.Filters(), ttl=1, settings=lease_settings)
        time.sleep(max(0.0, short.expires_at - time.time()) + 0.1)  # one lease expired, not yet swept
        large, text = _scrape_commands(port, r)
        assert _active(text) == 507
        assert large == small, (small, large)
        assert sum(small.values()) <= 3, small  # TIME, one ZCOUNT of the leases, one of the bans
        # and nothing in it names a client, a proxy or a token
        assert TOKEN not in text and "crawler-" not in text and "203.0.113." not in text and "fair" not in text
    finally:
        if proc is not None:
            proc.stop()
        server.stop()


# -- invalid input is a 400 through the served API -----------------------------------------------

@pytest.fixture(scope="module")
def served(redis_server, tmp_path_factory):
    """One ``proxy-operator api`` (crawler-a: :data:`tests.api.served.TOKEN`) for the hostile
    inputs, with one healthy proxy behind it, so a valid request would get a lease."""
    import redis as redis_lib

    r = redis_lib.Redis.from_url(redis_server.url, decode_responses=True)
    r.flushall()
    _publish(r, 1, max_leases=100_000)
    proc, port = start_api(tmp_path_factory.mktemp("api-hostile"), redis_server.url)
    yield port
    proc.stop()
    r.flushall()
    r.close()


STRING_FIELDS = ("provider", "zone", "namespace", "selector", "sessionKey")
HOSTILE_STRINGS = [
    ('"\\ud800"', "lone high surrogate, escaped"),
    ('"a\\udfffb"', "lone low surrogate, escaped"),
    ('"\\udc00\\ud800"', "surrogates in the wrong order"),
    ('"x\xed\xa0\x80"', "lone surrogate, UTF-8-encoded"),
    ('"a\\u0000b"', "NUL, escaped"),
    ('"\\u0000"', "only NUL"),
    ('"tab\\there"', "a control character"),
    ('"\\u009b"', "a C1 control character"),
]
WRONG_TYPES = ["5", "-1", "1.5", "1e400", "-1e400", "1" + "0" * 400, "true", "null", "[]", "{}", '["a"]',
               '{"a": "b"}']
HUGE_TTLS = ["1e400", "-1e400", "1e-400", "1" + "0" * 400, "1" + "0" * 5000, "18446744073709551616", "-1", "0",
             "3601.0", "1.0", '"60"', "null", "[60]", '{"s": 60}', "true", "NaN", "Infinity"]


def _bodies() -> list[tuple[str, bytes]]:
    cases = []
    for field in STRING_FIELDS:
        for value, what in HOSTILE_STRINGS:
            cases.append((f"{field}: {what}", f'{{"{field}": {value}}}'.encode("latin-1")))
        for value in WRONG_TYPES:
            cases.append((f"{field}: {value[:20]}", f'{{"{field}": {value}}}'.encode()))
    for value in HUGE_TTLS:
        cases.append((f"ttlSeconds: {value[:20]}", f'{{"ttlSeconds": {value}}}'.encode()))
    cases += [
        ("a surrogate as a key", b'{"\\ud800": "x"}'),
        ("NUL as a key", b'{"\\u0000": "x"}'),
        ("a surrogate in an unknown field's value", b'{"colour": "\\ud800"}'),
        ("a valid zone and a surrogate selector", b'{"zone": "z", "selector": "tier=\\ud800"}'),
        ("the selector of the issue", json.dumps({"selector": ",".join(f"k{i}" for i in range(800))}).encode()),
        ("a non-ASCII selector value", '{"selector": "tier=caf\u00e9"}'.encode()),
        ("a NUL in a selector", b'{"selector": "tier=gold\\u0000"}'),
        ("duplicate keys of wrong types", b'{"zone": "z", "zone": 5}'),
        ("an array", b"[1]"), ("a string", b'"zone"'), ("a number", b"5"), ("null", b"null"),
    ]
    return cases


BODIES = _bodies()


@pytest.mark.slow
@pytest.mark.parametrize("body", [b for _, b in BODIES], ids=[name for name, _ in BODIES])
def test_invalid_lease_bodies_are_400(served, body):
    for path in ("/v1/leases", "/v1/leases/" + "a" * 32 + "/renew"):
        status, headers, answer = request(served, "POST", path, body)
        doc = json.loads(answer)
        # (renew knows ttlSeconds only: another field is unknown_field there, a 400 too)
        assert status == 400, (path, status, doc)
        assert doc["error"] in ("bad_json", "invalid_field", "unknown_field"), doc
        assert "retry-after" not in headers


QUERIES = [
    ("zone=%00", "zone"), ("zone=a%00b", "zone"), ("provider=%1b%5b31m", "provider"), ("namespace=%c2%9b", "namespace"),
    ("zone=%ed%a0%80", "zone"), ("zone=%ff%fe", "zone"), ("selector=%ed%b0%80", "selector"),
    ("selector=tier%3Dgold%00", "selector"), ("healthy=%00", "healthy"), ("healthy=%ed%a0%80", "healthy"),
    ("%ed%a0%80=1", "query"), ("zone=a&zone=b", "zone"), ("zone=", "zone"),
    ("selector=" + quote(",".join(f"k{i}" for i in range(800))), "selector"), ("colour=red", "colour"),
]


@pytest.mark.slow
@pytest.mark.parametrize("qs, field", QUERIES)
def test_invalid_query_strings_are_400(served, qs, field):
    status, _, answer = request(served, "GET", f"/v1/proxies?{qs}")
    doc = json.loads(answer)
    assert status == 400 and doc["field"] == field, (status, doc)
    assert doc["error"] in ("invalid_field", "unknown_parameter"), doc


@pytest.mark.slow
@pytest.mark.parametrize("method, path", [
    ("POST", "/v1/leases?zone=z"), ("POST", "/v1/leases?zone=%ed%a0%80"),
    ("POST", "/v1/leases/" + "a" * 32 + "/renew?ttlSeconds=60"),
    ("DELETE", "/v1/leases/" + "a" * 32 + "?outcome=%00"), ("DELETE", "/v1/leases/" + "a" * 32 + "?outcome=%ed%a0%80"),
    ("DELETE", "/v1/leases/" + "a" * 32 + "?outcome=ok&outcome=ok"), ("DELETE", "/v1/leases/" + "a" * 32 + "?why=ok"),
])
def test_invalid_query_strings_on_lease_routes_are_400(served, method, path):
    status, _, answer = request(served, method, path, b"{}" if method == "POST" else None)
    assert status == 400 and json.loads(answer)["error"] in ("invalid_field", "unknown_parameter"), answer


@pytest.mark.slow
def test_valid_unusual_filters_are_answered_not_refused(served):
    """Filters that are valid but match nothing (non-ASCII, astral characters, longest) get
    an ordinary answer, never a 5xx from Redis; the plain request gets its lease."""
    for value in ("caf\u00e9", "zone-\U0001F600", "z" * 253, "\uffff", "\u2028"):
        body = json.dumps({"zone": value}, ensure_ascii=bool(len(value) % 2)).encode()
        status, headers, answer = request(served, "POST", "/v1/leases", body)
        assert (status, json.loads(answer)["error"]) == (503, "no_proxy_available"), (value, answer)
        status, _, answer = request(served, "GET", f"/v1/proxies?zone={quote(value)}")
        assert (status, json.loads(answer)) == (200, {"items": []})
    status, _, answer = request(served, "POST", "/v1/leases", b'{"ttlSeconds": 60}')
    assert status == 201, answer


# -- the credentials copy in Redis ---------------------------------------------------------------

def test_the_credentials_copy_needs_the_redis_password(tmp_path):
    """``po:auth:<uid>`` (a basic-auth proxy's credentials, copied for the lease answer) is
    readable only with the Redis password: a client without it is refused, the API (given
    ``REDIS_PASSWORD``) hands the credentials to the lease holder and shows them nowhere else."""
    import redis as redis_lib

    password = "fairness-redis-password-0123456789"
    server = RedisServer(password=password)
    proc = None
    try:
        r = redis_lib.Redis.from_url(server.authed_url, decode_responses=True)
        proxy = Proxy.from_dict({"metadata": {"name": "authed", "namespace": "fair", "uid": "uid-authed"},
                                 "spec": {"mode": "External", "endpoint": {"host": "203.0.113.3", "port": 3128}}})
        serving.publish(r, proxy, address="203.0.113.3", port=3128, phase="Ready", auth_secret="authed-proxy-auth")
        # what the health engine leaves: healthy, and the credentials copied next to the record
        r.hset(redis_keys.auth(proxy.uid), mapping={"username": "px-user", "password": "pa$s-secret"})
        r.hset(redis_keys.proxy(proxy.uid), mapping={"health": "healthy", "healthy": "1"})
        leases.reindex(r, proxy.uid)
        anonymous = redis_lib.Redis.from_url(server.url, decode_responses=True)
        for wrong in (anonymous, redis_lib.Redis.from_url(server.url.replace("://", "://:wrong@"))):
            with pytest.raises((redis_lib.AuthenticationError, redis_lib.ResponseError)):
                wrong.hgetall(redis_keys.auth(proxy.uid))
        proc, port = start_api(tmp_path, server.url, {"REDIS_PASSWORD": password})
        status, _, body = request(port, "POST", "/v1/leases", b"{}")
        assert status == 201 and json.loads(body)["proxyAuth"] == {"username": "px-user", "password": "pa$s-secret"}
        for path in ("/v1/proxies", "/metrics"):
            status, _, body = request(port, "GET", path)
            assert status == 200 and b"pa$s-secret" not in body and b"px-user" not in body
    finally:
        if proc is not None:
            proc.stop()
        assert password not in (proc.log() if proc is not None else "")
        server.stop()
