"""ProxyPools end to end: the real watcher, Celery worker, beat and API processes (started through
their commands), the API fake admitting pools and Proxies through the real CRDs, its garbage
collector and its kubelet stand-in running a real Squid per member, a private Redis.

What a user sees: ``kubectl scale pxp/NAME`` from 0 to 5 to 2 (the scale-down keeping the two
members crawlers hold leases on), a template change of 5 members that never leaves fewer than 5
leasable, age rotation that keeps a live lease usable
until it is released, a deleted pool taking every member with it, and a hand-made Proxy with
the pool's labels left alone; a member whose egress IP two sites banned replaced by the recycle policy without the
pool going below its floor.
"""

from __future__ import annotations

import shutil
import subprocess
import threading
import time

import pytest
import redis as redis_lib
import requests
from kubernetes import client as k8s

from app.pools.model import LABEL_TEMPLATE_HASH
from app.providers.kubernetes.provider import LABEL_PROXY_UID
from app.resources import DRAINING_ANNOTATION, GROUP, PLURAL, POOL_PLURAL, VERSION
from app.serving.records import ServingRecord, load_all
from tests.api.served import TOKEN, start_api
from devcluster.cluster import FakeCluster
from tests.pools.env import pool_operator_env
from tests.support.origin import origin_server
from tests.support.processes import celery_beat, celery_worker, watcher
from devcluster.redis_server import RedisServer
from tests.support.waiting import wait_for

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]
NS = "default"
KUBECTL = shutil.which("kubectl")


@pytest.fixture(scope="module")
def stack(tmp_path_factory):
    """Everything, once for the module: cluster, Redis, origin, watcher, worker, beat, API."""
    tmp = tmp_path_factory.mktemp("pools-e2e")
    redis = RedisServer()
    with FakeCluster(bookmark_interval=1.0) as cluster, origin_server() as origin:
        env = pool_operator_env(tmp, cluster, redis.url)
        procs = [celery_worker(env, concurrency=3).start(), celery_beat(env, str(tmp)).start(), watcher(env).start()]
        api_proc = None
        try:
            procs[0].wait_for_log("ready", timeout=90)
            procs[2].wait_for_log("listed 0 proxypools", timeout=60)
            api_proc, port = start_api(tmp, redis.url)
            yield _Stack(cluster, redis, origin, f"http://127.0.0.1:{port}", env, tmp, procs)
        finally:
            for p in procs + ([api_proc] if api_proc else []):
                p.stop()
            redis.stop()


