"""The one gateway to the Kubernetes API: :class:`KubeGateway` and its implementation.

:class:`KubeGateway` (a :class:`typing.Protocol`) declares every read and write the product makes
through the API on Proxy objects, their finalizers and status, Events, Secrets,
ProviderHealth objects and ProxyPools (their status and scale subresources, and the Proxies
they own: created with an ownerReference, marked draining, released, deleted); :class:`KubernetesGateway`
implements it over the official ``kubernetes`` client.  Callers get typed values
(:class:`app.resources.Proxy`, :class:`Secret`, :class:`ProviderHealthObject`,
:class:`app.pools.model.Pool`), never the client's dicts or models.  API errors other than the
ones a method documents as handled propagate as :class:`kubernetes.client.ApiException` (any
implementation, in-memory fakes included, raises that type with the HTTP status).

Kubernetes conventions followed (API conventions, "Concurrency Control and Consistency" and
"Spec and Status"): custom objects are written with JSON merge patches (RFC 7386, the only
patch type the client sends for them); status only through the status subresource; Proxy
writes carry the ``resourceVersion`` they were computed from, so a concurrent writer gets 409
Conflict instead of a lost update.  *What* a status write contains is decided by the one
status writer, :mod:`app.kube.status_writer`; who may use a Secret by
:mod:`app.kube.credentials`.

Not through the gateway: the watcher's list+watch stream (:mod:`watchers.stream`) and its
leader election on a ``coordination.k8s.io/v1`` Lease (:mod:`watchers.leader`) port client-go
algorithms onto the client's API objects; they use the same process-wide client
(:func:`api_client`).  The kubernetes provider talks to its Pods with the same client, injected
by the composition root (:func:`app.wiring.kube_api_client`): this module imports no provider
and no provider imports it (``tests/test_layout.py``).

:func:`api_client` loads ``KUBECONFIG`` (or ``~/.kube/config``) when present, else the
in-cluster service account, once per process (a forked child builds its own).
"""

from __future__ import annotations

import base64
import json
import logging
import os
import threading
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any, Iterator, Protocol, runtime_checkable

from kubernetes import client as k8s
from kubernetes import config as k8s_config

from app.lazy import per_process
from app.pools.model import Pool
from app.resources import (FINALIZER, GROUP, KIND, PLURAL, POOL_KIND, POOL_PLURAL, PROVIDER_HEALTH_KIND,
                           PROVIDER_HEALTH_PLURAL, VERSION, Proxy, ProxyRef)

log = logging.getLogger(__name__)

#: ``limit`` of each page of the cluster-wide Proxy listings (:meth:`KubernetesGateway.list_proxies`,
#: :meth:`KubernetesGateway.list_proxy_refs`; API concepts, "Retrieving large results sets in chunks").
LIST_PAGE_SIZE = 500
#: Times a Proxy listing starts over when its continue token expires (410 Expired) mid-way.
LIST_RESTARTS = 2
#: (connect, read) timeout of one page of a Proxy listing, seconds.
LIST_TIMEOUT = (10, 60)


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
    if cfg.refresh_api_key_hook is not None:
        _refresh_at_most_every(cfg, REFRESH_HOOK_SECONDS)
    return cfg


#: Seconds between two runs of the kubernetes client's credential refresh hook (see :func:`_refresh_at_most_every`).
REFRESH_HOOK_SECONDS = 1.0


def _refresh_at_most_every(cfg: k8s.Configuration, seconds: float) -> None:
    """Make the client's ``refresh_api_key_hook`` on ``cfg`` run at most once per ``seconds``.

    The loaders' hook runs before every request: it re-reads the token when it expired (the
    in-cluster token file every minute; exec and OIDC tokens 5 minutes before their expiry) and
    then copies the whole connection config back, and setting ``host`` re-reads every proxy
    variable of the environment (``urllib.request.getproxies``): about 1 ms of CPU per request,
    a quarter of a reconcile step's.  A second's delay is far inside the loaders' own margins.
    Each run of the kubeconfig loader's hook installs a new hook; it becomes the one wrapped.
    """
    import time

    inner = cfg.refresh_api_key_hook
    last = float("-inf")

    def refresh(configuration) -> None:
        nonlocal inner, last
        now = time.monotonic()
        if now - last < seconds:
            return
        last = now
        inner(configuration)
        again = configuration.refresh_api_key_hook
        if again is not refresh and again is not None:
            inner = again
            configuration.refresh_api_key_hook = refresh

    cfg.refresh_api_key_hook = refresh


