"""The gcp provider's lifecycle against the Compute REST fake, through the real SDK client."""

from __future__ import annotations

import re
from datetime import datetime, timezone

import pytest

from app.providers.naming import MANAGED_BY, instance_name, tags_for
from app.providers.base import CreateRequest, InstanceState
from app.errors import NotFound, NotManaged, Permanent, SpecNotAllowed
from app.providers.gcp import ids, startup
from tests.gcp.conftest import PROJECT, ZONES, gcp_config

USER_DATA = b"#cloud-config\npackages: [squid]\nwrite_files:\n  - path: /etc/marker\n    content: user-data-marker-7f3a\n"


def _request(uid: str, **kw) -> CreateRequest:
    kw.setdefault("user_data", USER_DATA)
    return CreateRequest(name=instance_name(uid), tags=tags_for(uid), namespace="crawl", **kw)


def _metadata(body: dict) -> dict[str, str]:
    return {item["key"]: item["value"] for item in body["metadata"]["items"]}


def test_construction_dials_nothing(fake, tmp_path):
    from app.providers.gcp.provider import GcpProvider

    GcpProvider(gcp_config(fake))
    # Even credentials that do not exist yet are only read on first use.
    GcpProvider(gcp_config(fake, anonymous=False, credentialsFile=str(tmp_path / "missing.json")))
    assert fake.requests == []


def test_create_inserts_labels_user_data_machine_type_and_waits(fake, make_provider):
    provider = make_provider(machineTypes=["e2-small"])  # the Proxy asks for it: the config allows it
    req = _request("0b1c2d3e-0000-4000-8000-000000000001", zone="europe-west1-c", machine_type="e2-small",
                   squid_config="http_port 3128\n", auth_htpasswd="crawler:$2b$10$hash")
    inst = provider.create(req)

    inserts = fake.calls("POST", r"/zones/europe-west1-c/instances$")
    assert len(inserts) == 1
    body = inserts[0].body
    assert body["name"] == req.name
    assert body["labels"] == {"managed-by": MANAGED_BY, "proxy-uid": "0b1c2d3e-0000-4000-8000-000000000001"}
    assert _metadata(body)["user-data"] == USER_DATA.decode()
    assert _metadata(body)["squid-conf"] == "http_port 3128\n"
    assert _metadata(body)["squid-htpasswd"] == "crawler:$2b$10$hash"
    # ... and the script that installs both at every boot (tests/gcp/test_startup_script.py runs it).
    assert _metadata(body)["startup-script"] == startup.STARTUP_SCRIPT
    assert body["machineType"] == "zones/europe-west1-c/machineTypes/e2-small"
    assert body["disks"][0]["boot"] and body["disks"][0]["initializeParams"]["sourceImage"] == \
        "projects/debian-cloud/global/images/family/debian-12"
    assert body["tags"]["items"] == ["proxy-operator"]
    nic = body["networkInterfaces"][0]
    assert nic["network"] == f"projects/{PROJECT}/global/networks/default"
    assert nic["accessConfigs"][0]["type"] == "ONE_TO_ONE_NAT"
    assert "serviceAccounts" not in body

    # The zone operation was waited on, at the fake, before create returned.
    [op_name] = [name for name, op in fake.operations.items() if op.body["operationType"] == "insert"]
    waits = fake.calls("POST", rf"/zones/europe-west1-c/operations/{op_name}/wait$")
    assert len(waits) == 1
    assert fake.operations[op_name].body["status"] == "DONE"
    assert fake.requests.index(waits[0]) > fake.requests.index(inserts[0])

    assert inst.provider_id == f"projects/{PROJECT}/zones/europe-west1-c/instances/{req.name}"
    assert inst.name == req.name and inst.zone == "europe-west1-c"
    assert inst.state is InstanceState.RUNNING
    assert inst.address and inst.address in fake.external_addresses
    assert inst.tags == req.tags
    assert inst.created is not None and inst.created.tzinfo == timezone.utc
    assert abs((datetime.now(timezone.utc) - inst.created).total_seconds()) < 120