class _Stack:
    def __init__(self, cluster, redis, origin, api_url, env, tmp, procs) -> None:
        self.cluster, self.origin, self.api_url, self.env, self.tmp, self.procs = (
            cluster, origin, api_url, env, tmp, procs)
        self.r = redis_lib.Redis.from_url(redis.url, decode_responses=True)
        self.client = cluster.fake.api_client()
        self.custom = k8s.CustomObjectsApi(self.client)
        self.http = requests.Session()
        self.http.headers["Authorization"] = f"Bearer {TOKEN}"

    # -- pools and members ---------------------------------------------------------------------
    def create_pool(self, name: str, replicas: int, provider: str = "k8s-local", **spec) -> dict:
        template = {"metadata": {"labels": {"app": name}},
                    "spec": {"provider": provider, "maxLeases": 2,
                             "healthCheck": {"url": f"{self.origin}/generate_204", "intervalSeconds": 2,
                                             "timeoutSeconds": 1}}}
        body = {"apiVersion": f"{GROUP}/{VERSION}", "kind": "ProxyPool", "metadata": {"name": name, "namespace": NS},
                "spec": {"replicas": replicas, "template": template, "drain": {"drainTimeoutSeconds": 120}, **spec}}
        return self.custom.create_namespaced_custom_object(GROUP, VERSION, NS, POOL_PLURAL, body)

    def pool(self, name: str) -> dict | None:
        try:
            return self.custom.get_namespaced_custom_object(GROUP, VERSION, NS, POOL_PLURAL, name)
        except k8s.ApiException as exc:
            if exc.status == 404:
                return None
            raise

    def proxies(self) -> list[dict]:
        return self.custom.list_namespaced_custom_object(GROUP, VERSION, NS, PLURAL)["items"]

    def members(self, pool: dict) -> list[dict]:
        uid = pool["metadata"]["uid"]
        return [p for p in self.proxies() if any(r.get("uid") == uid and r.get("controller")
                                                 for r in p["metadata"].get("ownerReferences") or ())]

    def records(self, name: str) -> list[ServingRecord]:
        return [rec for rec in load_all(self.r).values() if rec.pool == name]

    def leasable(self, name: str) -> int:
        """Members the lease script would lease now (healthy, maxLeases > 0, not draining)."""
        return sum(1 for rec in self.records(name) if rec.healthy and rec.max_leases > 0 and rec.drain_until is None)

    def settled(self, name: str, replicas: int) -> dict | None:
        """The pool when its status says ``replicas`` members, all updated, Ready and leasable, and
        the serving view agrees.  (Ready and leasable are two counts of one probe verdict: the
        serving view has it before the Proxy's phase, so a pass may count a member leasable and
        not yet Ready; ``kubectl get pxp`` shows both.)"""
        pool = self.pool(name)
        st = (pool or {}).get("status") or {}
        if (st.get("observedGeneration") == pool["metadata"]["generation"] and st.get("replicas") == replicas
                and st.get("updatedReplicas") == replicas and st.get("leasableReplicas") == replicas
                and (st.get("readyReplicas") or 0) == replicas
                and len(self.members(pool)) == replicas and self.leasable(name) == replicas):
            return pool
        return None

    def scale(self, name: str, replicas: int) -> None:
        """``kubectl scale pxp/NAME --replicas=N`` (the scale subresource through the Python client
        when kubectl is not installed)."""
        if KUBECTL:
            res = subprocess.run([KUBECTL, "scale", f"pxp/{name}", f"--replicas={replicas}", "-n", NS],
                                 env={"KUBECONFIG": self.env["KUBECONFIG"], "HOME": str(self.tmp),
                                      "KUBECACHEDIR": str(self.tmp / "kube-cache"), "PATH": "/usr/bin:/bin"},
                                 capture_output=True, text=True, timeout=30)
            assert res.returncode == 0, res.stderr
            assert res.stdout.strip() == f"proxypool.crawl.example.com/{name} scaled"
        else:
            self.custom.patch_namespaced_custom_object_scale(GROUP, VERSION, NS, POOL_PLURAL, name,
                                                              {"spec": {"replicas": replicas}})

    def kubectl_get_pxp(self) -> str:
        res = subprocess.run([KUBECTL, "get", "pxp", "-n", NS], env={
            "KUBECONFIG": self.env["KUBECONFIG"], "HOME": str(self.tmp), "KUBECACHEDIR": str(self.tmp / "kube-cache"),
            "PATH": "/usr/bin:/bin"}, capture_output=True, text=True, timeout=30)
        assert res.returncode == 0, res.stderr
        return res.stdout

    def logs(self) -> str:
        return "\n".join(p.log()[-4000:] for p in self.procs)


def test_scale_from_0_to_5_to_2(stack):
    stack.create_pool("scaled", 0)
    wait_for(lambda: stack.settled("scaled", 0), 30, "the empty pool observed")
    stack.scale("scaled", 5)
    try:
        pool = wait_for(lambda: stack.settled("scaled", 5), 150, "5 members leasable")
    except AssertionError:
        raise AssertionError(f"{stack.pool('scaled')['status']}\n{stack.logs()}") from None
    members = stack.members(pool)
    for m in members:
        [ref] = m["metadata"]["ownerReferences"]
        assert (ref["kind"], ref["name"], ref["controller"], ref["blockOwnerDeletion"]) == (
            "ProxyPool", "scaled", True, True)
        assert m["metadata"]["labels"]["app"] == "scaled"
    conds = {c["type"]: (c["status"], c["reason"]) for c in pool["status"]["conditions"]}
    assert conds["Available"] == ("True", "MinimumLeasable")
    assert conds["Progressing"] == ("True", "PoolComplete")
    assert pool["status"]["selector"] == "crawl.example.com/pool=scaled"
    if KUBECTL:
        [header, row] = [line.split() for line in stack.kubectl_get_pxp().splitlines() if
                         line.startswith(("NAME", "scaled"))]
        assert header[:5] == ["NAME", "DESIRED", "READY", "LEASABLE", "UPDATED"]
        assert row[:5] == ["scaled", "5", "5", "5", "5"]
    # the API's pool filter sees the five
    listed = stack.http.get(f"{stack.api_url}/v1/proxies", params={"pool": "scaled"}, timeout=10).json()["items"]
    assert len(listed) == 5 and {i["pool"] for i in listed} == {"scaled"}

    # crawlers hold leases on two members: scaling down to 2 drains the three others and keeps these
    held = []
    for _ in range(2):
        got = stack.http.post(f"{stack.api_url}/v1/leases", json={"pool": "scaled", "ttlSeconds": 300}, timeout=10)
        assert got.status_code == 201, got.text
        held.append(got.json())
    leased = {lease["proxy"]["name"] for lease in held}
    assert len(leased) == 2  # the least-loaded member first: two different members
    names = {m["metadata"]["name"] for m in members}
    stack.scale("scaled", 2)
    wait_for(lambda: stack.settled("scaled", 2), 90, "2 members left")
    wait_for(lambda: len([p for p in stack.proxies() if p["metadata"]["labels"].get("app") == "scaled"]) == 2,
             60, "the three drained members deleted")
    kept = {m["metadata"]["name"] for m in stack.members(stack.pool("scaled"))}
    assert kept == leased, f"kept {sorted(kept)}, the leased ones were {sorted(leased)}"
    assert not (names - leased) & {p["metadata"]["name"] for p in stack.proxies()}  # the unleased ones are gone
    for lease in held:  # the leases were never cut: still live, released by their crawlers
        released = stack.http.delete(f"{stack.api_url}/v1/leases/{lease['leaseId']}", timeout=10)
        assert released.status_code == 200 and released.json()["wasLive"] is True


