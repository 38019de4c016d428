"""pytest fixtures over the dev cluster's Kubernetes API fake (:mod:`devcluster.apiserver`).

Enable them with ``pytest_plugins = ["tests.support.kube_fixtures"]`` in a conftest, or import
the fixture names into a test module.

* ``kube`` — a started :class:`devcluster.apiserver.FakeKube` (bookmarks every 0.2 s; its garbage
  collector runs, ``kube.gc``: pause it for objects whose owners must look absent for a while).
* ``kube_client`` — a :class:`kubernetes.client.ApiClient` for it.
* ``kubeconfig`` — path of a kubeconfig for it, also exported as ``KUBECONFIG`` for the test
  (so :func:`app.kube.gateway.api_client` in this process and in subprocesses reaches the fake).
* ``fake`` / ``api`` — the same ``kube`` / ``kube_client`` under the names most test modules
  use (one fake per test whichever names it is asked by).
* ``custom_api`` — a :class:`kubernetes.client.CustomObjectsApi` on ``kube_client`` (the
  watcher tests create and patch Proxies with it).

A module or area that needs something else under one of these names (``tests/gcp``'s
``fake`` is the Compute Engine fake) overrides it in its own conftest or module.
"""

from __future__ import annotations

import pytest
from kubernetes import client as k8s

from devcluster.apiserver.server import FakeKube


@pytest.fixture
def kube(request):
    """A started FakeKube, closed after the test, admitting Proxies and ProxyPools as the real
    server does with deploy/crd installed (schema, defaults and every CEL rule: a change of
    the immutable ``spec.provider`` is refused with 422 here too; devcluster/cluster.py).

    A test marked ``no_crd_admission`` (with its reason) gets a fake without the CRDs' rules:
    for the fake's own generic write semantics, or to pin what the operator does with an object
    the CRD would have refused (defence in depth).
    """
    from devcluster.cluster import pool_admission, proxy_admission

    fake = FakeKube(bookmark_interval=0.2).start()
    if request.node.get_closest_marker("no_crd_admission") is None:
        fake.set_admission("proxies", proxy_admission())
        fake.set_admission("proxypools", pool_admission())
    try:
        yield fake
    finally:
        fake.close()


@pytest.fixture
def kube_client(kube):
    """An ApiClient bound to ``kube``."""
    client = kube.api_client()
    try:
        yield client
    finally:
        client.close()


@pytest.fixture
def kubeconfig(kube, tmp_path, monkeypatch):
    """A kubeconfig file for ``kube``; ``KUBECONFIG`` points at it during the test."""
    path = kube.write_kubeconfig(str(tmp_path / "kubeconfig"))
    monkeypatch.setenv("KUBECONFIG", path)
    return path


@pytest.fixture
def fake(kube):
    """The test's API fake: the same object as ``kube``."""
    return kube


@pytest.fixture
def api(kube_client):
    """An ApiClient bound to the test's API fake: the same object as ``kube_client``."""
    return kube_client


@pytest.fixture
def custom_api(kube_client):
    """A CustomObjectsApi on ``kube_client`` (Proxies are custom objects)."""
    return k8s.CustomObjectsApi(kube_client)