def test_create_uses_configured_defaults_network_and_service_account(fake, make_provider):
    provider = make_provider(machineType="n2-standard-2", image="projects/p/global/images/img-1",
                             network="proxies", subnetwork="proxies-eu", networkTags=["squid", "egress"],
                             externalIP=False, serviceAccount="vm@demo-project.iam.gserviceaccount.com")
    inst = provider.create(_request("uid-defaults", zone="europe-west1-b", user_data=None))
    body = fake.calls("POST", r"/instances$")[0].body
    assert body["machineType"] == "zones/europe-west1-b/machineTypes/n2-standard-2"
    assert body["disks"][0]["initializeParams"]["sourceImage"] == "projects/p/global/images/img-1"
    nic = body["networkInterfaces"][0]
    assert nic["network"] == f"projects/{PROJECT}/global/networks/proxies"
    assert nic["subnetwork"] == f"projects/{PROJECT}/regions/europe-west1/subnetworks/proxies-eu"
    assert "accessConfigs" not in nic
    assert body["tags"]["items"] == ["squid", "egress"]
    # the narrowest scopes by default: logs and metrics, never cloud-platform
    assert body["serviceAccounts"] == [{"email": "vm@demo-project.iam.gserviceaccount.com",
                                        "scopes": ["https://www.googleapis.com/auth/logging.write",
                                                   "https://www.googleapis.com/auth/monitoring.write"]}]
    assert "user-data" not in {i["key"] for i in body.get("metadata", {}).get("items", [])}
    # No external IP: the internal address is reported.
    assert inst.address and inst.address in fake.internal_addresses


def test_service_account_scopes_are_the_providers_setting(fake, make_provider):
    provider = make_provider(serviceAccount="vm@demo-project.iam.gserviceaccount.com",
                             serviceAccountScopes=["logging.write", "https://www.googleapis.com/auth/trace.append"])
    provider.create(_request("uid-scopes", zone="europe-west1-b", user_data=None))
    body = fake.calls("POST", r"/instances$")[0].body
    assert body["serviceAccounts"][0]["scopes"] == ["https://www.googleapis.com/auth/logging.write",
                                                    "https://www.googleapis.com/auth/trace.append"]


def test_zone_is_spread_over_configured_zones_deterministically(fake, provider, make_provider):
    names = [instance_name(f"uid-spread-{i}") for i in range(12)]
    chosen = {name: ids.pick_zone(name, ZONES) for name in names}
    assert set(chosen.values()) == set(ZONES), "twelve hashed names should use every zone"
    for i, name in enumerate(names[:4]):
        inst = provider.create(_request(f"uid-spread-{i}"))
        assert inst.zone == chosen[name]
    # Another worker process retrying the same create picks the same zone: no duplicate.
    again = make_provider().create(_request("uid-spread-0"))
    assert again.zone == chosen[names[0]]
    assert len(fake.instances) == 4


def test_create_is_idempotent_by_name(fake, provider):
    req = _request("uid-idem", zone="europe-west1-d")
    first = provider.create(req)
    second = provider.create(req)
    assert second.provider_id == first.provider_id and second.address == first.address
    assert len([k for k in fake.instances if k[2] == req.name]) == 1
    assert len(fake.calls("POST", r"/instances$")) == 2  # the second insert was answered 409 ...
    assert len(fake.calls("POST", r"/operations/.*/wait$")) == 1  # ... and not waited on


def test_create_while_a_previous_insert_is_still_running_returns_the_instance(fake, make_provider):
    fake.op_polls = 1000  # the operation never finishes within the first attempt
    provider = make_provider(operationTimeout="1s")
    req = _request("uid-slow", zone="europe-west1-b")
    with pytest.raises(Exception) as info:
        provider.create(req)
    assert type(info.value).__name__ == "Transient" and "still" in str(info.value)
    again = provider.create(req)  # the retry finds the instance the first attempt created
    assert again.state is InstanceState.PROVISIONING and again.address is None


