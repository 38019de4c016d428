"""An HTTP fake of the Kubernetes API server: the dev cluster's API and the tests'.

The real ``kubernetes`` client talks to this fake, which
behaves like the server wherever the operator depends on it: resourceVersion and 409
conflicts, generation bumps on spec changes, the status subresource, finalizers and
deletionTimestamp, merge and JSON patches, label and field selectors, list+watch from a
resourceVersion, bookmarks, server-side watch timeouts and 410 Gone, the ``scale`` subresource
(ProxyPools), and the cluster's garbage collector (:mod:`devcluster.apiserver.gc`: deletion
propagation by ``ownerReferences``, Background, Foreground and Orphan).

Typical use::

    with FakeKube() as kube:
        api = kubernetes.client.CustomObjectsApi(kube.api_client())
        ...
        kube.write_kubeconfig(path)  # for subprocesses using app.kube.gateway.api_client()

Test hooks: :meth:`FakeKube.compact` (force 410), :meth:`FakeKube.hang_watches` (a stream
that stops answering), :meth:`FakeKube.fail_next` (scripted errors), :meth:`FakeKube.delay_next` (a request in flight),
:meth:`FakeKube.request_count`, :meth:`FakeKube.set_admission` (CRD validation/defaulting),
``FakeKube.store.seed`` (store many objects at once before serving, for benchmarks),
``FakeKube.gc`` (``pause()`` / ``resume()`` / ``collect()``; ``FakeKube(garbage_collector=False)``
runs none).
The test suite's fixtures over it live in ``tests/support/kube_fixtures.py``; docs/devcluster.md
describes what it simulates and what it does not.
"""

from devcluster.apiserver.errors import ApiError, Invalid
from devcluster.apiserver.gc import GarbageCollector
from devcluster.apiserver.resources import (CORE_EVENTS, DEFAULT_TYPES, EVENTS, LEASES, NAMESPACES, PODS,
                                      PROVIDER_HEALTHS, PROXIES, PROXY_POOLS, SECRETS, ResourceType,
                                      ScaleSubresource)
from devcluster.apiserver.server import FakeKube, write_kubeconfig
from devcluster.apiserver.store import ADDED, DELETED, MODIFIED, Event, Store, Subscription

__all__ = [
    "ADDED", "CORE_EVENTS", "DEFAULT_TYPES", "DELETED", "EVENTS", "LEASES", "MODIFIED", "NAMESPACES",
    "PODS", "PROVIDER_HEALTHS", "PROXIES", "PROXY_POOLS", "SECRETS", "ApiError", "Event", "FakeKube",
    "GarbageCollector", "Invalid", "ResourceType", "ScaleSubresource", "Store", "Subscription", "write_kubeconfig",
]
