"""Redis ACL users per component (app/store/acl.py, deploy/base/redis-users.acl).

* The ACL file deploy/ ships is the one app/store/acl.py renders from the key table, and every
  key family of the table belongs to some user.
* With a real redis-server started with those users, the real watcher, worker, health worker,
  beat and Flower, each logged in as its own user, take a Proxy from its creation in the
  Kubernetes API fake through probes to its deletion without one refusal in Redis's ACL log.
* Each user is refused what belongs to others: only the API and the health worker read the
  proxies' credentials copies, only the workers write the serving records, only Celery's
  processes queue tasks, nobody but the workers reaches the remote-control channel, and no user
  runs administration commands or scripts of its own.
(The API's user: tests/api/test_redis_acl.py.)
"""

from __future__ import annotations

import fnmatch
import inspect
from pathlib import Path

import pytest
import redis as redis_lib
import requests

from app.store import acl as redis_acl, keys as redis_keys
from devcluster.redis_server import free_port
from tests.support.acl_redis import AclRedis
from tests.support.processes import BIN, Process, celery_beat, celery_worker, watcher
from tests.support.waiting import wait_for

ROOT = Path(__file__).resolve().parent.parent
ACL_FILE = ROOT / "deploy" / "base" / "redis-users.acl"


def _key_families() -> list[str]:
    """One example key of every family of the key table (constants and functions)."""
    keys = []
    for name, value in vars(redis_keys).items():
        if name.isupper() and isinstance(value, str) and value.startswith(redis_keys.PREFIX) and \
                not name.endswith("_PREFIX") and name != "PREFIX":
            keys.append(value)
        elif inspect.isfunction(value) and value.__module__ == redis_keys.__name__ and name != "lua_header":
            keys.append(value(*["x"] * len(inspect.signature(value).parameters)))
    keys.append(redis_keys.REDBEAT_PREFIX + ":schedule")
    return keys


def _allowed(user: redis_acl.User, key: str) -> bool:
    return any(fnmatch.fnmatchcase(key, p) for p in user.keys + user.read + user.write)


def test_the_shipped_acl_file_is_the_rendered_one():
    assert ACL_FILE.read_text() == redis_acl.render(), \
        "deploy/base/redis-users.acl is stale: python -m app.store.acl > deploy/base/redis-users.acl"


def test_every_key_family_belongs_to_a_user():
    families = _key_families()
    assert len(families) > 30
    orphans = [key for key in families if not any(_allowed(u, key) for u in redis_acl.USERS)]
    assert orphans == []
    # the credentials copies: read by the API (the lease answer) and the health worker only
    readers = {u.name for u in redis_acl.USERS if any(fnmatch.fnmatchcase(redis_keys.auth("x"), p)
                                                      for p in u.keys + u.read)}
    assert readers == {"api", "health-worker"}


def test_config_refuses_a_password_that_needs_quoting():
    with pytest.raises(ValueError, match="user 'api' must be letters, digits"):
        redis_acl.config({"api": "has space"})
    with pytest.raises(KeyError, match="no Redis ACL user 'nobody'; the users are api, worker"):
        redis_acl.user("nobody")


@pytest.fixture(scope="module")
def acl():
    server = AclRedis()
    yield server
    server.stop()


#: For each user, something it must be refused (key, channel or command), as ``(label, call)``.
REFUSED = {
    "worker": [("read a credentials copy", lambda r: r.hgetall(redis_keys.auth("u"))),
               ("bind a crawler's session", lambda r: r.set(redis_keys.sticky("c", "s"), "u")),
               ("start a cooldown", lambda r: r.zadd(redis_keys.cooldown("c"), {"u": 1})),
               ("beat's schedule", lambda r: r.get(redis_keys.REDBEAT_PREFIX + ":lock"))],
    "health-worker": [("a de-duplication mark", lambda r: r.set(redis_keys.queued("create", "u"), "1")),
                      ("bind a crawler's session", lambda r: r.set(redis_keys.sticky("c", "s"), "u")),
                      ("ban an egress IP", lambda r: r.zadd(redis_keys.ip_bans("198.51.100.1"), {"t": 1})),
                      ("a Proxy lock", lambda r: r.set(redis_keys.proxy_lock("u"), "1"))],
    "beat": [("read a credentials copy", lambda r: r.hgetall(redis_keys.auth("u"))),
             ("write a serving record", lambda r: r.hset(redis_keys.proxy("u"), "address", "192.0.2.1")),
             ("remote control", lambda r: r.publish(redis_acl.PIDBOX, "{}"))],
    "watcher": [("read a credentials copy", lambda r: r.hgetall(redis_keys.auth("u"))),
                ("write a lease", lambda r: r.hset(redis_keys.lease("l"), "client", "x")),
                ("take a Proxy lock", lambda r: r.set(redis_keys.proxy_lock("u"), "x")),
                ("remote control", lambda r: r.publish(redis_acl.PIDBOX, "{}"))],
    "flower": [("queue a task", lambda r: r.lpush("health", "{}")),
               ("take a task", lambda r: r.rpop("health")),
               ("read a credentials copy", lambda r: r.hgetall(redis_keys.auth("u"))),
               ("read a serving record", lambda r: r.hgetall(redis_keys.proxy("u")))],
    "keda": [("queue a task", lambda r: r.lpush("proxies", "{}")),
             ("read a credentials copy", lambda r: r.hgetall(redis_keys.auth("u")))],
}
#: Refused to every user.
REFUSED_TO_ALL = [("FLUSHALL", lambda r: r.flushall()), ("KEYS", lambda r: r.keys("*")),
                  ("CONFIG", lambda r: r.config_get("*")), ("ACL", lambda r: r.acl_list()),
                  ("EVAL", lambda r: r.eval("return 1", 0)), ("SCRIPT FLUSH", lambda r: r.script_flush())]