def test_a_template_change_keeps_replicas_members_leasable(stack):
    replicas = 5  # the case: 5 replicas, maxSurge 1, maxUnavailable 0 (the defaults)
    stack.create_pool("rolled", replicas, rollout={"maxSurge": 1, "maxUnavailable": 0})
    before = wait_for(lambda: stack.settled("rolled", replicas), 150, f"{replicas} members leasable")
    old_hash = stack.members(before)[0]["metadata"]["labels"][LABEL_TEMPLATE_HASH]
    lowest, stop = [replicas], threading.Event()

    def sample() -> None:
        while not stop.is_set():
            lowest[0] = min(lowest[0], stack.leasable("rolled"))
            time.sleep(0.1)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    template = before["spec"]["template"]
    template["metadata"]["labels"]["rev"] = "2"  # a new template: every member is replaced
    stack.custom.patch_namespaced_custom_object(GROUP, VERSION, NS, POOL_PLURAL, "rolled",
                                                {"spec": {"template": template}})
    try:
        after = wait_for(lambda: (p := stack.settled("rolled", replicas)) and all(
            m["metadata"]["labels"].get("rev") == "2" for m in stack.members(p)) and p, 240, "the rollout done")
    finally:
        stop.set()
        sampler.join()
    assert lowest[0] >= replicas, f"only {lowest[0]} members were leasable during the rollout"
    assert all(m["metadata"]["labels"][LABEL_TEMPLATE_HASH] != old_hash for m in stack.members(after))
    wait_for(lambda: len([p for p in stack.proxies() if p["metadata"]["labels"].get("app") == "rolled"]) == replicas,
             60, "the old members deleted")


def test_age_rotation_keeps_a_live_lease_usable_until_it_is_released(stack):
    stack.create_pool("aged", 1, maxAge="1m")
    pool = wait_for(lambda: stack.settled("aged", 1), 150, "the member leasable")
    [first] = stack.members(pool)
    got = stack.http.post(f"{stack.api_url}/v1/leases", json={"pool": "aged", "ttlSeconds": 600}, timeout=10)
    assert got.status_code == 201, got.text
    lease = got.json()
    assert lease["proxy"]["name"] == first["metadata"]["name"]
    # between 45 and 60 s after its creation it is replaced: a new member leasable, the old one draining
    draining = wait_for(lambda: [p for p in stack.members(stack.pool("aged"))
                                 if (p["metadata"].get("annotations") or {}).get(DRAINING_ANNOTATION)], 150,
                        "the first member draining")
    assert [p["metadata"]["uid"] for p in draining] == [first["metadata"]["uid"]]
    assert stack.leasable("aged") >= 1
    # the live lease is still good: renewed, and traffic goes through its proxy
    renewed = stack.http.post(f"{stack.api_url}/v1/leases/{lease['leaseId']}/renew", json={"ttlSeconds": 600},
                              timeout=10)
    assert renewed.status_code == 200, renewed.text
    through = requests.get(f"{stack.origin}/via-the-draining-member", proxies={"http": lease["proxyUrl"]}, timeout=10)
    assert through.status_code == 200 and through.json()["path"] == "/via-the-draining-member"
    # new leases go to the new member
    second = stack.http.post(f"{stack.api_url}/v1/leases", json={"pool": "aged", "ttlSeconds": 60}, timeout=10).json()
    assert second["proxy"]["name"] != first["metadata"]["name"]
    time.sleep(3)  # a few passes: the leased member stays
    assert any(p["metadata"]["uid"] == first["metadata"]["uid"] for p in stack.proxies())
    released = stack.http.delete(f"{stack.api_url}/v1/leases/{lease['leaseId']}", timeout=10)
    assert released.status_code == 200 and released.json()["wasLive"] is True
    wait_for(lambda: all(p["metadata"]["uid"] != first["metadata"]["uid"] for p in stack.proxies()), 60,
             "the drained member deleted once its lease was released")


