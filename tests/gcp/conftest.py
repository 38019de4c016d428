"""Fixtures of the gcp provider tests: the Compute REST fake, providers built from config,
and a socket-level guard proving no request leaves loopback."""

from __future__ import annotations

from typing import Any, Callable

import pytest

from app.config.providers import ProviderConfig
from app.wiring import parse_config as parse
from tests.gcp.fake_compute import FakeCompute
from tests.support.netguard import loopback_only  # noqa: F401 - an autouse fixture of this area


# -- the fake and providers ------------------------------------------------------------
@pytest.fixture()
def fake(compute):
    """The test's :class:`FakeCompute` (page size 2, operations done after one poll): ``compute``
    from tests/conftest.py under the name the gcp tests use."""
    return compute


PROJECT = "demo-project"
ZONES = ["europe-west1-b", "europe-west1-c", "europe-west1-d"]


def gcp_config(fake: FakeCompute, name: str = "gcp-test", **block: Any) -> ProviderConfig:
    """Build a gcp :class:`ProviderConfig` through the real config parser, pointed at ``fake``."""
    gcp: dict[str, Any] = {"project": PROJECT, "zones": list(ZONES), "apiEndpoint": fake.url,
                           "anonymous": True, "requestTimeout": "5s", "operationTimeout": "10s"}
    gcp.update(block)
    gcp = {k: v for k, v in gcp.items() if v is not None}
    cfg = parse({"providers": [{"name": name, "type": "gcp", "checkTimeout": "5s", "gcp": gcp}]},
                "providers-test.yaml")
    return cfg.providers[0]


@pytest.fixture()
def make_provider(fake) -> Callable[..., Any]:
    """``make_provider(**gcp_block_overrides)`` -> a :class:`GcpProvider` against ``fake``."""
    from app.providers.gcp.provider import GcpProvider

    def build(**block: Any) -> GcpProvider:
        return GcpProvider(gcp_config(fake, **block))

    return build


@pytest.fixture()
def provider(make_provider):
    """A :class:`GcpProvider` with anonymous credentials against the fake."""
    return make_provider()


def write_service_account_key(path, fake: FakeCompute) -> str:
    """Write a service-account key file whose token endpoint is ``fake`` (``POST /token``).

    google-auth signs a JWT assertion with the generated RSA key and trades it at the fake
    for a ``ya29.`` bearer token, exactly as against oauth2.googleapis.com.

    Returns:
        the key's client e-mail.
    """
    import json

    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import rsa

    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    pem = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                            serialization.NoEncryption()).decode()
    email = f"proxy-operator@{PROJECT}.iam.gserviceaccount.com"
    path.write_text(json.dumps({
        "type": "service_account", "project_id": PROJECT, "private_key_id": "0123456789abcdef",
        "private_key": pem, "client_email": email, "client_id": "1234567890",
        "token_uri": f"{fake.url}/token",
    }))
    return email
