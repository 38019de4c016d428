"""The gcp block of the providers config: defaults, and every rejection naming file, provider and field."""

from __future__ import annotations

import pytest

from app.wiring import parse_config as parse
from app.providers.gcp.config import DEFAULT_IMAGE, GcpSettings
from app.config.validation import ConfigError


def _parse(gcp):
    return parse({"providers": [{"name": "gcp-eu", "type": "gcp", "gcp": gcp}]}, "providers.yaml")


def test_minimal_block_gets_documented_defaults():
    s = _parse({"project": "demo-project", "zones": ["europe-west1-b"]}).providers[0].settings
    assert isinstance(s, GcpSettings)
    assert s.project == "demo-project"
    assert s.zones == ("europe-west1-b",)
    assert s.allowed_images() == (DEFAULT_IMAGE,) and s.allowed_machine_types() == ("e2-micro",)
    assert s.machine_type == "e2-micro"
    assert s.image == DEFAULT_IMAGE
    assert s.network == "default" and s.subnetwork is None
    assert s.network_tags == ("proxy-operator",)
    assert s.external_ip is True
    assert s.credentials_file is None and s.anonymous is False and s.api_endpoint is None
    assert s.firewall.ensure is False and s.wire_logging.enabled is False
    assert s.request_timeout == 30.0 and s.operation_timeout == 300.0


def test_full_block_is_read():
    s = _parse({
        "project": "demo-project", "zones": ["europe-west1-b", "europe-west1-c"],
        "machineType": "e2-small", "image": "projects/debian-cloud/global/images/family/debian-12",
        "network": "proxies", "subnetwork": "proxies-eu", "networkTags": ["squid", "proxy"],
        "externalIP": False, "serviceAccount": "vm@demo-project.iam.gserviceaccount.com",
        "credentialsFile": "/var/run/secrets/gcp/key.json", "apiEndpoint": "https://compute.example.internal/",
        "requestTimeout": "10s", "operationTimeout": "2m",
        "firewall": {"ensure": True, "sourceRanges": ["10.0.0.0/8", "192.0.2.0/24"], "name": "squid-in"},
        "wireLogging": {"enabled": True, "fullPayloads": True},
    }).providers[0].settings
    assert s.zones == ("europe-west1-b", "europe-west1-c")
    assert s.network_tags == ("squid", "proxy")
    assert s.api_endpoint == "https://compute.example.internal"
    assert s.request_timeout == 10.0 and s.operation_timeout == 120.0
    assert s.firewall.ensure and s.firewall.source_ranges == ("10.0.0.0/8", "192.0.2.0/24")
    assert s.firewall.name == "squid-in"
    assert s.wire_logging.enabled and s.wire_logging.full_payloads


@pytest.mark.parametrize("gcp, field, problem", [
    ({}, "gcp.project", "required"),
    ({"project": "Demo/Project"}, "gcp.project", "not a GCP project ID"),
    ({"project": "demo-project", "zones": ["europe-west1-b", "eu/west"]}, "gcp.zones[1]", "RFC 1035"),
    ({"project": "demo-project", "networkTags": ["Squid"]}, "gcp.networkTags[0]", "RFC 1035"),
    ({"project": "demo-project", "anonymous": True}, "gcp.anonymous", "only allowed together with apiEndpoint"),
    ({"project": "demo-project", "anonymous": True, "apiEndpoint": "http://127.0.0.1:1",
      "credentialsFile": "/k.json"}, "gcp.anonymous", "cannot be combined"),
    ({"project": "demo-project", "apiEndpoint": "compute.googleapis.com"}, "gcp.apiEndpoint", "must be a URL"),
    ({"project": "demo-project", "apiEndpoint": "https://h/compute/v1"}, "gcp.apiEndpoint", "no path"),
    ({"project": "demo-project", "firewall": {"ensure": True}}, "gcp.firewall.sourceRanges", "required when ensure"),
    ({"project": "demo-project", "firewall": {"sourceRanges": ["10.0.0.0/8", "10.0.0/33"]}},
     "gcp.firewall.sourceRanges[1]", "not a CIDR"),
    ({"project": "demo-project", "firewall": {"ensure": True, "sourceRanges": ["10.0.0.0/8"], "port": 3128}},
     "gcp.firewall.port", "unknown key"),
    ({"project": "demo-project", "networkTags": [], "firewall": {"ensure": True, "sourceRanges": ["10.0.0.0/8"]}},
     "gcp.networkTags", "at least one network tag"),
    ({"project": "demo-project", "wireLogging": {"enabled": "yes"}}, "gcp.wireLogging.enabled", "true or false"),
    ({"project": "demo-project", "wireLogging": {"full": True}}, "gcp.wireLogging.full", "unknown key"),
    ({"project": "demo-project", "requestTimeout": "0"}, "gcp.requestTimeout", "greater than 0"),
    ({"project": "demo-project", "serviceAccount": "nobody"}, "gcp.serviceAccount", "e-mail"),
    ({"project": "demo-project", "serviceAccountScopes": ["logging.write"]}, "gcp.serviceAccountScopes",
     "needs serviceAccount"),
    ({"project": "demo-project", "serviceAccount": "vm@demo-project.iam.gserviceaccount.com",
      "serviceAccountScopes": ["logging write"]}, "gcp.serviceAccountScopes[0]", "not an OAuth scope"),
    ({"project": "demo-project", "machineType": "e2 micro"}, "gcp.machineType", "resource name"),
    ({"project": "demo-project", "zone": "europe-west1-b"}, "gcp.zone", "unknown key"),
    ({"project": "demo-project", "zones": None}, "gcp.zones", "required"),
    ({"project": "demo-project", "zones": []}, "gcp.zones", "at least one zone"),
    ({"project": "demo-project", "images": ["projects/p/global/images/ok", "bad image"]}, "gcp.images[1]",
     "resource name"),
    ({"project": "demo-project", "images": "projects/p/global/images/ok"}, "gcp.images", "must be a list"),
    ({"project": "demo-project", "machineTypes": ["e2-small", "e2 'x'"]}, "gcp.machineTypes[1]", "resource name"),
])
def test_bad_block_is_rejected_naming_file_provider_and_field(gcp, field, problem):
    if "project" in gcp and "zones" not in gcp:
        gcp = {**gcp, "zones": ["europe-west1-b"]}  # required; the case is about another field
    with pytest.raises(ConfigError) as info:
        _parse({k: v for k, v in gcp.items() if v is not None})
    err = info.value
    assert (err.file, err.provider, err.field) == ("providers.yaml", "gcp-eu", field)
    assert problem in err.problem
    assert str(err).startswith(f'providers.yaml: provider "gcp-eu": {field}: ')


def test_the_gcp_sample_is_a_valid_config():
    from pathlib import Path

    from app.wiring import load_config as load

    cfg = load(Path(__file__).resolve().parents[2] / "deploy" / "samples" / "providers_gcp.yaml")
    s = cfg.get("gcp-eu").settings
    assert s.firewall.ensure and s.firewall.source_ranges == ("10.0.0.0/8",)
    assert len(s.zones) == 3 and s.credentials_file == "/var/run/secrets/gcp/key.json"
