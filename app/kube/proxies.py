"""Proxy objects (crawl.example.com/v1alpha1, namespaced) through the gateway.

Reads (one, all cluster-wide page by page, the Proxies of a namespace), the finalizer, the
status subresource, and the writes a ProxyPool makes on its members (create with an
ownerReference, annotate, release, delete).  Writes carry the ``resourceVersion`` they were
computed from, so a concurrent writer gets 409 Conflict instead of a lost update; the
reconciler's own writes are remembered per thread for the watcher (:meth:`KubernetesProxies.take_written`).
"""

from __future__ import annotations

import json
import logging
import threading
from typing import Any, Iterator, Protocol

from kubernetes import client as k8s

from app.kube.client import ApiGroups, existed, or_none, reply
from app.kube.owners import OwnerReference
from app.resources import FINALIZER, GROUP, KIND, PLURAL, VERSION, Proxy, ProxyRef

log = logging.getLogger(__name__)

#: ``limit`` of each page of the cluster-wide Proxy listings (:meth:`KubernetesProxies.list_proxies`,
#: :meth:`KubernetesProxies.list_proxy_refs`; API concepts, "Retrieving large results sets in chunks").
LIST_PAGE_SIZE = 500
#: Times a Proxy listing starts over when its continue token expires (410 Expired) mid-way.
LIST_RESTARTS = 2
#: (connect, read) timeout of one page of a Proxy listing, seconds.
LIST_TIMEOUT = (10, 60)


class ProxyApi(Protocol):
    """The gateway's Proxy objects: the reconciler's reads and writes and a pool's members."""

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