@pytest.mark.parametrize("name", sorted(REFUSED))
def test_each_user_is_refused_what_belongs_to_others(acl, name):
    r = acl.client(name)
    try:
        for label, call in REFUSED[name] + REFUSED_TO_ALL:
            with pytest.raises(redis_lib.exceptions.NoPermissionError):
                call(r)
                pytest.fail(f"{name} was allowed to {label}")
    finally:
        r.close()


def test_what_each_user_may_do_it_can(acl):
    acl.reset()
    worker, flower, keda = acl.client("worker"), acl.client("flower"), acl.client("keda")
    try:
        worker.hset(redis_keys.auth("u"), mapping={"username": "a", "password": "b"})
        assert worker.delete(redis_keys.auth("u")) == 1  # publish/withdraw delete the copy, unread
        worker.lpush("health", "{}")
        assert flower.llen("health") == keda.llen("health") == 1
        assert flower.lrange("health", 0, -1) == ["{}"]
    finally:
        for r in (worker, flower, keda):
            r.close()
    assert acl.denials() == []


def _targeted_lease_on_u1(admin):
    """Publish proxy ``u1`` (healthy, egress IP 198.51.100.1) and take a lease on it for
    ``shop.example`` as client ``c`` (the admin user: what the API would do); return the lease."""
    from app.resources import Proxy
    from app.serving import leases, view as serving
    from app.serving.bans import BanSettings, Target

    proxy = Proxy.from_dict({"metadata": {"name": "p", "namespace": "ns", "uid": "u1"},
                             "spec": {"mode": "External", "endpoint": {"host": "203.0.113.7", "port": 3128}}})
    serving.publish(admin, proxy, address="203.0.113.7", port=3128, phase="Ready")
    admin.hset(redis_keys.proxy("u1"), mapping={"health": "healthy", "healthy": "1", "egressIP": "198.51.100.1"})
    leases.reindex(admin, "u1")
    bans = BanSettings()
    settings = leases.LeaseSettings(default_ttl=60, max_ttl=600, cooldown=30, sticky_ttl=600, record_grace=60)
    return leases.acquire(admin, "c", leases.Filters(), ttl=60, settings=settings,
                          target=Target.of("shop.example", bans), bans=bans)


def test_the_health_worker_moves_targeted_leases_and_counts_bans_with_its_own_user(acl):
    """A probe that learns a new egress IP moves the proxy's targeted leases (the lease keys are
    in its record script's reach) and reads the bans of its egress IP (status.bannedTargets)."""
    from app.store.lua import Lua

    acl.reset()
    admin, health = acl.client(), acl.client("health-worker")
    try:
        held = _targeted_lease_on_u1(admin)
        record = Lua("now", "lease_index", "health_record")  # the script the probe engine runs
        assert record(health, [redis_keys.proxy("u1"), redis_keys.HEALTH_DUE],
                      ["u1", "", "203.0.113.7", "3128", "egressIP", "198.51.100.2"]) == 1
        assert admin.zscore(redis_keys.target_leases("shop.example", "198.51.100.2"), held.id) is not None
        # the moved lease counts in the new IP's ban ratio (a ban on its release lands there)
        assert any(k.startswith("l") for k in admin.hkeys(redis_keys.ip_outcomes("198.51.100.2")))
        assert health.zcount(redis_keys.ip_bans("198.51.100.2"), 0, "+inf") == 0
    finally:
        admin.close()
        health.close()
    assert acl.denials() == []


#: The users whose component withdraws a proxy from the serving view (app.serving.view.withdraw):
#: the watcher (a Proxy being deleted), the worker (delete, lost or stopped instance, failures)
#: and the health worker (a probe that finds it Failed).
WITHDRAWERS = ("health-worker", "watcher", "worker")


