"""Shared parts of the ``instance.retire`` tests that drive a real Celery worker.

* :func:`worker_env` — a worker's environment: the kubernetes provider ``k8s-local`` on the
  API fake (plus any other provider entries), the test's Redis, GC off.
* :func:`replaced_pod` — a Pod of a replaced instance whose Proxy no longer exists.
* :func:`send_retire` — the ``instance.retire`` message ``Dispatcher.retire`` sends.
* :func:`retire_lines` — the worker's log lines about retiring one provider ID, whether the
  worker logs the ID bare or quoted (``retire default/p: ...`` or ``retire 'default/p': ...``).
"""

from __future__ import annotations

import re
import uuid
from pathlib import Path

import yaml
from celery import Celery
from celery.result import AsyncResult
from kubernetes import client as k8s

from app.providers.kubernetes.provider import LABEL_MANAGED_BY, LABEL_PROXY_UID

#: The kubernetes provider every :func:`worker_env` configures.
K8S_PROVIDER = "k8s-local"


def worker_env(kube, redis_url: str, tmp_path: Path, providers: list[dict] | None = None,
               **settings: str) -> dict[str, str]:
    """Return a worker's environment (variable -> value).

    Writes ``tmp_path/providers.yaml`` with ``k8s-local`` (type kubernetes, on the API fake
    ``kube``) followed by ``providers`` (providers-config entries, e.g. from
    ``tests.kvm.harness.kvm_entry``), every entry with ``checkInterval: 0s``, and
    ``tmp_path/kubeconfig``.  The environment points at them and at ``redis_url``, turns GC
    off (``GC_INTERVAL`` one hour) and the egress check off; ``settings`` (``RETRY_INITIAL``,
    ``POLL_INITIAL``, time limits ...) go on top.
    """
    entries = [{"name": K8S_PROVIDER, "type": "kubernetes"}, *(providers or [])]
    path = tmp_path / "providers.yaml"
    path.write_text(yaml.safe_dump({"providers": [{**entry, "checkInterval": "0s"} for entry in entries]}))
    return {"KUBECONFIG": kube.write_kubeconfig(str(tmp_path / "kubeconfig")), "REDIS_URL": redis_url,
            "PROVIDERS_CONFIG": str(path), "GC_INTERVAL": "3600", "BROKER_VISIBILITY_TIMEOUT": "60",
            "EGRESS_ECHO_URL": "", "LOG_LEVEL": "INFO", **settings}


def replaced_pod(core: k8s.CoreV1Api, name: str = "replaced-pod") -> str:
    """Create the Pod ``default/<name>`` managed by the operator and tagged with the UID of a
    Proxy that does not exist (a replaced instance of a deleted Proxy); return that UID."""
    uid = str(uuid.uuid4())
    core.create_namespaced_pod("default", k8s.V1Pod(
        metadata=k8s.V1ObjectMeta(name=name, labels={LABEL_MANAGED_BY: "proxy-operator", LABEL_PROXY_UID: uid}),
        spec=k8s.V1PodSpec(containers=[k8s.V1Container(name="squid", image="squid")])))
    return uid


def send_retire(client: Celery, uid: str, *, provider: str = K8S_PROVIDER,
                provider_id: str = "default/replaced-pod", queue: str = "proxies") -> AsyncResult:
    """Send ``instance.retire`` the way ``Dispatcher.retire`` does (app/dispatch/proxies.py): the
    instance ``provider_id`` of ``provider``, once of the Proxy ``default/gone`` with ``uid``,
    on ``queue`` (by default a kubernetes instance on its queue, ``proxies``).  Returns the
    message's result handle (its ``id`` is the task ID the worker logs)."""
    return client.send_task("instance.retire", args=[provider, provider_id, "default", "gone", uid], queue=queue)


def retire_pattern(provider_id: str) -> str:
    """Return a regular expression matching ``retire <provider_id>:`` with the ID bare or quoted."""
    return rf"retire (?:{re.escape(provider_id)}|'{re.escape(provider_id)}'):"


def retire_lines(log: str, provider_id: str) -> list[str]:
    """Return the lines of ``log`` about retiring ``provider_id`` (see :func:`retire_pattern`)."""
    pattern = re.compile(retire_pattern(provider_id))
    return [line for line in log.splitlines() if pattern.search(line)]
