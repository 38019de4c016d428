"""Signed image URLs never reach conditions or logs through a fetch error."""

from __future__ import annotations

import pytest

from app.errors import Transient, describe
from app.providers.kvm.config import ImageSettings
from app.providers.kvm.images import _fetch
from devcluster.redis_server import free_port

SECRET = "X-Goog-Signature=topsecret123"


def test_a_failed_fetch_names_the_url_without_its_query_or_userinfo():
    port = free_port()  # nothing listens there: requests raises ConnectionError quoting the URL
    url = f"http://user:pw@127.0.0.1:{port}/img.qcow2?{SECRET}"
    img = ImageSettings(key="debian", url=url, sha256="0" * 64, format="qcow2", firmware="uefi")
    with pytest.raises(Transient) as err:
        _fetch(None, None, "default", "base-debian.qcow2", img, timeout=5)
    text = describe(err.value)
    assert f"127.0.0.1:{port}/img.qcow2" in text and "ConnectionError" in text
    assert "topsecret123" not in text and "pw@" not in text
