"""The aws provider's lifecycle against moto's EC2 in server mode, through the real boto3 client."""

from __future__ import annotations

import base64
import gzip
from datetime import datetime, timezone
from email import message_from_bytes

import pytest

from app.errors import NotFound, NotManaged, Permanent, QuotaExceeded, SpecNotAllowed
from app.providers.aws import bootstrap
from app.providers.aws.provider import TAG_PROVIDER
from app.providers.base import CreateRequest, InstanceState
from app.providers.naming import MANAGED_BY, instance_name, tags_for
from tests.aws.conftest import CLIENTS, REGION, ZONES, aws_config

USER_DATA = b"#cloud-config\npackages: [squid]\nwrite_files:\n  - path: /etc/marker\n    content: user-data-marker-7f3a\n"
SQUID = "http_port 3128\nhttp_access deny all\n"
EGRESS = "table inet proxy_operator_egress {}\n"


def _request(uid: str, **kw) -> CreateRequest:
    kw.setdefault("user_data", USER_DATA)
    kw.setdefault("squid_config", SQUID)
    kw.setdefault("egress_rules", EGRESS)
    return CreateRequest(name=instance_name(uid), tags=tags_for(uid), namespace="crawl", **kw)


def _raw(ec2, name: str) -> list[dict]:
    found = ec2.describe_instances(Filters=[{"Name": "tag:Name", "Values": [name]}])
    return [i for r in found["Reservations"] for i in r["Instances"]]


def _tags(raw: dict) -> dict[str, str]:
    return {t["Key"]: t["Value"] for t in raw.get("Tags", [])}


def test_construction_dials_nothing(moto, credentials_file, tmp_path):
    from app.providers.aws.provider import AwsProvider

    AwsProvider(aws_config(moto, credentials_file))
    AwsProvider(aws_config(moto, str(tmp_path / "not-mounted-yet")))
    assert moto.front.calls == []


def test_create_launches_tagged_instance_with_bootstrap_and_group(moto, ec2, ami, make_provider):
    provider = make_provider(instanceTypes=["t3.small"])
    uid = "0b1c2d3e-0000-4000-8000-000000000001"
    req = _request(uid, zone="eu-west-1b", machine_type="t3.small", auth_htpasswd="crawler:$2b$10$hash")
    inst = provider.create(req)

    [run] = moto.front.of("RunInstances")
    assert run.params["InstanceType"] == "t3.small" and run.params["ImageId"] == ami  # the ssm: AMI resolved
    assert run.params["Placement.AvailabilityZone"] == "eu-west-1b"
    assert run.params["MetadataOptions.HttpTokens"] == "required"  # IMDSv2 only
    assert run.params["ClientToken"].startswith(req.name + "-")
    [raw] = _raw(ec2, req.name)
    assert _tags(raw) == {"Name": req.name, "managed-by": MANAGED_BY, "proxy-uid": uid, TAG_PROVIDER: "aws-test"}
    # The user-data: gzip of a MIME archive, the Proxy's cloud-init unchanged, then the operator's part.
    data = ec2.describe_instance_attribute(InstanceId=raw["InstanceId"], Attribute="userData")
    doc = message_from_bytes(gzip.decompress(base64.b64decode(data["UserData"]["Value"])))
    parts = [p for p in doc.walk() if not p.is_multipart()]
    assert parts[0].get_payload(decode=True) == USER_DATA
    assert parts[1].get_content_type() == "text/x-shellscript"
    assert parts[1].get_filename() == bootstrap.FIRST_BOOT_NAME
    script = parts[1].get_payload(decode=True).decode()
    assert base64.b64encode(SQUID.encode()).decode() in script
    assert base64.b64encode(b"crawler:$2b$10$hash").decode() in script

    # The security group: ensured, the Squid port open to the client range only.
    [group] = ec2.describe_security_groups(Filters=[{"Name": "group-name",
                                                     "Values": ["proxy-operator-aws-test"]}])["SecurityGroups"]
    assert [(p["IpProtocol"], p["FromPort"], [r["CidrIp"] for r in p["IpRanges"]]) for p in group["IpPermissions"]] \
        == [("tcp", 3128, [CLIENTS])]
    assert raw["NetworkInterfaces"][0]["Groups"][0]["GroupId"] == group["GroupId"]

    assert inst.provider_id == f"regions/{REGION}/zones/eu-west-1b/instances/{req.name}"
    assert inst.zone == "eu-west-1b" and inst.tags["proxy-uid"] == uid
    assert inst.created is not None and inst.created.tzinfo is not None
    got = provider.get(inst.provider_id)
    assert got.state is InstanceState.RUNNING and got.address == raw["PublicIpAddress"]
    assert abs((datetime.now(timezone.utc) - got.created).total_seconds()) < 120