@per_process
def api_client() -> k8s.ApiClient:
    """Return this process's :class:`kubernetes.client.ApiClient`, created on first use.

    A forked child (Celery prefork) gets its own client: connection pools must not be
    shared across ``fork`` (:func:`app.lazy.per_process`).

    Raises:
        kubernetes.config.ConfigException: no kubeconfig and not in a cluster.
    """
    return k8s.ApiClient(load_configuration())


# -- typed values -------------------------------------------------------------------------------
@dataclass(frozen=True)
class OwnerReference:
    """One ``metadata.ownerReferences`` entry (Kubernetes docs, "Owners and Dependents").

    Attributes:
        api_version / kind / name / uid: the owner.
        controller: whether the owner is the managing controller.
        block_owner_deletion: whether foreground deletion of the owner waits for the dependent.
    """

    api_version: str
    kind: str
    name: str
    uid: str
    controller: bool = False
    block_owner_deletion: bool = False


@dataclass(frozen=True)
class Secret:
    """A core/v1 Secret: decoded ``data`` (user data: never log the values).

    Attributes:
        namespace / name: identity.
        data: key -> decoded bytes (the API's ``data`` is base64).
        labels: ``metadata.labels``.
        owners: ``metadata.ownerReferences``.
        type: the Secret ``type`` (``Opaque``).
    """

    namespace: str
    name: str
    data: dict[str, bytes] = field(default_factory=dict)
    labels: dict[str, str] = field(default_factory=dict)
    owners: tuple[OwnerReference, ...] = ()
    type: str = "Opaque"


@dataclass(frozen=True)
class ProviderHealthObject:
    """A cluster-scoped ``ProviderHealth`` object (deploy/crd/providerhealth.yaml).

    Attributes:
        name: the provider's name.
        generation: ``metadata.generation``.
        labels: ``metadata.labels``.
        status: the ``status`` dict (``{}`` when absent): conditions, targets, counts.
    """

    name: str
    generation: int
    labels: dict[str, str]
    status: dict[str, Any]

    @classmethod
    def from_dict(cls, obj: dict) -> "ProviderHealthObject":
        """Build from the object as the API returns it."""
        meta = obj.get("metadata") or {}
        return cls(name=meta.get("name", ""), generation=int(meta.get("generation") or 1),
                   labels=dict(meta.get("labels") or {}), status=dict(obj.get("status") or {}))