@pytest.mark.parametrize("name", WITHDRAWERS)
def test_each_withdrawing_user_ends_the_proxys_leases(acl, name):
    """A withdrawal ends the proxy's live leases everywhere they are counted: the expiry index,
    the client's count and, for a targeted lease, its egress IP's concurrency for the target, so
    another proxy leaving from that IP is not held back.  Each component that withdraws does so
    with its own user, without one refusal (a refusal inside the transaction leaves the leases
    counted while the record is gone)."""
    from app.serving import view as serving

    acl.reset()
    admin, user = acl.client(), acl.client(name)
    try:
        held = _targeted_lease_on_u1(admin)
        concurrency = redis_keys.target_leases("shop.example", "198.51.100.1")
        assert admin.zscore(concurrency, held.id) is not None
        serving.withdraw(user, "u1")
        assert not admin.exists(redis_keys.proxy("u1"))
        assert admin.zscore(concurrency, held.id) is None
        assert admin.zscore(redis_keys.LEASE_EXPIRY, f"u1/{held.id}") is None
        assert admin.zscore(redis_keys.client_leases("c"), held.id) is None
    finally:
        admin.close()
        user.close()
    assert acl.denials() == []


def _get(url: str, **kw) -> requests.Response | None:
    try:
        return requests.get(url, timeout=5, **kw)
    except requests.RequestException:
        return None


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_every_component_works_with_its_own_user(acl, kube, tmp_path):
    acl.reset()
    providers = tmp_path / "providers.yaml"  # the test's External Proxy lives in "default"
    providers.write_text("providers: []\ntenancy: {externalProxyNamespaces: [default]}\n")
    base = {"PROVIDERS_CONFIG": str(providers), "LOG_LEVEL": "DEBUG", "KUBECONFIG": kube.write_kubeconfig(str(tmp_path / "kc")),
            "HEALTH_SWEEP_INTERVAL": "1", "RESYNC_INTERVAL": "3600", "GC_INTERVAL": "3600"}
    metrics_port, flower_port = free_port(), free_port()
    procs = [
        celery_worker({**base, **acl.env("worker")}, queues="proxies,gc", concurrency=1),
        celery_worker({**base, **acl.env("health-worker")}, queues="health", concurrency=1, name="health-worker"),
        celery_beat({**base, **acl.env("beat"), "METRICS_BIND": f"127.0.0.1:{metrics_port}"}, str(tmp_path)),
        watcher({**base, **acl.env("watcher")}),
        Process("flower", [str(BIN / "celery"), "-A", "workers", "flower", "--address=127.0.0.1",
                           f"--port={flower_port}"], {**base, **acl.env("flower"), "FLOWER_BASIC_AUTH": "op:pw"}),
    ]
    admin = acl.client()
    try:
        for p in procs:
            p.start()
        procs[3].wait_for_log("leading: streaming Proxy events", timeout=60)
        body = {"apiVersion": "crawl.example.com/v1alpha1", "kind": "Proxy",
                "metadata": {"name": "acl-px", "namespace": "default"},
                "spec": {"mode": "External", "endpoint": {"host": "127.0.0.1", "port": free_port()},
                         "healthCheck": {"url": "http://127.0.0.1:9/", "intervalSeconds": 2, "timeoutSeconds": 1}}}
        custom = kube.custom_objects() if hasattr(kube, "custom_objects") else None
        from kubernetes import client as k8s
        api_client = kube.api_client()
        obj = k8s.CustomObjectsApi(api_client).create_namespaced_custom_object(
            "crawl.example.com", "v1alpha1", "default", "proxies", body)
        uid = obj["metadata"]["uid"]
        # watcher -> broker -> worker publishes it; beat's sweep -> health worker probes it
        def explain():
            return f"refused: {acl.denials()}\n" + "\n".join(f"--- {p.name}\n{p.log()[-3000:]}" for p in procs)

        wait_for(lambda: admin.sismember(redis_keys.PROXIES, uid), 60, "the worker to publish the Proxy", explain=explain)
        wait_for(lambda: admin.hget(redis_keys.proxy(uid), "lastProbe"), 60, "the health worker to probe it")
        metrics = _get(f"http://127.0.0.1:{metrics_port}/metrics")
        assert metrics is not None and metrics.status_code == 200
        tasks = wait_for(lambda: (_get(f"http://127.0.0.1:{flower_port}/api/tasks", auth=("op", "pw")) or
                                  requests.Response()).status_code == 200 and
                         _get(f"http://127.0.0.1:{flower_port}/api/tasks", auth=("op", "pw")).json(), 60,
                         "Flower to see tasks from the event stream", explain=explain)
        assert any(t.get("name") == "health.sweep" for t in tasks.values())
        page = _get(f"http://127.0.0.1:{flower_port}/broker", auth=("op", "pw"))
        assert page is not None and page.status_code == 200
        k8s.CustomObjectsApi(api_client).delete_namespaced_custom_object(
            "crawl.example.com", "v1alpha1", "default", "proxies", "acl-px")
        wait_for(lambda: not admin.sismember(redis_keys.PROXIES, uid), 60, "the worker to withdraw it")
        api_client.close()
        assert custom is None or custom
    finally:
        for p in procs:
            p.stop()
    logs = "\n".join(f"--- {p.name}\n{p.log()[-2000:]}" for p in procs)
    assert acl.denials() == [], f"refused: {acl.denials()}\n{logs}"
