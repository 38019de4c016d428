"""Helpers for tests that drive Proxy objects through the Kubernetes API fake.

What ``kubectl`` and the kubelet would do (apply, patch the spec, delete, report a Pod
running), read-backs, a thread running one reconcile step while the test does something
else (the way a second worker would), and :func:`settle`, which drives a Proxy through its
steps the way the task layer does.
"""

from __future__ import annotations

import base64
import threading
import time

from kubernetes import client as k8s

from app.squid import conf as squid
from app.kube.gateway import KubernetesGateway
from app.providers.kubernetes.provider import LABEL_MANAGED_BY
from app.config.providers import ProviderConfig
from app.proxy.reconcile import CREATE, DELETE, POLL, Ref, create, decide, delete, poll
from app.resources import GROUP, PLURAL, VERSION, Proxy
from tests.support import contexts

NS = "default"


def apply(api, name: str, spec: dict, annotations: dict | None = None, namespace: str = NS) -> Ref:
    """``kubectl apply`` (create) of a Proxy; return its :class:`Ref`."""
    body = {"apiVersion": f"{GROUP}/{VERSION}", "kind": "Proxy",
            "metadata": {"name": name, "namespace": namespace, "annotations": annotations or {}}, "spec": spec}
    obj = k8s.CustomObjectsApi(api).create_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, body)
    return Ref(namespace, name, obj["metadata"]["uid"])


def rotate_credentials(api, secret_name: str, namespace: str = NS) -> str:
    """What a user rotating a Proxy's basic-auth Secret does: write a new username, password and
    the htpasswd line that goes with them into ``namespace/secret_name``; return that line
    (without its newline)."""
    user, password = squid.generate_credentials()
    line = squid.htpasswd_entry(user, password)
    k8s.CoreV1Api(api).patch_namespaced_secret(secret_name, namespace, {"data": {
        key: base64.b64encode(value.encode()).decode()
        for key, value in (("username", user), ("password", password), ("htpasswd", line + "\n"))}})
    return line


def read(api, ref: Ref) -> Proxy | None:
    """The Proxy named by ``ref`` as the API has it now (``None`` when gone)."""
    return KubernetesGateway(api).get_proxy(ref.namespace, ref.name)


def patch_spec(api, name: str, spec: dict, namespace: str = NS) -> None:
    """Merge-patch a Proxy's spec (a user's edit: a new generation)."""
    k8s.CustomObjectsApi(api).patch_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, name, {"spec": spec})


def kubectl_delete(api, ref: Ref) -> None:
    """``kubectl delete`` of the Proxy (the finalizer holds it until the operator releases it)."""
    k8s.CustomObjectsApi(api).delete_namespaced_custom_object(GROUP, VERSION, ref.namespace, PLURAL, ref.name)


def pods(api) -> list:
    """Every Pod carrying the operator's managed-by label, in every namespace."""
    return k8s.CoreV1Api(api).list_pod_for_all_namespaces(label_selector=f"{LABEL_MANAGED_BY}=proxy-operator").items


def kubelet_runs(api, pod_name: str, ip: str, namespace: str = NS) -> None:
    """Do what the kubelet does when the container starts: Running with a Pod IP."""
    k8s.CoreV1Api(api).patch_namespaced_pod_status(pod_name, namespace, {"status": {"phase": "Running", "podIP": ip}})


def run_delete_until_released(ctx, ref: Ref, limit: int = 20) -> None:
    """Run the delete step and its followups (as the task layer would) until nothing is left.

    Raises:
        AssertionError: a followup is not a delete, or ``limit`` steps did not finish it.
    """
    attempt = 0
    for _ in range(limit):
        followup = delete(ctx, ref, attempt)
        if followup is None:
            return
        assert followup.action == DELETE
        attempt = followup.attempt
        time.sleep(followup.delay)
    raise AssertionError("the delete never finished")


class Background:
    """Runs one reconcile step in a thread and keeps what it returned or raised."""

    def __init__(self, fn, *args) -> None:
        self.result = self.error = None
        self.thread = threading.Thread(target=self._run, args=(fn, *args), daemon=True)
        self.thread.start()

    def _run(self, fn, *args) -> None:
        try:
            self.result = fn(*args)
        except BaseException as exc:  # noqa: BLE001 - reported by join()
            self.error = exc

    def join(self, timeout: float = 30):
        """Wait for the step; return what it returned, or raise what it raised."""
        self.thread.join(timeout)
        assert not self.thread.is_alive(), "the step never finished"
        if self.error is not None:
            raise self.error
        return self.result


#: Two images a :func:`k8s_provider_with_images` provider allows (a spec change between them is
#: a new instance).
IMAGES = ("example/squid:6", "example/squid:7")


def k8s_provider_with_images(name: str = "k8s-local", namespace: str = "") -> ProviderConfig:
    """A ``kubernetes`` provider named ``name`` that allows :data:`IMAGES` (Pods in ``namespace``,
    or the Proxy's own when empty)."""
    return contexts.k8s_provider(name, namespace=namespace, images=IMAGES)


def pod_images(api) -> list[tuple[str, str, str]]:
    """``(namespace, name, image)`` of every managed Pod, sorted."""
    return sorted((p.metadata.namespace, p.metadata.name, p.spec.containers[0].image) for p in pods(api))


def kubelet_runs_all(api) -> None:
    """Do what the kubelet does for every managed Pod not Running yet (Running, Pod IP 10.1.2.3)."""
    for pod in pods(api):
        if (pod.status.phase if pod.status else None) != "Running":
            k8s.CoreV1Api(api).patch_namespaced_pod_status(
                pod.metadata.name, pod.metadata.namespace, {"status": {"phase": "Running", "podIP": "10.1.2.3"}})


def settle(ctx, api, ref: Ref, limit: int = 30) -> None:
    """Drive the Proxy the way the task layer does until nothing is left to do.

    Each round runs what :func:`app.proxy.reconcile.decide` answers for the object as it is now
    (the watcher's view), following a step's own followups; the kubelet runs every Pod between
    rounds.

    Raises:
        AssertionError: ``limit`` rounds did not settle the Proxy.
    """
    steps = {CREATE: create, POLL: poll, DELETE: delete}
    for _ in range(limit):
        kubelet_runs_all(api)
        proxy = read(api, ref)
        if proxy is None or proxy.uid != ref.uid:
            return
        action = decide(proxy)
        if action is None:
            return
        followup = steps[action](ctx, ref, 0)
        while followup is not None:
            kubelet_runs_all(api)
            followup = steps[followup.action](ctx, ref, followup.attempt)
    raise AssertionError("the Proxy never settled")