def test_a_draining_member_whose_leases_ran_out_is_deleted_by_the_next_resync(stack):
    # Its drain deadline is 10 minutes away: the pass that drained it asked for its next pass
    # then (at most POOL_REQUEUE_MAX, 300 s, ahead); nothing tells the pool when a lease merely
    # runs out, so beat's pool resync (every 2 s here) must still make passes meanwhile.
    stack.create_pool("expiring", 2, drain={"drainTimeoutSeconds": 600})
    wait_for(lambda: stack.settled("expiring", 2), 150, "2 members leasable")
    for _ in range(2):  # one lease on each member, never released
        got = stack.http.post(f"{stack.api_url}/v1/leases", json={"pool": "expiring", "ttlSeconds": 5}, timeout=10)
        assert got.status_code == 201, got.text
    stack.scale("expiring", 1)
    [draining] = wait_for(lambda: [p for p in stack.members(stack.pool("expiring"))
                                   if (p["metadata"].get("annotations") or {}).get(DRAINING_ANNOTATION)], 30,
                          "one member draining with its lease")
    try:
        wait_for(lambda: all(p["metadata"]["uid"] != draining["metadata"]["uid"] for p in stack.proxies()), 30,
                 "the drained member deleted once its lease ran out")
    except AssertionError:
        raise AssertionError(f"{stack.pool('expiring')['status']}\n{stack.logs()}") from None
    wait_for(lambda: stack.settled("expiring", 1), 30, "1 member left")


def test_deleting_the_pool_deletes_every_member_and_never_a_hand_made_proxy(stack):
    hand = stack.custom.create_namespaced_custom_object(GROUP, VERSION, NS, PLURAL, {
        "apiVersion": f"{GROUP}/{VERSION}", "kind": "Proxy",
        "metadata": {"name": "hand-made", "namespace": NS, "labels": {"app": "doomed"}},
        "spec": {"provider": "k8s-local", "maxLeases": 2,
                 "healthCheck": {"url": f"{stack.origin}/generate_204", "intervalSeconds": 2, "timeoutSeconds": 1}}})
    stack.create_pool("doomed", 2)
    pool = wait_for(lambda: stack.settled("doomed", 2), 150, "2 members leasable")
    names = {m["metadata"]["name"] for m in stack.members(pool)}
    uids = {m["metadata"]["uid"] for m in stack.members(pool)}
    assert "hand-made" not in names  # same labels, no controller reference: not adopted
    proxy = stack.custom.get_namespaced_custom_object(GROUP, VERSION, NS, PLURAL, "hand-made")
    assert not proxy["metadata"].get("ownerReferences")
    assert proxy["metadata"]["uid"] == hand["metadata"]["uid"]
    stack.custom.delete_namespaced_custom_object(GROUP, VERSION, NS, POOL_PLURAL, "doomed")
    wait_for(lambda: stack.pool("doomed") is None, 60, "the pool gone")
    wait_for(lambda: not [p for p in stack.proxies() if p["metadata"]["name"] in names], 90,
             "every member deleted (ownerReference garbage collection)")
    wait_for(lambda: not [p for p in k8s.CoreV1Api(stack.client).list_namespaced_pod(NS).items
                          if (p.metadata.labels or {}).get(LABEL_PROXY_UID) in uids], 60, "their Pods deleted")
    assert stack.custom.get_namespaced_custom_object(GROUP, VERSION, NS, PLURAL, "hand-made")["metadata"]["uid"] == \
        hand["metadata"]["uid"]


