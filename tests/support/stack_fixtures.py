"""pytest fixtures of the tests that run the whole stack (watcher, workers, beat, API) on the dev cluster.

Import the names into a test module (``from tests.support.stack_fixtures import cluster, origin``).

* ``cluster`` — a :class:`devcluster.cluster.FakeCluster` with its kubelet (Squid Pods become real
  Squids), bookmarks every second, closed after the test.
* ``origin`` — the base URL of a local origin (:func:`tests.support.origin.origin_server`).
"""

from __future__ import annotations

import pytest

from devcluster.cluster import FakeCluster
from tests.support.origin import origin_server


@pytest.fixture()
def cluster():
    """A started FakeCluster with its kubelet, closed after the test."""
    with FakeCluster(bookmark_interval=1.0) as c:
        yield c


@pytest.fixture()
def origin():
    """A local origin's base URL (see :func:`tests.support.origin.origin_server`)."""
    with origin_server() as url:
        yield url
