"""Helpers for tests that drive Proxy objects through the Kubernetes API fake.

What ``kubectl`` and the kubelet would do (apply, patch the spec, delete, report a Pod
running), read-backs, and a thread running one reconcile step while the test does something
else (the way a second worker would).
"""

from __future__ import annotations

import base64
import threading
import time

from kubernetes import client as k8s

from app.squid import conf as squid
from app.kube.gateway import KubernetesGateway
from app.providers.kubernetes.provider import LABEL_MANAGED_BY
from app.proxy.reconcile import DELETE, Ref, delete
from app.resources import GROUP, PLURAL, VERSION, Proxy

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
