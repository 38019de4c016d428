"""The gcp firewall opt-in opens only the ports the operator lists, never one a Proxy author picks.

With ``gcp.firewall.ensure`` a create ensures an ingress rule to every proxy VM; the port comes
from ``gcp.firewall.ports``, parsed strictly.  The real provider against the Compute fake.
"""

from __future__ import annotations

import pytest

from app.config.validation import ConfigError
from app.errors import SpecNotAllowed
from app.providers.base import CreateRequest
from app.providers.naming import instance_name

pytestmark = pytest.mark.timeout(120)

FIREWALL = {"ensure": True, "sourceRanges": ["0.0.0.0/0"]}


def _gce_request(uid: str, port: int) -> CreateRequest:
    from app.providers.naming import tags_for

    return CreateRequest(name=instance_name(uid), tags=tags_for(uid), namespace="crawl", zone="europe-west1-b",
                         port=port)


def test_a_proxy_author_cannot_open_any_port_on_every_proxy_vm():
    """``spec.endpoint.port`` is the Proxy author's; with ``gcp.firewall.ensure`` every create used
    to ensure an ingress rule for that port from ``sourceRanges`` to *every* instance carrying the
    network tag: ``port: 22`` opened SSH on all proxy VMs, and each new port added one more rule
    (never removed).  Now only ``gcp.firewall.ports`` (default ``[3128]``); anything else is
    refused naming the field, before any call."""
    from app.providers.gcp.provider import GcpProvider
    from tests.gcp.conftest import gcp_config
    from tests.gcp.fake_compute import FakeCompute

    with FakeCompute() as compute:
        provider = GcpProvider(gcp_config(compute, firewall=FIREWALL))
        for port in (22, 10250, 6379):
            with pytest.raises(SpecNotAllowed) as info:
                provider.create(_gce_request(f"uid-port-{port}", port))
            assert info.value.field == "spec.endpoint.port" and "gcp.firewall.ports: 3128" in str(info.value)
        assert compute.requests == [], "nothing reached the API"
        provider.create(_gce_request("uid-port-ok", 3128))
        assert sorted(name for _, name in compute.firewalls) == ["proxy-operator-gcp-test-3128"]

        listed = GcpProvider(gcp_config(compute, name="gcp-listed", firewall=dict(FIREWALL, ports=[3128, 8080])))
        listed.create(_gce_request("uid-port-8080", 8080))
        assert "proxy-operator-gcp-listed-8080" in {name for _, name in compute.firewalls}
        # Without the opt-in the port opens nothing, so it is not restricted.
        GcpProvider(gcp_config(compute, name="gcp-nofw")).create(_gce_request("uid-port-any", 2222))


@pytest.mark.parametrize("ports, field", [([], "ports"), ([0], "ports[0]"), (["22"], "ports[0]"), ([True], "ports[0]"),
                                          (3128, "ports")])
def test_firewall_ports_are_parsed_strictly(ports, field):
    import re

    from tests.gcp.conftest import gcp_config
    from tests.gcp.fake_compute import FakeCompute

    with FakeCompute() as compute, pytest.raises(ConfigError, match=re.escape(f"gcp.firewall.{field}")):
        gcp_config(compute, firewall=dict(FIREWALL, ports=ports))