def test_operation_waited_over_several_polls(fake, provider):
    fake.op_polls = 3
    inst = provider.create(_request("uid-polls", zone="europe-west1-b"))
    assert inst.state is InstanceState.RUNNING
    assert len(fake.calls("POST", r"/operations/.*/wait$")) == 3


@pytest.mark.parametrize("status, state", [
    ("PENDING", InstanceState.PROVISIONING), ("PROVISIONING", InstanceState.PROVISIONING),
    ("STAGING", InstanceState.PROVISIONING), ("REPAIRING", InstanceState.PROVISIONING),
    ("RUNNING", InstanceState.RUNNING), ("PENDING_STOP", InstanceState.STOPPED),
    ("STOPPING", InstanceState.STOPPED), ("DEPROVISIONING", InstanceState.STOPPED),
    ("STOPPED", InstanceState.STOPPED), ("SUSPENDING", InstanceState.STOPPED),
    ("SUSPENDED", InstanceState.STOPPED),
    # GCE's TERMINATED is a stopped instance (it can be started again), not a deleted one:
    # https://cloud.google.com/compute/docs/instances/instance-life-cycle
    ("TERMINATED", InstanceState.STOPPED),
])
def test_get_maps_instance_status(fake, provider, status, state):
    fake.add_instance(PROJECT, "europe-west1-b", "proxy-status", tags_for("u"), status=status)
    inst = provider.get(f"projects/{PROJECT}/zones/europe-west1-b/instances/proxy-status")
    assert inst.state is state
    assert inst.zone == "europe-west1-b" and inst.tags == tags_for("u")


def test_get_unknown_instance_is_not_found(fake, provider):
    with pytest.raises(NotFound):
        provider.get(f"projects/{PROJECT}/zones/europe-west1-b/instances/proxy-nothere")


def test_get_and_delete_use_the_project_and_zone_of_the_provider_id(fake, provider):
    fake.add_instance("other-project", "us-east1-b", "proxy-elsewhere", tags_for("u"))
    inst = provider.get("projects/other-project/zones/us-east1-b/instances/proxy-elsewhere")
    assert inst.provider_id == "projects/other-project/zones/us-east1-b/instances/proxy-elsewhere"
    provider.delete(inst.provider_id)
    assert fake.calls("POST", r"/projects/other-project/zones/us-east1-b/operations/[^/]+/wait$")
    assert ("other-project", "us-east1-b", "proxy-elsewhere") not in fake.instances


def test_delete_waits_and_is_idempotent(fake, provider):
    inst = provider.create(_request("uid-del", zone="europe-west1-c"))
    provider.delete(inst.provider_id)
    assert (PROJECT, "europe-west1-c", inst.name) not in fake.instances
    delete_ops = [n for n, op in fake.operations.items() if op.body["operationType"] == "delete"]
    assert len(delete_ops) == 1
    assert fake.calls("POST", rf"/operations/{delete_ops[0]}/wait$")
    provider.delete(inst.provider_id)  # already gone: success (the read before the delete says so)
    assert len(fake.calls("DELETE", r"/instances/")) == 1
    with pytest.raises(NotFound):
        provider.get(inst.provider_id)


