"""The queue each task type is *sent* to, from the code that sends it (decisions 9 and 14).

tests/test_routing.py checks the Router's answers; here the senders themselves are run and
what they publish is recorded:

* :meth:`app.dispatch.proxies.Dispatcher.retire` (the delete of a replaced instance) through an
  injected ``send``, as every dispatcher test does;
* the Celery tasks of :mod:`workers.tasks` (``gc.sweep`` fanning out ``gc.collect_shard`` and
  ``gc.collect``, ``providers.check`` fanning out ``providers.check_host``) in a process of
  their own, configured by the environment the way a worker is (``PROVIDERS_CONFIG``,
  ``REDIS_URL``: the test's Redis is the broker), with Celery's ``before_task_publish``
  signal recording each message's task and routing key.  ``gc.collect_shard``'s ``gc.delete``
  needs a real host listing: tests/kvm/test_delete_during_create.py runs it on real libvirt.

A kvm provider ``lab`` with hosts h1 and h2 (never dialled) and a kubernetes provider ``k8s``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from app.config.providers import ProvidersConfig
from app.dispatch.proxies import RETIRE_TASK, Dispatcher, Router
from app.store.queues import GC, PROXIES
from app.proxy.reconcile import Ref
from app.wiring import PROVIDER_TYPES, parse_config
from tests.kvm import harness

ROOT = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.timeout(120)

#: Runs one task function of workers.tasks (argv: task attribute, JSON args) and prints every
#: message it published as ``SENT [[task, routing_key, args, kwargs], ...]``.
DRIVER = r"""
import json, os, sys
from celery.signals import before_task_publish

sent = []


@before_task_publish.connect(weak=False)
def _record(sender=None, body=None, routing_key=None, **_):
    args, kwargs = (body[0], body[1]) if isinstance(body, (list, tuple)) else (None, None)
    sent.append([sender, routing_key, args, kwargs])


from workers import tasks

getattr(tasks, sys.argv[1])(*json.loads(sys.argv[2]))
print("SENT " + json.dumps(sent), flush=True)
os._exit(0)  # the process's clients (an SSH link's threads) would keep it alive
"""


def run_task(task: str, args: list, env: dict[str, str], timeout: float = 90) -> list[tuple]:
    """Run ``workers.tasks.<task>(*args)`` in a fresh process with ``env``; return what it sent
    as ``(task name, routing key, args, kwargs)`` tuples, in order."""
    proc = subprocess.run([sys.executable, "-c", DRIVER, task, json.dumps(args)], cwd=ROOT, capture_output=True,
                          text=True, timeout=timeout, env={**os.environ, "LOG_LEVEL": "WARNING", **env})
    assert proc.returncode == 0, proc.stderr[-4000:]
    lines = [line for line in proc.stdout.splitlines() if line.startswith("SENT ")]
    assert lines, proc.stdout[-2000:] + proc.stderr[-2000:]
    return [tuple(m) for m in json.loads(lines[-1][len("SENT "):])]


def providers_entries(tmp_path) -> list[dict]:
    for name in ("key", "known_hosts"):
        (tmp_path / name).write_text("")
    kvm = harness.kvm_entry(user="u", port=22, key_file=tmp_path / "key", known_hosts_file=tmp_path / "known_hosts",
                            hosts=[{"name": h, "address": "127.0.0.1"} for h in ("h1", "h2")], name="lab")
    k8s = {"name": "k8s", "type": "kubernetes", "kubernetes": {"namespace": "proxies"}}
    return [{**kvm, "checkInterval": 0}, {**k8s, "checkInterval": 0}]


@pytest.fixture()
def env(tmp_path, redis_url, kubeconfig) -> dict[str, str]:
    path = tmp_path / "providers.yaml"
    path.write_text(yaml.safe_dump({"providers": providers_entries(tmp_path)}))
    return {"PROVIDERS_CONFIG": str(path), "REDIS_URL": redis_url, "KUBECONFIG": kubeconfig}


def test_the_delete_of_a_replaced_instance_is_sent_to_the_queue_of_the_place_it_lives_in(tmp_path, redis_client):
    config: ProvidersConfig = parse_config({"providers": providers_entries(tmp_path)}, "providers.yaml")
    sent: list = []
    dispatcher = Dispatcher(redis_client, Router(config, PROVIDER_TYPES),
                            lambda task, args, queue, countdown=None: sent.append((task, args, queue)))
    ref = Ref("ns", "p", "0b1c2d3e-0000-4000-8000-00000000abcd")
    dispatcher.retire("lab", "hosts/h1/domains/proxy-abc", ref)   # the Proxy moved h1 -> h2
    dispatcher.retire("lab", "hosts/h2/domains/proxy-abc", ref)
    dispatcher.retire("k8s", "proxies/proxy-abc", ref)
    assert sent == [
        (RETIRE_TASK, ["lab", "hosts/h1/domains/proxy-abc", "ns", "p", ref.uid], "kvm.lab.h1"),
        (RETIRE_TASK, ["lab", "hosts/h2/domains/proxy-abc", "ns", "p", ref.uid], "kvm.lab.h2"),
        (RETIRE_TASK, ["k8s", "proxies/proxy-abc", "ns", "p", ref.uid], PROXIES),
    ]


def test_a_gc_sweep_lists_each_kvm_host_on_its_own_queue(env):
    sent = run_task("gc_sweep", [], env)
    shards = sorted((queue, args[:2], args[3]) for task, queue, args, _ in sent if task == "gc.collect_shard")
    assert shards == [("kvm.lab.h1", ["lab", "h1"], 2), ("kvm.lab.h2", ["lab", "h2"], 2)]
    sweep_ids = {args[2] for task, _, args, _ in sent if task == "gc.collect_shard"}
    assert len(sweep_ids) == 1 and next(iter(sweep_ids)).startswith("lab:")   # one sweep, both shards
    assert [(task, queue, args) for task, queue, args, _ in sent if task == "gc.collect"] == [
        ("gc.collect", GC, ["k8s"])]
    assert len(sent) == 3


def test_a_kvm_provider_check_runs_each_host_check_on_the_hosts_queue(env):
    sent = run_task("provider_check", ["lab"], env)
    assert sorted((task, queue, args) for task, queue, args, _ in sent) == [
        ("providers.check_host", "kvm.lab.h1", ["lab", "h1"]),
        ("providers.check_host", "kvm.lab.h2", ["lab", "h2"]),
    ]