def test_create_is_idempotent_by_name(moto, ec2, provider):
    req = _request("0b1c2d3e-0000-4000-8000-000000000002")
    first = provider.create(req)
    second = provider.create(req)
    assert first.provider_id == second.provider_id
    assert len(_raw(ec2, req.name)) == 1 and moto.front.count("RunInstances") == 1


def test_zone_comes_from_the_name_and_instance_ids_list_every_zone(provider):
    req = _request("0b1c2d3e-0000-4000-8000-000000000003")
    ids = provider.instance_ids(req.name, "crawl")
    assert sorted(i.split("/")[3] for i in ids) == sorted(ZONES)
    inst = provider.create(req)
    assert inst.provider_id == ids[0]  # where the write-ahead ID said


@pytest.mark.parametrize("field, kw", [
    ("spec.placement.zone", {"zone": "eu-west-1z"}),
    ("spec.placement.image", {"image": "ami-0123456789abcdef0"}),
    ("spec.placement.machineType", {"machine_type": "p5.48xlarge"}),
    ("spec.endpoint.port", {"port": 22}),
])
def test_placement_outside_the_allow_lists_is_refused_before_any_call(moto, provider, field, kw):
    with pytest.raises(SpecNotAllowed) as err:
        provider.create(_request("0b1c2d3e-0000-4000-8000-000000000004", **kw))
    assert err.value.field == field
    assert moto.front.calls == []


def test_delete_terminates_and_is_idempotent(moto, ec2, provider):
    inst = provider.create(_request("0b1c2d3e-0000-4000-8000-000000000005"))
    provider.delete(inst.provider_id)
    [raw] = _raw(ec2, inst.name)
    assert raw["State"]["Name"] in ("shutting-down", "terminated")
    provider.delete(inst.provider_id)  # already gone: success, no second terminate
    assert moto.front.count("TerminateInstances") == 1
    with pytest.raises(NotFound):  # EC2 still lists it for a while: terminated is gone all the same
        provider.get(inst.provider_id)
    with pytest.raises(NotFound):
        provider.get(provider.instance_ids("proxy-nothing", "crawl")[0])


def test_delete_refuses_an_instance_that_is_not_ours(moto, ec2, ami, provider):
    ec2.run_instances(ImageId=ami, MinCount=1, MaxCount=1, Placement={"AvailabilityZone": "eu-west-1a"},
                      TagSpecifications=[{"ResourceType": "instance", "Tags": [{"Key": "Name", "Value": "someones"}]}])
    pid = f"regions/{REGION}/zones/eu-west-1a/instances/someones"
    with pytest.raises(NotManaged):
        provider.delete(pid)
    assert moto.front.count("TerminateInstances") == 0
    assert _raw(ec2, "someones")[0]["State"]["Name"] == "running"


def test_delete_during_create_finds_the_instance_in_every_zone(moto, ec2, provider):
    """The reconciler records the IDs before it creates; a delete then tries each of them."""
    req = _request("0b1c2d3e-0000-4000-8000-000000000006", zone="eu-west-1c")
    provider.create(req)
    for pid in provider.instance_ids(req.name, "crawl"):  # no zone: the name's zone first, then the others
        provider.delete(pid)
    assert [i["State"]["Name"] for i in _raw(ec2, req.name)] in (["shutting-down"], ["terminated"])


def test_zone_change_leaves_the_old_instance_to_gc(moto, ec2, provider):
    uid = "0b1c2d3e-0000-4000-8000-000000000007"
    old = provider.create(_request(uid, zone="eu-west-1a"))
    new = provider.create(_request(uid, zone="eu-west-1b"))
    assert old.provider_id != new.provider_id
    listed = provider.list_by_tag(MANAGED_BY)
    assert sorted(i.provider_id for i in listed.instances) == sorted([old.provider_id, new.provider_id])
    provider.delete(old.provider_id)
    assert provider.get(new.provider_id).state is InstanceState.RUNNING


def test_list_by_tag_reads_every_page_and_only_this_providers_instances(moto, make_provider):
    mine, other = make_provider(), make_provider(name="aws-other")
    for n in range(7):
        mine.create(_request(f"0b1c2d3e-0000-4000-8000-00000000010{n}"))
    other.create(_request("0b1c2d3e-0000-4000-8000-000000000200"))
    moto.front.page_size = 2
    moto.front.calls.clear()
    listed = mine.list_by_tag(MANAGED_BY)
    assert len(listed.instances) == 7 and not listed.partial
    assert {i.tags[TAG_PROVIDER] for i in listed.instances} == {"aws-test"}
    assert moto.front.count("DescribeInstances") == 4  # 2 + 2 + 2 + 1


def test_abandon_tags_the_instance_and_start_runs_a_stopped_one(moto, ec2, provider):
    inst = provider.create(_request("0b1c2d3e-0000-4000-8000-000000000008"))
    provider.abandon(inst.provider_id)
    provider.abandon(inst.provider_id)
    assert provider.get(inst.provider_id).tags["abandoned"] == "true"
    assert moto.front.count("CreateTags") == 1
    [raw] = _raw(ec2, inst.name)
    ec2.stop_instances(InstanceIds=[raw["InstanceId"]])
    assert provider.get(inst.provider_id).state is InstanceState.STOPPED
    provider.start(inst.provider_id)
    assert provider.get(inst.provider_id).state is InstanceState.RUNNING