def test_list_by_tag_reads_every_page_and_only_managed_instances(fake, provider):
    fake.page_size = 2
    created = {provider.create(_request(f"uid-list-{i}")).provider_id for i in range(5)}
    for i in range(2):
        fake.add_instance(PROJECT, "europe-west1-d", f"proxy-extra-{i}", tags_for(f"uid-extra-{i}"), status="STOPPED")
    fake.add_instance(PROJECT, "europe-west1-b", "not-ours", {"team": "web"})
    fake.add_instance(PROJECT, "europe-west1-b", "someone-else", {"managed-by": "other-operator"})
    fake.add_instance("other-project", "europe-west1-b", "proxy-other", tags_for("uid-other"))

    result = provider.list_by_tag(MANAGED_BY)

    pages = fake.calls("GET", r"/aggregated/instances$")
    assert len(pages) == 4  # 7 managed instances, 2 per page
    assert all(p.query["filter"] == ['labels.managed-by = "proxy-operator"'] for p in pages)
    assert [("pageToken" in p.query) for p in pages] == [False, True, True, True]
    ids_found = {i.provider_id for i in result.instances}
    assert created <= ids_found
    assert len(ids_found) == 7 and len(result.instances) == 7
    assert not result.partial and result.errors == []
    extra = [i for i in result.instances if i.name.startswith("proxy-extra-")]
    assert {i.state for i in extra} == {InstanceState.STOPPED}
    assert all(i.tags["managed-by"] == MANAGED_BY and i.tags["proxy-uid"] for i in result.instances)


def test_list_by_tag_is_partial_when_a_zone_is_unreachable(fake, provider):
    fake.add_instance(PROJECT, "europe-west1-b", "proxy-a", tags_for("a"))
    fake.add_instance(PROJECT, "europe-west1-c", "proxy-b", tags_for("b"))
    fake.unreachable_zones = {"europe-west1-c"}
    result = provider.list_by_tag(MANAGED_BY)
    assert result.partial
    assert [i.name for i in result.instances] == ["proxy-a"]
    assert result.errors == ["zone europe-west1-c unreachable"]


def test_check_reads_one_page_of_at_most_one_instance(fake, provider):
    for i in range(5):
        fake.add_instance(PROJECT, "europe-west1-b", f"proxy-c{i}", tags_for(f"c{i}"))
    [verdict] = provider.check()
    assert verdict.ready and verdict.reason == "Ready" and verdict.name == PROJECT
    assert verdict.details["managedInstancesOnFirstPage"] == "1"
    [call] = fake.calls("GET", r"/aggregated/instances$")
    assert call.query["maxResults"] == ["1"]
    assert call.query["filter"] == ['labels.managed-by = "proxy-operator"']


def test_check_reports_failure_without_raising(fake, provider):
    fake.fail("GET", r"/aggregated/instances$", 403, "forbidden", "Required 'compute.instances.list' permission")
    [verdict] = provider.check()
    assert not verdict.ready and verdict.reason == "Permanent"
    assert "compute.instances.list" in verdict.message


def test_every_call_including_operation_polls_goes_to_the_api_endpoint(fake, provider, loopback_only):
    inst = provider.create(_request("uid-endpoint", zone="europe-west1-b"))
    provider.list_by_tag(MANAGED_BY)
    provider.delete(inst.provider_id)
    seen = {(r.method, re.sub(r"/(proxy|operation)-[a-z0-9-]+", "/{x}", r.path)) for r in fake.requests}
    base = f"/compute/v1/projects/{PROJECT}"
    assert seen == {
        ("POST", f"{base}/zones/europe-west1-b/instances"),
        ("POST", f"{base}/zones/europe-west1-b/operations/{{x}}/wait"),
        ("GET", f"{base}/zones/europe-west1-b/instances/{{x}}"),
        ("GET", f"{base}/aggregated/instances"),
        ("DELETE", f"{base}/zones/europe-west1-b/instances/{{x}}"),
    }
    assert loopback_only.violations == []  # nothing tried to go anywhere but the fake
    # Anonymous credentials: no Authorization header was ever sent.
    assert not any(k.lower() == "authorization" for r in fake.requests for k in r.headers)