class KubernetesProxies(ApiGroups):
    """:class:`ProxyApi` over the ``kubernetes`` client (a part of :class:`app.kube.gateway.KubernetesGateway`).

    Args:
        client: as :class:`app.kube.client.ApiGroups` takes it.
        record_writes: remember the resourceVersion of every finalizer and status write per
            thread, for :meth:`take_written`.  Off for a writer nobody takes them from.
    """

    def __init__(self, client: k8s.ApiClient | None = None, *, record_writes: bool = True) -> None:
        super().__init__(client)
        self._record = record_writes
        self._local = threading.local()

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
        writes cause (resourceVersions are compared for equality only: they are opaque).

        Returns:
            the resourceVersions, oldest first; always empty with ``record_writes=False``.
        """
        written = getattr(self._local, "written", None) or []
        self._local.written = []
        return written

    # -- reads -----------------------------------------------------------------------------
    def get_proxy(self, namespace: str, name: str) -> Proxy | None:
        """Return the Proxy ``namespace/name``, or ``None`` when it does not exist (404).

        Raises:
            kubernetes.client.ApiException: any status but 404.
        """
        obj = self.read_namespaced(PLURAL, namespace, name)
        return None if obj is None else Proxy.from_dict(obj)

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
        object: what :mod:`app.proxy.gc` diffs instances against.

        Raises (while iterating):
            kubernetes.client.ApiException: as :meth:`list_proxies`.
            ValueError: an object without ``metadata.uid``.
        """
        for obj in self._list_proxy_dicts():
            yield ProxyRef.from_dict(obj)

    def _list_proxy_dicts(self) -> Iterator[dict]:
        """Yield every Proxy object (as parsed JSON) cluster-wide, each UID once.

        Paged (``limit`` :data:`LIST_PAGE_SIZE`, then each page's ``continue`` token), one page
        held at a time.  When the token expires (410 Expired) the listing starts over from a
        fresh snapshot, at most :data:`LIST_RESTARTS` times, skipping the UIDs already yielded.
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
        resp: Any = self.custom.list_cluster_custom_object(
            GROUP, VERSION, PLURAL, limit=LIST_PAGE_SIZE, _continue=token, _preload_content=False,
            _request_timeout=LIST_TIMEOUT)
        try:
            return json.loads(resp.data)
        finally:
            resp.release_conn()

    def list_proxies_in(self, namespace: str) -> list[Proxy]:
        """Return every Proxy of ``namespace`` (one list call).

        Raises:
            kubernetes.client.ApiException: the list failed.
        """
        items = reply(self.custom.list_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL)).get("items") or []
        return [Proxy.from_dict(o) for o in items]

    # -- the reconciler's writes (recorded for the watcher) ---------------------------------
    def _patch(self, proxy: Proxy, patch: dict) -> Proxy:
        """Merge-patch ``proxy`` (not its status); the Proxy as written."""
        return Proxy.from_dict(reply(self.custom.patch_namespaced_custom_object(
            GROUP, VERSION, proxy.namespace, PLURAL, proxy.name, patch)))

    def _set_finalizers(self, proxy: Proxy, finalizers: list[str]) -> Proxy:
        """Replace ``metadata.finalizers`` by a merge patch carrying ``proxy``'s resourceVersion
        (409 if the object changed meanwhile, 404 if it is gone)."""
        patch = {"metadata": {"finalizers": finalizers, "resourceVersion": proxy.resource_version}}
        return self._wrote(self._patch(proxy, patch))

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
        or_none(self._set_finalizers, proxy, [f for f in proxy.finalizers if f != FINALIZER])

    def patch_status(self, proxy: Proxy, status: dict) -> Proxy:
        """Merge-patch ``status`` through the status subresource; return the updated Proxy.

        The patch carries ``proxy``'s resourceVersion as a precondition: a merge patch replaces
        the whole ``conditions`` list, so a write based on a stale read must fail with 409.  Use
        :mod:`app.kube.status_writer`, which decides what is sent and what a 409 means.

        Raises:
            kubernetes.client.ApiException: 409 (stale), 404 (gone), others.
        """
        body = {"metadata": {"resourceVersion": proxy.resource_version}, "status": status}
        obj = self.custom.patch_namespaced_custom_object_status(
            GROUP, VERSION, proxy.namespace, PLURAL, proxy.name, body)
        return self._wrote(Proxy.from_dict(reply(obj)))

    # -- a pool's writes on its members (not recorded: their events must reach the dispatcher)
    def create_proxy(self, namespace: str, name: str, *, spec: dict, labels: dict[str, str],
                     owners: tuple[OwnerReference, ...] = (), annotations: dict[str, str] | None = None) -> Proxy:
        """Create the Proxy ``namespace/name`` with ``spec``, ``labels`` and ``owners`` (as
        ``metadata.ownerReferences``: a pool's members carry ``controller`` and ``blockOwnerDeletion``).

        Raises:
            kubernetes.client.ApiException: 409 AlreadyExists, 422 (the CRD refused the spec), others.
        """
        meta: dict[str, Any] = {"name": name, "namespace": namespace, "labels": dict(labels)}
        if annotations:
            meta["annotations"] = dict(annotations)
        if owners:
            meta["ownerReferences"] = [o.to_dict() for o in owners]
        body = {"apiVersion": f"{GROUP}/{VERSION}", "kind": KIND, "metadata": meta, "spec": dict(spec)}
        return Proxy.from_dict(reply(self.custom.create_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL,
                                                                                 body)))

    def annotate_proxy(self, proxy: Proxy, annotations: dict[str, str | None]) -> Proxy:
        """Merge-patch ``metadata.annotations`` (a ``None`` value removes the key) with ``proxy``'s
        resourceVersion as a precondition.

        Raises:
            kubernetes.client.ApiException: 409 (``proxy`` is stale), 404 (gone), others.
        """
        return self._patch(proxy, {"metadata": {"annotations": dict(annotations),
                                                "resourceVersion": proxy.resource_version}})

    def release_proxy(self, proxy: Proxy, owner_uid: str, *,
                      annotations: dict[str, str | None] | None = None) -> Proxy:
        """Release ``proxy`` from its owner ``owner_uid``: remove that ``metadata.ownerReferences``
        entry and keep the others (as Kubernetes' ``PodControllerRefManager.ReleasePod`` does).

        The patch carries the whole list computed from ``proxy`` (``null`` when none is left:
        a merge patch replaces lists), ``proxy``'s resourceVersion and its UID as preconditions,
        and ``annotations`` (a ``None`` value removes the key).

        Raises:
            kubernetes.client.ApiException: 409 (``proxy`` is stale), 404 (gone), others.
        """
        refs = [r for r in (proxy.raw.get("metadata") or {}).get("ownerReferences") or ()
                if not (isinstance(r, dict) and r.get("uid") == owner_uid)]
        meta: dict[str, Any] = {"ownerReferences": refs or None, "resourceVersion": proxy.resource_version,
                                "uid": proxy.uid}
        if annotations:
            meta["annotations"] = dict(annotations)
        return self._patch(proxy, {"metadata": meta})

    def delete_proxy(self, namespace: str, name: str, uid: str) -> bool:
        """Delete Proxy ``namespace/name`` only while it is the object ``uid`` (a UID
        precondition: a Proxy re-created under the same name is left alone).

        Returns:
            ``False`` when it did not exist (404).
        Raises:
            kubernetes.client.ApiException: 409 (another object of that name now), others.
        """
        body = k8s.V1DeleteOptions(preconditions=k8s.V1Preconditions(uid=uid))
        return existed(self.custom.delete_namespaced_custom_object, GROUP, VERSION, namespace, PLURAL, name, body=body)


__all__ = ["LIST_PAGE_SIZE", "LIST_RESTARTS", "LIST_TIMEOUT", "KubernetesProxies", "ProxyApi"]
