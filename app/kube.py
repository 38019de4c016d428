"""Kubernetes API access for the operator (the official ``kubernetes`` client).

:func:`api_client` loads ``KUBECONFIG`` (or ``~/.kube/config``) when present, else the
in-cluster service account.  :class:`Kube` wraps the calls the reconciler makes on Proxy
objects.  Custom objects are written with JSON merge patches (the only patch type the client
sends for them); status always goes through the status subresource, and metadata writes carry
``resourceVersion`` so a concurrent writer gets 409 Conflict instead of a lost update
(Kubernetes API conventions, "Concurrency Control and Consistency").
"""

from __future__ import annotations

import base64
import logging
import os
import threading
from datetime import datetime, timezone

from kubernetes import client as k8s
from kubernetes import config as k8s_config

from app.resources import FINALIZER, GROUP, KIND, PLURAL, VERSION, Proxy

log = logging.getLogger(__name__)

_lock = threading.Lock()
_client: k8s.ApiClient | None = None
_pid: int | None = None


def load_configuration() -> k8s.Configuration:
    """Return a client configuration from ``KUBECONFIG``/``~/.kube/config``, else in-cluster.

    Raises:
        kubernetes.config.ConfigException: neither is available.
    """
    cfg = k8s.Configuration()
    kubeconfig = (os.environ.get("KUBECONFIG") or os.path.expanduser("~/.kube/config")).split(os.pathsep)[0]
    if os.path.exists(kubeconfig):
        k8s_config.load_kube_config(config_file=kubeconfig, client_configuration=cfg)
    else:
        k8s_config.load_incluster_config(client_configuration=cfg)
    return cfg


def api_client() -> k8s.ApiClient:
    """Return this process's :class:`kubernetes.client.ApiClient`, created on first use.

    A forked child (Celery prefork) gets its own client: connection pools must not be
    shared across ``fork``.
    """
    global _client, _pid
    with _lock:
        if _client is None or _pid != os.getpid():
            _client = k8s.ApiClient(load_configuration())
            _pid = os.getpid()
        return _client