# -- the gateway ---------------------------------------------------------------------------------
@runtime_checkable
class KubeGateway(Protocol):
    """Every Kubernetes API operation the operator makes (see the module docstring).

    Errors: :class:`kubernetes.client.ApiException` with the HTTP status, for anything a
    method does not document as handled (409 Conflict on a stale ``resourceVersion``, 404 on a
    write to an object that is gone, 5xx ...).
    """

    # Proxy objects (crawl.example.com/v1alpha1, namespaced)
    def get_proxy(self, namespace: str, name: str) -> Proxy | None:
        """The Proxy ``namespace/name``; ``None`` when it does not exist (404)."""

    def list_proxies(self) -> Iterator[Proxy]:
        """Every Proxy in every namespace, each once, page by page (an iterator: API errors
        surface while iterating)."""

    def list_proxy_refs(self) -> Iterator[ProxyRef]:
        """UID and ``status.providerID`` of every Proxy in every namespace, as :meth:`list_proxies`
        lists them (what GC needs, without building the Proxies)."""

    def add_finalizer(self, proxy: Proxy) -> Proxy:
        """Ensure our finalizer is set (optimistic: 409 if ``proxy`` is stale); the Proxy as written."""

    def remove_finalizer(self, proxy: Proxy) -> None:
        """Drop our finalizer (optimistic: 409 if stale); a Proxy already gone (404) is fine."""

    def patch_status(self, proxy: Proxy, status: dict) -> Proxy:
        """Merge-patch ``status`` (status subresource, RFC 7386) with ``proxy``'s resourceVersion
        as a precondition (409 if stale); the Proxy as written."""

    def take_written(self) -> list[str]:
        """Return and forget the resourceVersions of the Proxy writes this thread made."""

    # Events (core/v1)
    def record_event(self, proxy: Proxy, event_type: str, reason: str, *, message: str) -> None:
        """Create an Event about ``proxy``; best effort (never raises)."""

    # Secrets (core/v1)
    def read_secret(self, namespace: str, name: str) -> Secret | None:
        """The Secret ``namespace/name`` with its data decoded; ``None`` when it does not exist."""

    def create_secret(self, secret: Secret) -> None:
        """Create ``secret`` (409 AlreadyExists when one of that name exists)."""

    def delete_secret(self, namespace: str, name: str) -> bool:
        """Delete the Secret; ``False`` when it did not exist."""

    # Proxies made by a ProxyPool (members)
    def list_proxies_in(self, namespace: str) -> list[Proxy]:
        """Every Proxy of ``namespace``."""

    def create_proxy(self, namespace: str, name: str, *, spec: dict, labels: dict[str, str],
                     owners: tuple[OwnerReference, ...] = (), annotations: dict[str, str] | None = None) -> Proxy:
        """Create a Proxy carrying ``owners`` as ``metadata.ownerReferences`` (409 AlreadyExists)."""

    def annotate_proxy(self, proxy: Proxy, annotations: dict[str, str | None]) -> Proxy:
        """Merge-patch ``metadata.annotations`` (``None`` deletes one) with ``proxy``'s
        resourceVersion as a precondition (409 if stale); the Proxy as written."""

    def release_proxy(self, proxy: Proxy, owner_uid: str, *,
                      annotations: dict[str, str | None] | None = None) -> Proxy:
        """Remove the ownerReference to ``owner_uid`` from ``proxy`` (any others kept), and merge
        ``annotations`` (``None`` deletes one) in the same write, with ``proxy``'s resourceVersion
        and UID as preconditions (409 if stale, 404 if gone); the Proxy as written."""

    def delete_proxy(self, namespace: str, name: str, uid: str) -> bool:
        """Delete the Proxy if it is still the object ``uid`` (a precondition); ``False`` when gone."""

    # ProxyPool objects (crawl.example.com/v1alpha1, namespaced)
    def get_pool(self, namespace: str, name: str) -> Pool | None:
        """The ProxyPool ``namespace/name``; ``None`` when it does not exist (404)."""

    def list_pools(self) -> list[Pool]:
        """Every ProxyPool in every namespace."""

    def patch_pool_status(self, pool: Pool, status: dict) -> Pool:
        """Merge-patch ``status`` through the status subresource (RFC 7386); the pool as written."""

    def scale_pool(self, pool: Pool, replicas: int) -> None:
        """Set ``spec.replicas`` through the scale subresource (a merge patch of the Scale)."""

    def record_pool_event(self, pool: Pool, event_type: str, reason: str, *, message: str) -> None:
        """Create an Event about ``pool``; best effort (never raises)."""

    # ProviderHealth objects (crawl.example.com/v1alpha1, cluster-scoped)
    def get_provider_health(self, name: str) -> ProviderHealthObject | None:
        """The ProviderHealth ``name``; ``None`` when it does not exist."""

    def create_provider_health(self, name: str, labels: dict[str, str]) -> ProviderHealthObject:
        """Create an empty ProviderHealth ``name`` with ``labels``."""

    def patch_provider_health_status(self, name: str, status: dict) -> ProviderHealthObject:
        """Merge-patch ``status`` through the status subresource (RFC 7386)."""

    def list_provider_health(self, label_selector: str | None = None) -> list[ProviderHealthObject]:
        """Every ProviderHealth (matching ``label_selector`` when given)."""

    def delete_provider_health(self, name: str) -> bool:
        """Delete the ProviderHealth ``name``; ``False`` when it did not exist."""


