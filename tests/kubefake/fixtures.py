"""pytest fixtures for the Kubernetes API fake.

Enable them with ``pytest_plugins = ["tests.kubefake.fixtures"]`` in a conftest, or import
the fixture names into a test module.

* ``kube`` — a started :class:`tests.kubefake.FakeKube` (bookmarks every 0.2 s).
* ``kube_client`` — a :class:`kubernetes.client.ApiClient` for it.
* ``kubeconfig`` — path of a kubeconfig for it, also exported as ``KUBECONFIG`` for the test
  (so :func:`app.kube.api_client` in this process and in subprocesses reaches the fake).
"""

from __future__ import annotations

import pytest

from tests.kubefake.server import FakeKube


@pytest.fixture
def kube():
    """A started FakeKube, closed after the test."""
    fake = FakeKube(bookmark_interval=0.2).start()
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