class Kube:
    """The operator's reads and writes of Proxy objects, Secrets and Events.

    Args:
        client: a :class:`kubernetes.client.ApiClient` (default: :func:`api_client`).
    Every method raises :class:`kubernetes.client.ApiException` for API errors other than the
    ones it documents as handled.
    """

    def __init__(self, client: k8s.ApiClient | None = None) -> None:
        self.client = client or api_client()
        self.custom = k8s.CustomObjectsApi(self.client)
        self.core = k8s.CoreV1Api(self.client)
        self._local = threading.local()

    # -- own writes ----------------------------------------------------------------------
    def _wrote(self, proxy: Proxy) -> Proxy:
        written = getattr(self._local, "written", None)
        if written is None:
            written = self._local.written = []
        written.append(proxy.resource_version)
        return proxy

    def take_written(self) -> list[str]:
        """Return and forget the resourceVersions of the Proxy writes this thread made.

        The task layer publishes them so the watcher can recognise the events its own
        writes cause (resourceVersions are compared for equality only, as the API
        conventions require: they are opaque).
        """
        written = getattr(self._local, "written", None) or []
        self._local.written = []
        return written

    # -- Proxy objects -----------------------------------------------------------------
    def get_proxy(self, namespace: str, name: str) -> Proxy | None:
        """Return the Proxy ``namespace/name``, or ``None`` when it does not exist (404)."""
        try:
            obj = self.custom.get_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, name)
        except k8s.ApiException as exc:
            if exc.status == 404:
                return None
            raise
        return Proxy.from_dict(obj)

    def list_proxies(self) -> list[Proxy]:
        """Return every Proxy in every namespace."""
        items = self.custom.list_cluster_custom_object(GROUP, VERSION, PLURAL).get("items") or []
        return [Proxy.from_dict(o) for o in items]

    def set_finalizers(self, proxy: Proxy, finalizers: list[str]) -> Proxy:
        """Replace ``metadata.finalizers`` (optimistic: 409 if the object changed meanwhile).

        Returns the updated Proxy; ``None``-safe for an object deleted meanwhile is the
        caller's job (a 404 ApiException propagates).
        """
        patch = {"metadata": {"finalizers": finalizers, "resourceVersion": proxy.resource_version}}
        obj = self.custom.patch_namespaced_custom_object(GROUP, VERSION, proxy.namespace, PLURAL, proxy.name, patch)
        return self._wrote(Proxy.from_dict(obj))

    def add_finalizer(self, proxy: Proxy) -> Proxy:
        """Ensure :data:`app.resources.FINALIZER` is present; return the (possibly updated) Proxy."""
        if FINALIZER in proxy.finalizers:
            return proxy
        return self.set_finalizers(proxy, [*proxy.finalizers, FINALIZER])

    def remove_finalizer(self, proxy: Proxy) -> None:
        """Remove our finalizer; a Proxy already gone (404) is fine."""
        if FINALIZER not in proxy.finalizers:
            return
        try:
            self.set_finalizers(proxy, [f for f in proxy.finalizers if f != FINALIZER])
        except k8s.ApiException as exc:
            if exc.status != 404:
                raise

    def patch_status(self, proxy: Proxy, status: dict) -> Proxy:
        """Merge-patch ``status`` through the status subresource; return the updated Proxy.

        The patch carries ``proxy``'s resourceVersion as a precondition: a merge patch replaces
        the whole ``conditions`` list, so a write based on a stale read (the health engine
        may have written meanwhile) must fail with 409 and be retried, not drop a condition.
        """
        body = {"metadata": {"resourceVersion": proxy.resource_version}, "status": status}
        obj = self.custom.patch_namespaced_custom_object_status(
            GROUP, VERSION, proxy.namespace, PLURAL, proxy.name, body)
        return self._wrote(Proxy.from_dict(obj))

    # -- Secrets -------------------------------------------------------------------------
    def read_secret_key(self, namespace: str, name: str, key: str) -> bytes | None:
        """Return the decoded value of ``key`` in Secret ``namespace/name``.

        Returns ``None`` when the Secret or the key does not exist.  The value is user data:
        never log it.
        """
        return (self.read_secret_data(namespace, name) or {}).get(key)

    def read_secret_data(self, namespace: str, name: str) -> dict[str, bytes] | None:
        """Return the decoded ``data`` of Secret ``namespace/name``, or ``None`` when it does not exist."""
        try:
            secret = self.core.read_namespaced_secret(name, namespace)
        except k8s.ApiException as exc:
            if exc.status == 404:
                return None
            raise
        return {k: base64.b64decode(v) for k, v in (secret.data or {}).items()}

    @staticmethod
    def credentials_secret_name(proxy: Proxy) -> str:
        """Name of the Proxy's basic-auth Secret: ``<proxy>-proxy-auth`` (in its namespace)."""
        return f"{proxy.name}-proxy-auth"

    def _owned_secret(self, proxy: Proxy):
        """Return the Proxy's credentials Secret if it exists and this Proxy owns it.

        Returns ``None`` when it does not exist.
        Raises:
            app.providers.errors.Transient: the Secret belongs to an earlier Proxy of the same
                name (the cluster's garbage collector is about to delete it).
            app.providers.errors.Permanent: a Secret of that name exists that no Proxy owns: the
                operator never overwrites or deletes somebody else's Secret.
        """
        from app.providers.errors import Permanent, Transient

        name = self.credentials_secret_name(proxy)
        try:
            secret = self.core.read_namespaced_secret(name, proxy.namespace)
        except k8s.ApiException as exc:
            if exc.status == 404:
                return None
            raise
        owners = secret.metadata.owner_references or []
        if any(o.uid == proxy.uid for o in owners):
            return secret
        if any(o.kind == KIND for o in owners):
            raise Transient(f"Secret {proxy.namespace}/{name} still belongs to an earlier Proxy of this name")
        raise Permanent(f"Secret {proxy.namespace}/{name} exists and is not owned by this Proxy; "
                        "rename or delete it to let the operator create the basic-auth credentials")

    def read_proxy_credentials(self, proxy: Proxy) -> tuple[str, str, str] | None:
        """Return ``(username, password, htpasswd_line)`` from the Proxy's own Secret, or ``None``.

        Never creates anything: credentials baked into a running instance must not change
        under it.  Never log the values.
        """
        from app import squid

        secret = self._owned_secret(proxy)
        data = (secret.data or {}) if secret is not None else {}
        keys = (squid.SECRET_USERNAME_KEY, squid.SECRET_PASSWORD_KEY, squid.SECRET_HTPASSWD_KEY)
        if not all(k in data for k in keys):
            return None
        username, password, htpasswd = (base64.b64decode(data[k]).decode() for k in keys)
        return username, password, htpasswd

    def ensure_proxy_credentials(self, proxy: Proxy) -> tuple[str, str, str, str]:
        """Return ``(secret_name, username, password, htpasswd_line)``, creating the Secret if needed.

        The Secret holds ``username``, ``password`` and ``htpasswd``
        (:func:`app.squid.credentials_secret`) and is owned by the Proxy (ownerReferences), so
        the cluster deletes it with the Proxy.  An existing Secret of this Proxy is reused, so a
        recreated instance keeps the credentials crawlers already mounted.  Called only when an
        instance is about to be created.  Never log the values.

        Raises:
            app.providers.errors.Transient / Permanent: see :meth:`_owned_secret`; also
                Transient when the existing Secret lacks a key (fix it or delete it).
        """
        from app import squid
        from app.providers.errors import Transient

        name = self.credentials_secret_name(proxy)
        if self._owned_secret(proxy) is not None:
            found = self.read_proxy_credentials(proxy)
            if found is None:
                raise Transient(f"Secret {proxy.namespace}/{name} lacks username, password or htpasswd")
            return (name, *found)
        username, password = squid.generate_credentials()
        body = squid.credentials_secret(name, proxy.namespace, username, password,
                                        labels={"app.kubernetes.io/managed-by": "proxy-operator"})
        body["metadata"]["ownerReferences"] = [{
            "apiVersion": f"{GROUP}/{VERSION}", "kind": KIND, "name": proxy.name, "uid": proxy.uid,
            "controller": True, "blockOwnerDeletion": False}]
        try:
            self.core.create_namespaced_secret(proxy.namespace, body)
        except k8s.ApiException as exc:
            if exc.status != 409:
                raise
            raise Transient(f"Secret {proxy.namespace}/{name} was created concurrently; retrying") from None
        return name, username, password, base64.b64decode(body["data"][squid.SECRET_HTPASSWD_KEY]).decode()

    def delete_proxy_credentials(self, proxy: Proxy) -> None:
        """Delete the Proxy's basic-auth Secret if this Proxy owns it (best effort, never raises).

        The Secret's ownerReference makes the cluster delete it anyway; this only makes that
        immediate.  A Secret of that name that the Proxy does not own is left alone.
        """
        try:
            if self._owned_secret(proxy) is not None:
                self.core.delete_namespaced_secret(self.credentials_secret_name(proxy), proxy.namespace)
        except Exception as exc:  # noqa: BLE001 - never block the finalizer on this
            log.info("proxy %s: credentials Secret not deleted (%s); garbage collection will",
                     proxy.key, type(exc).__name__)

    # -- Events --------------------------------------------------------------------------
    def record_event(self, proxy: Proxy, event_type: str, reason: str, message: str) -> None:
        """Create a core/v1 Event about ``proxy`` (best effort: failures are logged, not raised).

        Args:
            event_type: ``"Normal"`` or ``"Warning"``.
            reason: CamelCase reason (e.g. ``"Provisioning"``).
            message: human-readable, never secrets.
        """
        now = datetime.now(timezone.utc)
        body = k8s.CoreV1Event(
            metadata=k8s.V1ObjectMeta(generate_name=f"{proxy.name}.", namespace=proxy.namespace),
            involved_object=k8s.V1ObjectReference(
                api_version=f"{GROUP}/{VERSION}", kind=KIND, name=proxy.name,
                namespace=proxy.namespace, uid=proxy.uid, resource_version=proxy.resource_version),
            reason=reason, message=message[:1024], type=event_type,
            first_timestamp=now, last_timestamp=now, count=1,
            source=k8s.V1EventSource(component="proxy-operator"),
            reporting_component="proxy-operator", reporting_instance=os.environ.get("HOSTNAME", "proxy-operator"),
        )
        try:
            self.core.create_namespaced_event(proxy.namespace, body)
        except Exception as exc:  # noqa: BLE001 - events are best effort by design
            log.warning("event not recorded for %s: %s %s", proxy.key, reason, exc)


# -- module-level shortcuts on the process-wide client -------------------------------------
def get_proxy(namespace: str, name: str) -> dict | None:
    """Return the Proxy ``namespace/name`` as a dict, or ``None`` when it does not exist."""
    p = Kube().get_proxy(namespace, name)
    return p.raw if p else None


def patch_proxy_status(namespace: str, name: str, status: dict, resource_version: str | None = None) -> dict:
    """Merge-patch ``status`` through the status subresource and return the result.

    Args:
        resource_version: when given, a precondition (409 Conflict if the object changed).
    """
    body: dict = {"status": status}
    if resource_version:
        body["metadata"] = {"resourceVersion": resource_version}
    return Kube().custom.patch_namespaced_custom_object_status(GROUP, VERSION, namespace, PLURAL, name, body)