class KubernetesGateway:
    """:class:`KubeGateway` over the official ``kubernetes`` client.

    Args:
        client: a :class:`kubernetes.client.ApiClient`; default: this process's
            (:func:`api_client`, looked up on every call, so a gateway made before a fork is
            still safe to use after it).
        record_writes: remember the resourceVersion of every Proxy write per thread, for
            :meth:`take_written` (the reconcile tasks publish them so the watcher drops the events
            its own writes cause).  Off for a writer nobody takes them from (the health engine).
    """

    def __init__(self, client: k8s.ApiClient | None = None, *, record_writes: bool = True) -> None:
        self._fixed = client
        self._record = record_writes
        self._apis: tuple[k8s.ApiClient, k8s.CustomObjectsApi, k8s.CoreV1Api] | None = None
        self._local = threading.local()

    @property
    def client(self) -> k8s.ApiClient:
        """The :class:`kubernetes.client.ApiClient` this gateway uses now."""
        return self._fixed or api_client()

    def _api(self) -> tuple[k8s.CustomObjectsApi, k8s.CoreV1Api]:
        client = self.client
        apis = self._apis
        if apis is None or apis[0] is not client:
            apis = self._apis = (client, k8s.CustomObjectsApi(client), k8s.CoreV1Api(client))
        return apis[1], apis[2]

    @property
    def custom(self) -> k8s.CustomObjectsApi:
        """``CustomObjectsApi`` on :attr:`client`."""
        return self._api()[0]

    @property
    def core(self) -> k8s.CoreV1Api:
        """``CoreV1Api`` on :attr:`client`."""
        return self._api()[1]

    # -- own writes ----------------------------------------------------------------------
    def _wrote(self, proxy: Proxy) -> Proxy:
        if self._record:
            written = getattr(self._local, "written", None)
            if written is None:
                written = self._local.written = []
            written.append(proxy.resource_version)
        return proxy

    def take_written(self) -> list[str]:
        """Return and forget the resourceVersions of the Proxy writes this thread made.

        The task layer publishes them so the watcher can recognise the events its own
        writes cause (resourceVersions are compared for equality only, as the API
        conventions require: they are opaque).  Always empty with ``record_writes=False``.
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

    def list_proxies(self) -> Iterator[Proxy]:
        """Yield every Proxy in every namespace, page by page (:meth:`_list_proxy_dicts`).

        Callers iterate once; whoever needs a list makes one (``list(kube.list_proxies())``).

        Raises (while iterating):
            kubernetes.client.ApiException: a page failed (410 Expired beyond
                :data:`LIST_RESTARTS` restarts included).
            ValueError: an object without ``metadata.name``/``namespace``/``uid``.
        """
        for obj in self._list_proxy_dicts():
            yield Proxy.from_dict(obj)

    def list_proxy_refs(self) -> Iterator[ProxyRef]:
        """Yield the :class:`~app.resources.ProxyRef` (UID, ``status.providerID``) of every Proxy.

        The same paged listing as :meth:`list_proxies` without building a :class:`Proxy` per
        object (about a tenth of the CPU past the JSON parse, and only the references are kept):
        what :mod:`app.proxy.gc` diffs instances against.

        Raises (while iterating):
            kubernetes.client.ApiException: as :meth:`list_proxies`.
            ValueError: an object without ``metadata.uid``.
        """
        for obj in self._list_proxy_dicts():
            yield ProxyRef.from_dict(obj)

    def _list_proxy_dicts(self) -> Iterator[dict]:
        """Yield every Proxy object (as parsed JSON) cluster-wide, each UID once.

        Paged as kube-apiserver serves large lists (API concepts, "Retrieving large results sets
        in chunks"): ``limit`` :data:`LIST_PAGE_SIZE`, then the ``continue`` token of each page;
        every page comes from the first page's snapshot.  Each page is read raw
        (``_preload_content=False``) and parsed with :func:`json.loads`, so no more than one
        page's body is held at a time.  When the token expires (410 Expired: the snapshot was
        compacted away) the listing starts over from a fresh snapshot, at most
        :data:`LIST_RESTARTS` times; objects already yielded are not yielded again (by UID),
        so a caller sees every Proxy of the new snapshot it had not seen, each once.
        """
        seen: set[str] = set()
        restarts = 0
        token: str | None = None
        while True:
            try:
                page = self._proxy_page(token)
            except k8s.ApiException as exc:
                if exc.status == 410 and token and restarts < LIST_RESTARTS:
                    restarts += 1
                    log.info("listing proxies: continue token expired after %d proxies; starting over", len(seen))
                    token = None
                    continue
                raise
            for obj in page.get("items") or ():
                uid = (obj.get("metadata") or {}).get("uid")
                if uid:
                    if uid in seen:
                        continue
                    seen.add(uid)
                yield obj
            del page["items"]  # not held while the next page is read
            token = (page.get("metadata") or {}).get("continue")
            if not token:
                return

    def _proxy_page(self, token: str | None) -> dict:
        """One page of the cluster-wide Proxy listing, parsed from the raw body (no client models)."""
        resp = self.custom.list_cluster_custom_object(
            GROUP, VERSION, PLURAL, limit=LIST_PAGE_SIZE, _continue=token, _preload_content=False,
            _request_timeout=LIST_TIMEOUT)
        try:
            return json.loads(resp.data)
        finally:
            resp.release_conn()

    def _set_finalizers(self, proxy: Proxy, finalizers: list[str]) -> Proxy:
        """Replace ``metadata.finalizers`` by a merge patch carrying ``proxy``'s resourceVersion
        (409 if the object changed meanwhile, 404 if it is gone)."""
        patch = {"metadata": {"finalizers": finalizers, "resourceVersion": proxy.resource_version}}
        obj = self.custom.patch_namespaced_custom_object(GROUP, VERSION, proxy.namespace, PLURAL, proxy.name, patch)
        return self._wrote(Proxy.from_dict(obj))

    def add_finalizer(self, proxy: Proxy) -> Proxy:
        """Ensure :data:`app.resources.FINALIZER` is present; return the (possibly updated) Proxy.

        Raises:
            kubernetes.client.ApiException: 409 (``proxy`` is stale), 404 (gone), others.
        """
        if FINALIZER in proxy.finalizers:
            return proxy
        return self._set_finalizers(proxy, [*proxy.finalizers, FINALIZER])

    def remove_finalizer(self, proxy: Proxy) -> None:
        """Remove our finalizer; a Proxy already gone (404) is fine.

        Raises:
            kubernetes.client.ApiException: 409 (``proxy`` is stale), others but 404.
        """
        if FINALIZER not in proxy.finalizers:
            return
        try:
            self._set_finalizers(proxy, [f for f in proxy.finalizers if f != FINALIZER])
        except k8s.ApiException as exc:
            if exc.status != 404:
                raise

    def patch_status(self, proxy: Proxy, status: dict) -> Proxy:
        """Merge-patch ``status`` through the status subresource; return the updated Proxy.

        The patch carries ``proxy``'s resourceVersion as a precondition: a merge patch replaces
        the whole ``conditions`` list, so a write based on a stale read must fail with 409 and
        be retried, not drop a condition another writer set.  Use :mod:`app.kube.status_writer`
        rather than calling this directly: it decides what is sent and what a 409 means.

        Raises:
            kubernetes.client.ApiException: 409 (stale), 404 (gone), others.
        """
        body = {"metadata": {"resourceVersion": proxy.resource_version}, "status": status}
        obj = self.custom.patch_namespaced_custom_object_status(
            GROUP, VERSION, proxy.namespace, PLURAL, proxy.name, body)
        return self._wrote(Proxy.from_dict(obj))

    # -- Proxies of a ProxyPool -----------------------------------------------------------
    # The pool controller's writes are not recorded for the watcher's own-write de-duplication:
    # the events they cause are meant to reach the dispatcher (a draining mark is copied into the
    # serving view by the refresh that event triggers).
    def list_proxies_in(self, namespace: str) -> list[Proxy]:
        """Return every Proxy of ``namespace`` (one list call)."""
        items = self.custom.list_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL).get("items") or []
        return [Proxy.from_dict(o) for o in items]

    def create_proxy(self, namespace: str, name: str, *, spec: dict, labels: dict[str, str],
                     owners: tuple[OwnerReference, ...] = (), annotations: dict[str, str] | None = None) -> Proxy:
        """Create the Proxy ``namespace/name`` with ``spec``, ``labels`` and ``owners`` (as
        ``metadata.ownerReferences``, Kubernetes "Owners and Dependents": a pool's members carry
        ``controller`` and ``blockOwnerDeletion``).

        Raises:
            kubernetes.client.ApiException: 409 AlreadyExists, 422 (the CRD refused the spec), others.
        """
        meta: dict[str, Any] = {"name": name, "namespace": namespace, "labels": dict(labels)}
        if annotations:
            meta["annotations"] = dict(annotations)
        if owners:
            meta["ownerReferences"] = [_owner_dict(o) for o in owners]
        body = {"apiVersion": f"{GROUP}/{VERSION}", "kind": KIND, "metadata": meta, "spec": dict(spec)}
        return Proxy.from_dict(self.custom.create_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, body))

    def annotate_proxy(self, proxy: Proxy, annotations: dict[str, str | None]) -> Proxy:
        """Merge-patch ``metadata.annotations`` (a ``None`` value removes the key) with ``proxy``'s
        resourceVersion as a precondition.

        Raises:
            kubernetes.client.ApiException: 409 (``proxy`` is stale), 404 (gone), others.
        """
        patch = {"metadata": {"annotations": dict(annotations), "resourceVersion": proxy.resource_version}}
        return Proxy.from_dict(self.custom.patch_namespaced_custom_object(
            GROUP, VERSION, proxy.namespace, PLURAL, proxy.name, patch))

    def release_proxy(self, proxy: Proxy, owner_uid: str, *,
                      annotations: dict[str, str | None] | None = None) -> Proxy:
        """Release ``proxy`` from its owner ``owner_uid``: remove that ``metadata.ownerReferences``
        entry and keep the others (what Kubernetes' ``PodControllerRefManager.ReleasePod`` does
        to a Pod whose labels left its ReplicaSet's selector).

        A merge patch replaces the whole list (RFC 7386), so the patch carries the list computed
        from ``proxy`` (``null`` when none is left) with ``proxy``'s resourceVersion as a
        precondition: a concurrent change of the list (or of anything else) fails with 409
        instead of being overwritten, and the caller decides again from a fresh read.  The
        Proxy's UID goes in the patch too, as upstream's release patch carries it: an object
        re-created under the same name is never released by mistake (its resourceVersion
        differs already; kube-apiserver also refuses a changed UID, 422).  ``annotations`` are
        merged in the same write (a ``None`` value removes the key).

        Raises:
            kubernetes.client.ApiException: 409 (``proxy`` is stale), 404 (gone), others.
        """
        refs = [r for r in (proxy.raw.get("metadata") or {}).get("ownerReferences") or ()
                if not (isinstance(r, dict) and r.get("uid") == owner_uid)]
        meta: dict[str, Any] = {"ownerReferences": refs or None, "resourceVersion": proxy.resource_version,
                                "uid": proxy.uid}
        if annotations:
            meta["annotations"] = dict(annotations)
        return Proxy.from_dict(self.custom.patch_namespaced_custom_object(
            GROUP, VERSION, proxy.namespace, PLURAL, proxy.name, {"metadata": meta}))

    def delete_proxy(self, namespace: str, name: str, uid: str) -> bool:
        """Delete Proxy ``namespace/name`` only while it is the object ``uid`` (a UID
        precondition: a Proxy re-created under the same name is left alone).  Its finalizer
        then has the operator delete its instance.

        Returns:
            ``False`` when it did not exist (404).
        Raises:
            kubernetes.client.ApiException: 409 (another object of that name now), others.
        """
        body = k8s.V1DeleteOptions(preconditions=k8s.V1Preconditions(uid=uid))
        try:
            self.custom.delete_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, name, body=body)
        except k8s.ApiException as exc:
            if exc.status == 404:
                return False
            raise
        return True

    # -- ProxyPool objects ---------------------------------------------------------------
    def get_pool(self, namespace: str, name: str) -> Pool | None:
        """Return the ProxyPool ``namespace/name``, or ``None`` when it does not exist (404)."""
        try:
            obj = self.custom.get_namespaced_custom_object(GROUP, VERSION, namespace, POOL_PLURAL, name)
        except k8s.ApiException as exc:
            if exc.status == 404:
                return None
            raise
        return Pool.from_dict(obj)

    def list_pools(self) -> list[Pool]:
        """Return every ProxyPool in every namespace (one list call, cluster scope)."""
        items = self.custom.list_cluster_custom_object(GROUP, VERSION, POOL_PLURAL).get("items") or []
        return [Pool.from_dict(o) for o in items]

    def patch_pool_status(self, pool: Pool, status: dict) -> Pool:
        """Merge-patch ``status`` of ``pool`` through the status subresource; return the pool as
        written.

        No resourceVersion precondition: the controller is the pool status's only writer and runs
        one pass per pool at a time (a per-pool lock), and the autoscaler's write of
        ``spec.replicas`` in the same pass changes the resourceVersion.  Use
        :func:`app.kube.status_writer.write_pool`, which sends only what changed.

        Raises:
            kubernetes.client.ApiException: 404 (gone), others.
        """
        obj = self.custom.patch_namespaced_custom_object_status(
            GROUP, VERSION, pool.namespace, POOL_PLURAL, pool.name, {"status": status})
        return Pool.from_dict(obj)

    def scale_pool(self, pool: Pool, replicas: int) -> None:
        """Set ``spec.replicas`` of ``pool`` through its scale subresource (what ``kubectl scale``
        and the HPA write).

        Raises:
            kubernetes.client.ApiException: 404 (gone), others.
        """
        self.custom.patch_namespaced_custom_object_scale(
            GROUP, VERSION, pool.namespace, POOL_PLURAL, pool.name, {"spec": {"replicas": int(replicas)}})

    def record_pool_event(self, pool: Pool, event_type: str, reason: str, *, message: str) -> None:
        """Create a core/v1 Event about ``pool`` (best effort: failures are logged, not raised).

        Args:
            event_type: ``"Normal"`` or ``"Warning"``.
            reason: CamelCase reason (``"MemberCreated"``, ``"MemberDraining"``, ``"MemberDeleted"``).
            message: human-readable (member names, counts; never a spec), cut at 1024 characters.
        """
        now = datetime.now(timezone.utc)
        body = k8s.CoreV1Event(
            metadata=k8s.V1ObjectMeta(generate_name=f"{pool.name}.", namespace=pool.namespace),
            involved_object=k8s.V1ObjectReference(
                api_version=f"{GROUP}/{VERSION}", kind=POOL_KIND, name=pool.name,
                namespace=pool.namespace, uid=pool.uid, resource_version=pool.resource_version),
            reason=reason, message=message[:1024], type=event_type,
            first_timestamp=now, last_timestamp=now, count=1,
            source=k8s.V1EventSource(component="proxy-operator"),
            reporting_component="proxy-operator", reporting_instance=os.environ.get("HOSTNAME", "proxy-operator"),
        )
        try:
            self.core.create_namespaced_event(pool.namespace, body)
        except Exception as exc:  # noqa: BLE001 - events are best effort by design
            log.warning("event not recorded for pool %s: %s %s", pool.key, reason, exc)

    # -- Secrets -------------------------------------------------------------------------
    def read_secret(self, namespace: str, name: str) -> Secret | None:
        """Return Secret ``namespace/name`` with ``data`` decoded, or ``None`` when it does not exist.

        The values are user data: never log them.
        """
        try:
            obj = self.core.read_namespaced_secret(name, namespace)
        except k8s.ApiException as exc:
            if exc.status == 404:
                return None
            raise
        meta = obj.metadata
        owners = tuple(OwnerReference(api_version=o.api_version, kind=o.kind, name=o.name, uid=o.uid,
                                      controller=bool(o.controller), block_owner_deletion=bool(o.block_owner_deletion))
                       for o in (meta.owner_references or ()))
        return Secret(namespace=meta.namespace or namespace, name=meta.name or name,
                      data={k: base64.b64decode(v) for k, v in (obj.data or {}).items()},
                      labels=dict(meta.labels or {}), owners=owners, type=obj.type or "Opaque")

    def create_secret(self, secret: Secret) -> None:
        """Create ``secret`` (its data base64-encoded on the wire).

        Raises:
            kubernetes.client.ApiException: 409 AlreadyExists, others.
        """
        body = {
            "apiVersion": "v1", "kind": "Secret", "type": secret.type,
            "metadata": {"name": secret.name, "namespace": secret.namespace, "labels": dict(secret.labels)},
            "data": {k: base64.b64encode(v).decode() for k, v in secret.data.items()},
        }
        if secret.owners:
            body["metadata"]["ownerReferences"] = [{
                "apiVersion": o.api_version, "kind": o.kind, "name": o.name, "uid": o.uid,
                "controller": o.controller, "blockOwnerDeletion": o.block_owner_deletion} for o in secret.owners]
        self.core.create_namespaced_secret(secret.namespace, body)

    def delete_secret(self, namespace: str, name: str) -> bool:
        """Delete Secret ``namespace/name``; ``False`` when it did not exist (404)."""
        try:
            self.core.delete_namespaced_secret(name, namespace)
        except k8s.ApiException as exc:
            if exc.status == 404:
                return False
            raise
        return True

    # -- Events --------------------------------------------------------------------------
    def record_event(self, proxy: Proxy, event_type: str, reason: str, *, message: str) -> None:
        """Create a core/v1 Event about ``proxy`` (best effort: failures are logged, not raised).

        Args:
            event_type: ``"Normal"`` or ``"Warning"``.
            reason: CamelCase reason (e.g. ``"Provisioning"``).
            message: human-readable, never secrets (cut at 1024 characters).
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

    # -- ProviderHealth objects ----------------------------------------------------------
    def get_provider_health(self, name: str) -> ProviderHealthObject | None:
        """Return the ProviderHealth ``name``, or ``None`` when it does not exist (404)."""
        try:
            obj = self.custom.get_cluster_custom_object(GROUP, VERSION, PROVIDER_HEALTH_PLURAL, name)
        except k8s.ApiException as exc:
            if exc.status == 404:
                return None
            raise
        return ProviderHealthObject.from_dict(obj)

    def create_provider_health(self, name: str, labels: dict[str, str]) -> ProviderHealthObject:
        """Create an empty ProviderHealth ``name`` carrying ``labels``.

        Raises:
            kubernetes.client.ApiException: 409 AlreadyExists, others.
        """
        body = {"apiVersion": f"{GROUP}/{VERSION}", "kind": PROVIDER_HEALTH_KIND,
                "metadata": {"name": name, "labels": dict(labels)}}
        return ProviderHealthObject.from_dict(
            self.custom.create_cluster_custom_object(GROUP, VERSION, PROVIDER_HEALTH_PLURAL, body))

    def patch_provider_health_status(self, name: str, status: dict) -> ProviderHealthObject:
        """Merge-patch ``status`` of ProviderHealth ``name`` through the status subresource.

        No resourceVersion precondition: every writer publishes the whole snapshot it read from
        Redis (:mod:`app.providers.checks`), so the last write is as good as any.

        Raises:
            kubernetes.client.ApiException: 404 (gone), others.
        """
        return ProviderHealthObject.from_dict(self.custom.patch_cluster_custom_object_status(
            GROUP, VERSION, PROVIDER_HEALTH_PLURAL, name, {"status": status}))

    def list_provider_health(self, label_selector: str | None = None) -> list[ProviderHealthObject]:
        """Return every ProviderHealth (those matching ``label_selector`` when given)."""
        kwargs = {"label_selector": label_selector} if label_selector else {}
        listed = self.custom.list_cluster_custom_object(GROUP, VERSION, PROVIDER_HEALTH_PLURAL, **kwargs)
        return [ProviderHealthObject.from_dict(o) for o in listed.get("items") or ()]

    def delete_provider_health(self, name: str) -> bool:
        """Delete the ProviderHealth ``name``; ``False`` when it did not exist (404)."""
        try:
            self.custom.delete_cluster_custom_object(GROUP, VERSION, PROVIDER_HEALTH_PLURAL, name)
        except k8s.ApiException as exc:
            if exc.status == 404:
                return False
            raise
        return True


def _owner_dict(o: OwnerReference) -> dict:
    """An :class:`OwnerReference` as ``metadata.ownerReferences`` holds it."""
    return {"apiVersion": o.api_version, "kind": o.kind, "name": o.name, "uid": o.uid,
            "controller": o.controller, "blockOwnerDeletion": o.block_owner_deletion}


__all__ = ["KubeGateway", "KubernetesGateway", "OwnerReference", "ProviderHealthObject", "Secret",
           "api_client", "load_configuration"]
