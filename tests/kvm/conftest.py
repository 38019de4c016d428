"""Fixtures for the kvm provider; the rig itself (one real libvirtd + sshd + image server per
session: ``rig``, ``second_daemon``, ``image``) is tests/support/kvm_rig.py's.

Tests reach the daemon only through the provider's SSH path; the harness's own direct socket
is used for nothing but teardown (destroying what a failed test left behind).

Under pytest-xdist every test here is in the ``kvm`` group (``XDIST_GROUPS`` in tests/conftest.py):
they all run in one worker, so a run starts one rig (and boots at most one guest at a time), not
one per worker.
"""

from __future__ import annotations

import uuid

import pytest

from app.providers.naming import instance_name, tags_for
from app.providers.base import CreateRequest
from tests.kvm import harness
from tests.support.kvm_rig import wipe_domains

# ``rig``, ``second_daemon`` and ``image`` come from tests/support/kvm_rig.py (a plugin of
# tests/conftest.py), shared with tests/pools/test_spread_providers.py: one rig per session.


@pytest.fixture
def make_provider(rig):
    """Factory: ``make_provider(entry=None) -> KvmProvider`` from a config entry; closed after the test."""
    from app.providers.kvm.provider import KvmProvider

    made = []

    def make(entry: dict | None = None):
        p = KvmProvider(harness.provider_config(entry or rig.entry()))
        made.append(p)
        return p

    yield make
    for p in made:
        p.close()


@pytest.fixture
def request_for():
    """Factory: ``request_for(zone="h1", **fields) -> CreateRequest`` for a fresh Proxy UID."""
    def make(zone: str | None = "h1", **fields) -> CreateRequest:
        uid = fields.pop("uid", None) or str(uuid.uuid4())
        return CreateRequest(name=instance_name(uid), tags=tags_for(uid), namespace="default", zone=zone, **fields)
    return make


@pytest.fixture(autouse=True)
def _cleanup_domains(request):
    """After each test that used the rig, destroy and undefine every domain it left behind."""
    yield
    if "rig" not in request.fixturenames:
        return
    wipe_domains(request.getfixturevalue("rig").daemon.socket)