def test_max_instances_refuses_creates_beyond_the_limit(moto, make_provider):
    provider = make_provider(maxInstances=2)
    a = provider.create(_request("0b1c2d3e-0000-4000-8000-000000000301"))
    provider.create(_request("0b1c2d3e-0000-4000-8000-000000000302"))
    with pytest.raises(QuotaExceeded, match="aws.maxInstances is 2"):
        provider.create(_request("0b1c2d3e-0000-4000-8000-000000000303"))
    assert moto.front.count("RunInstances") == 2
    provider.delete(a.provider_id)
    provider.create(_request("0b1c2d3e-0000-4000-8000-000000000303"))  # room again


def test_user_data_over_the_ec2_limit_is_permanent(moto, provider):
    import base64
    import random

    noise = random.Random(7).randbytes(16 * 1024)  # random: gzip cannot shrink it below 16 KiB
    big = b"#cloud-config\n# " + base64.b64encode(noise) + b"\n"
    with pytest.raises(Permanent, match="over EC2's limit"):
        provider.create(_request("0b1c2d3e-0000-4000-8000-000000000009", user_data=big))
    assert moto.front.count("RunInstances") == 0


def test_check_reports_the_region(moto, provider, make_provider):
    [verdict] = provider.check()
    assert verdict.ready and verdict.name == REGION
    moto.front.fail("DescribeInstances", "AuthFailure", status=401, message="AWS was not able to validate")
    [verdict] = provider.check()
    assert not verdict.ready and verdict.reason == "Permanent" and "AuthFailure" in verdict.message


def test_gc_deletes_orphans_and_superseded_instances_and_keeps_live_and_abandoned_ones(moto, ec2, provider):
    from app.proxy.gc import collect
    from app.resources import ProxyRef

    live = provider.create(_request("0b1c2d3e-0000-4000-8000-000000000401", zone="eu-west-1a"))
    moved = provider.create(_request("0b1c2d3e-0000-4000-8000-000000000401", zone="eu-west-1b"))  # the zone changed
    orphan = provider.create(_request("0b1c2d3e-0000-4000-8000-000000000402"))
    kept = provider.create(_request("0b1c2d3e-0000-4000-8000-000000000403"))
    provider.abandon(kept.provider_id)
    proxies = [ProxyRef("0b1c2d3e-0000-4000-8000-000000000401", moved.provider_id)]

    report = collect("aws-test", provider, lambda: proxies, abandoned=set(), grace_seconds=0)

    assert sorted(report.deleted) == sorted([live.provider_id, orphan.provider_id])  # superseded + orphan
    states = {i.provider_id: i.state for i in provider.list_by_tag(MANAGED_BY).instances}
    assert set(states) == {moved.provider_id, kept.provider_id}


def test_ingress_rules_added_by_hand_are_revoked_whatever_their_source(moto, ec2, make_provider):
    """A rule opening the group to another security group or a prefix list is drift like a CIDR rule."""
    make_provider().create(_request("0b1c2d3e-0000-4000-8000-000000000010"))
    [group] = ec2.describe_security_groups(Filters=[{"Name": "group-name",
                                                     "Values": ["proxy-operator-aws-test"]}])["SecurityGroups"]
    other = ec2.create_security_group(GroupName="hand-made", Description="by hand")["GroupId"]
    plist = ec2.create_managed_prefix_list(PrefixListName="by-hand", MaxEntries=2, AddressFamily="IPv4",
                                           Entries=[{"Cidr": "192.0.2.0/24"}])["PrefixList"]["PrefixListId"]
    ec2.authorize_security_group_ingress(GroupId=group["GroupId"], IpPermissions=[
        {"IpProtocol": "tcp", "FromPort": 3128, "ToPort": 3128, "UserIdGroupPairs": [{"GroupId": other}]},
        {"IpProtocol": "tcp", "FromPort": 22, "ToPort": 22, "PrefixListIds": [{"PrefixListId": plist}]},
        {"IpProtocol": "-1", "IpRanges": [{"CidrIp": "0.0.0.0/0"}]}])

    make_provider().create(_request("0b1c2d3e-0000-4000-8000-000000000011"))  # a restarted worker ensures it again

    [group] = ec2.describe_security_groups(GroupIds=[group["GroupId"]])["SecurityGroups"]
    opened = [(p["IpProtocol"], p.get("FromPort"), [r["CidrIp"] for r in p.get("IpRanges", [])],
               p.get("UserIdGroupPairs", []), p.get("PrefixListIds", [])) for p in group["IpPermissions"]]
    assert opened == [("tcp", 3128, [CLIENTS], [], [])]
