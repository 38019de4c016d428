"""Kubernetes API requests and CPU of one new Proxy's create step, in process.

`python bench/create_requests.py [--creates 200]` — the Kubernetes API fake in a process of its
own (so its CPU is not counted), a private Redis, and in this process the reconcile Context a
worker builds (`KubernetesGateway`, the kubernetes provider, the real `Dispatcher` with a send
that only records).  It applies one kubernetes-provider Proxy and runs its create step the way a
`proxy.create` task does (`Dispatcher.run_step`: lock, own writes, the step, routing its
followup), then the poll followups until Running (the Pod first Pending, then Running as a
kubelet would report it), and prints every request the fake received, in order.  Then it times
`--creates` create steps of new Proxies (`time.process_time` of this process around
`run_step`; the applies are not counted) after a warm-up, and prints CPU ms per create step.
"""

from __future__ import annotations

import argparse
import multiprocessing
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from kubernetes import client as k8s  # noqa: E402

from app.resources import GROUP, PLURAL, VERSION  # noqa: E402

SPAWN = multiprocessing.get_context("spawn")
NS = "default"


def _serve_fake(conn) -> None:
    """Child process: the API fake; answers ``log`` (and forgets it) and ``cpu`` until told to stop."""
    import resource

    from devcluster.apiserver.server import FakeKube

    fake = FakeKube(history_limit=100000, garbage_collector=False).start()
    log = fake.record_requests()
    conn.send(fake.url)
    while True:
        msg = conn.recv()
        if msg == "log":
            conn.send(list(log))
            log.clear()
        elif msg == "cpu":
            ru = resource.getrusage(resource.RUSAGE_SELF)
            conn.send(ru.ru_utime + ru.ru_stime)
        else:
            break
    fake.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--creates", type=int, default=200, help="create steps timed (default 200)")
    parser.add_argument("--warmup", type=int, default=20, help="create steps before timing (default 20)")
    args = parser.parse_args()

    import redis as redis_lib

    from app.config.providers import ProviderConfig, ProvidersConfig
    from app.dispatch.proxies import Dispatcher, Router
    from app.kube.gateway import KubernetesGateway
    from app.providers.kubernetes.config import KubernetesSettings
    from app.providers.kubernetes.provider import KubernetesProvider
    from app.providers.registry import build
    from app.proxy.reconcile import CREATE, POLL, Context, Ref
    from app.config.settings import Settings
    from app.wiring import PROVIDER_TYPES
    from devcluster.redis_server import RedisServer

    parent, child = SPAWN.Pipe()
    proc = SPAWN.Process(target=_serve_fake, args=(child,), daemon=True)
    proc.start()
    url = parent.recv()
    redis_server = RedisServer()
    try:
        cfg = k8s.Configuration()
        cfg.host = url
        cfg.api_key = {"authorization": "Bearer kubefake"}
        client = k8s.ApiClient(cfg)
        user = k8s.CustomObjectsApi(k8s.ApiClient(cfg))  # the user's kubectl, not the product's client
        config = ProvidersConfig((ProviderConfig("k8s-local", "kubernetes", 60, 15, KubernetesSettings()),))
        registry = build(config, {"kubernetes": lambda pc: KubernetesProvider(pc, client=client)})
        r = redis_lib.Redis.from_url(redis_server.url, decode_responses=True)
        ctx = Context(kube=KubernetesGateway(client), registry=registry, redis=r, settings=Settings())
        sent: list = []
        dispatcher = Dispatcher(r, Router(config, PROVIDER_TYPES), lambda task, a, queue, countdown:
                                sent.append((task, queue, countdown)))

        def apply(name: str) -> Ref:
            body = {"apiVersion": f"{GROUP}/{VERSION}", "kind": "Proxy",
                    "metadata": {"name": name, "namespace": NS},
                    "spec": {"provider": "k8s-local", "endpoint": {"port": 3128}}}
            obj = user.create_namespaced_custom_object(GROUP, VERSION, NS, PLURAL, body)
            return Ref(NS, name, obj["metadata"]["uid"])

        def requests() -> list:
            parent.send("log")
            return parent.recv()

        def show(title: str, reqs: list) -> None:
            print(f"{title}: {len(reqs)} request(s)")
            for method, path in reqs:
                print(f"  {method:6} {path}")

        for i in range(args.warmup):
            dispatcher.run_step(ctx, CREATE, apply(f"warm-{i}"))
        ref = apply("squid-1")
        requests()
        outcome = dispatcher.run_step(ctx, CREATE, ref)
        create_reqs = requests()
        show(f"create step ({outcome}, followup {sent[-1][0]})", create_reqs)
        dispatcher.run_step(ctx, POLL, ref)
        show(f"poll, Pod Pending (followup {sent[-1][0]})", requests())
        pod = ctx.kube.get_proxy(NS, "squid-1").status["instanceName"]
        k8s.CoreV1Api(k8s.ApiClient(cfg)).patch_namespaced_pod_status(
            pod, NS, {"status": {"phase": "Running", "podIP": "10.1.2.3"}})
        requests()
        dispatcher.run_step(ctx, POLL, ref)
        show("poll, Pod Running", requests())
        print(f"phase: {ctx.kube.get_proxy(NS, 'squid-1').phase}")

        refs = [apply(f"timed-{i}") for i in range(args.creates)]
        requests()
        parent.send("cpu")
        fake_cpu = parent.recv()
        cpu = []
        for ref in refs:
            t0 = time.process_time()
            dispatcher.run_step(ctx, CREATE, ref)
            cpu.append(time.process_time() - t0)
        n = len(requests())
        parent.send("cpu")
        fake_cpu = parent.recv() - fake_cpu
        print(f"{args.creates} create steps: {n / args.creates:.1f} requests each, CPU per step "
              f"mean {statistics.mean(cpu) * 1000:.2f} ms, median {statistics.median(cpu) * 1000:.2f} ms "
              f"(this process: client, dispatcher, Redis client); the fake {fake_cpu / args.creates * 1000:.2f} ms")
    finally:
        parent.send("stop")
        proc.join(5)
        redis_server.stop()


if __name__ == "__main__":
    main()