def test_guard_catches_the_sdk_extended_operation_trap(fake, loopback_only):
    """Why the provider waits through its own operations client: the SDK's
    ExtendedOperation.result() polls through a zone-operations client built without our
    client options, i.e. towards the public endpoint.  The loopback guard stops it."""
    from google.api_core.client_options import ClientOptions
    from google.auth.credentials import AnonymousCredentials
    from google.cloud import compute_v1

    client = compute_v1.InstancesClient(credentials=AnonymousCredentials(), transport="rest",
                                        client_options=ClientOptions(api_endpoint=fake.url))
    body = compute_v1.Instance(name="proxy-trap", machine_type="zones/europe-west1-b/machineTypes/e2-micro",
                               disks=[compute_v1.AttachedDisk(boot=True)])
    operation = client.insert(project=PROJECT, zone="europe-west1-b", instance_resource=body)
    with pytest.raises(Exception):  # noqa: B017 - whatever the SDK makes of the refused connection
        operation.result(timeout=5, retry=None)
    assert loopback_only.violations, "the SDK should have tried the public endpoint"
    assert any("googleapis.com" in v for v in loopback_only.violations)
    assert not fake.calls(path_regex=r"/operations/")  # the poll never reached the fake
    loopback_only.violations.clear()


@pytest.mark.parametrize("labels", [{}, {"managed-by": "someone-else", "proxy-uid": "u"},
                                    {"managed-by": MANAGED_BY}, {"env": "prod"}])
def test_delete_refuses_an_instance_that_is_not_ours_and_leaves_it(fake, provider, labels):
    """A gc.delete (or a wrong provider ID) naming someone's VM deletes nothing (docs/security.md)."""
    fake.add_instance(PROJECT, "europe-west1-b", "web-1", labels)
    pid = f"projects/{PROJECT}/zones/europe-west1-b/instances/web-1"
    with pytest.raises(NotManaged, match="refusing to delete .*web-1") as info:
        provider.delete(pid)
    assert isinstance(info.value, Permanent) and info.value.reason == "NotManaged"
    assert (PROJECT, "europe-west1-b", "web-1") in fake.instances
    assert not fake.calls("DELETE", r"/instances/web-1$"), "not even asked"
    # ours, same zone: deleted; one read before the delete keeps it cheap
    ours = provider.create(_request("uid-ours", zone="europe-west1-b"))
    reads = len(fake.calls("GET", rf"/instances/{ours.name}$"))
    provider.delete(ours.provider_id)
    assert (PROJECT, "europe-west1-b", ours.name) not in fake.instances
    assert len(fake.calls("GET", rf"/instances/{ours.name}$")) == reads + 1


def test_placement_outside_the_allow_lists_is_refused_naming_the_field(fake, make_provider):
    """A Proxy author picks among what the operator lists, nothing else (docs/security.md)."""
    provider = make_provider(images=["projects/p/global/images/squid-2026"], machineTypes=["e2-small"])
    cases = [({"zone": "us-central1-a"}, "spec.placement.zone"),
             ({"zone": "europe-west1-b", "image": "projects/evil/global/images/miner"}, "spec.placement.image"),
             ({"zone": "europe-west1-b", "machine_type": "a2-ultragpu-8g"}, "spec.placement.machineType")]
    for fields, spec_field in cases:
        with pytest.raises(SpecNotAllowed) as info:
            provider.create(_request("uid-refused", **fields))
        assert info.value.field == spec_field and str(info.value).startswith(f"{spec_field}: ")
        assert isinstance(info.value, Permanent) and info.value.reason == "SpecNotAllowed"
    assert fake.requests == [], "nothing reached the API"
    inst = provider.create(_request("uid-listed", zone="europe-west1-d", image="projects/p/global/images/squid-2026",
                                    machine_type="e2-small"))
    body = fake.calls("POST", r"/instances$")[0].body
    assert body["disks"][0]["initializeParams"]["sourceImage"] == "projects/p/global/images/squid-2026"
    assert body["machineType"] == "zones/europe-west1-d/machineTypes/e2-small"
    provider.delete(inst.provider_id)