def test_a_burned_member_is_replaced_and_the_pool_never_drops_below_its_floor(stack):
    """spec.recycle: two sites ban one member's egress IP (crawlers' targeted leases released
    blocked through the real API); the pool replaces it through the rollout (the kubelet stand-in
    runs the replacement on an address of its own) while two members stay leasable throughout."""
    stack.create_pool("burn", 2, recycle={"bannedTargets": 2, "windowSeconds": 600})
    wait_for(lambda: stack.settled("burn", 2), 150, "two members leasable")
    time.sleep(1.1)  # bans in a member's first second are not its own
    lowest = [2]
    done = threading.Event()

    def sample() -> None:
        while not done.is_set():
            lowest[0] = min(lowest[0], stack.leasable("burn"))
            time.sleep(0.1)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    victim = None
    for site in ("shop.example.com", "news.example.org"):
        held = []
        while True:
            got = stack.http.post(f"{stack.api_url}/v1/leases", json={"pool": "burn", "target": site, "ttlSeconds": 60},
                                  timeout=10)
            assert got.status_code == 201, got.text
            lease = got.json()
            victim = victim or lease["proxy"]["name"]
            if lease["proxy"]["name"] == victim:
                out = stack.http.delete(f"{stack.api_url}/v1/leases/{lease['leaseId']}?outcome=blocked", timeout=10)
                assert out.json()["cooldownUntil"], out.text
                break
            held.append(lease)
        for other in held:
            stack.http.delete(f"{stack.api_url}/v1/leases/{other['leaseId']}", timeout=10)
    wait_for(lambda: stack.settled("burn", 2) and all(p["metadata"]["name"] != victim
                                                      for p in stack.members(stack.pool("burn"))),
             150, "the burned member replaced")
    done.set()
    sampler.join()
    assert lowest[0] >= 2, "the pool went below its floor while replacing the burned member"
    events = [e for e in k8s.CoreV1Api(stack.client).list_namespaced_event(NS).items if e.reason == "MemberBurned"]
    assert any(victim in e.message and "example.com" in e.message and "example.org" in e.message for e in events)


def test_a_burned_member_behind_a_kept_ip_is_drained_in_place_then_serves_again(stack):
    """spec.recycle on a provider whose replacements keep the egress IP (k8s-snat: Pods behind
    their node's address): the burned member stops taking leases but is neither deleted nor
    replaced, the status and an Event say why, and once the ban leaves windowSeconds it takes
    leases again; the pool never has more than its two members."""
    stack.create_pool("snat", 2, provider="k8s-snat", rollout={"maxUnavailable": 1},
                      recycle={"bannedTargets": 1, "windowSeconds": 10})
    wait_for(lambda: stack.settled("snat", 2), 150, "two members leasable")
    names = {p["metadata"]["name"] for p in stack.members(stack.pool("snat"))}
    time.sleep(1.1)  # bans in a member's first second are not its own
    most = [2]
    done = threading.Event()

    def sample() -> None:
        while not done.is_set():
            most[0] = max(most[0], len(stack.members(stack.pool("snat"))))
            time.sleep(0.2)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    got = stack.http.post(f"{stack.api_url}/v1/leases", json={"pool": "snat", "target": "shop.example.com",
                                                              "ttlSeconds": 60}, timeout=10)
    assert got.status_code == 201, got.text
    victim = got.json()["proxy"]["name"]
    out = stack.http.delete(f"{stack.api_url}/v1/leases/{got.json()['leaseId']}?outcome=blocked", timeout=10)
    assert out.json()["cooldownUntil"], out.text

    def parked():
        pool = stack.pool("snat")
        st = (pool or {}).get("status") or {}
        return st.get("burnedReplicas") == 1 and stack.leasable("snat") == 1 and "drained in place" in str(
            st.get("conditions"))
    wait_for(parked, 30, "the burned member drained in place")
    wait_for(lambda: stack.settled("snat", 2), 60, "the member leasable again once its ban left the window")
    done.set()
    sampler.join()
    assert {p["metadata"]["name"] for p in stack.members(stack.pool("snat"))} == names  # the same two members
    assert most[0] == 2, "a member was created in place of one drained in place"
    events = {e.reason: e.message for e in k8s.CoreV1Api(stack.client).list_namespaced_event(NS).items
              if e.involved_object.name == "snat"}
    assert f"draining {victim} in place" in events["MemberBurned"] and "example.com" in events["MemberBurned"]
    assert victim in events["MemberUnburned"]
