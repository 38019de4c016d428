"""EC2 errors as the taxonomy, injected by the front before moto (throttling, quota, permissions,
unknown AMIs) or moto's own (an SSM parameter that does not exist), and EC2's eventually
consistent reads."""

from __future__ import annotations

import pytest

from app.errors import NotFound, Permanent, QuotaExceeded, Transient
from app.providers.base import CreateRequest, InstanceState
from app.providers.naming import instance_name, tags_for
from tests.aws.conftest import aws_config

SQUID = "http_port 3128\n"
EGRESS = "table inet proxy_operator_egress {}\n"


def _request(uid: str, **kw) -> CreateRequest:
    return CreateRequest(name=instance_name(uid), tags=tags_for(uid), namespace="crawl", squid_config=SQUID,
                         egress_rules=EGRESS, **kw)


@pytest.mark.parametrize("code, status, cls", [
    ("RequestLimitExceeded", 503, Transient),
    ("Throttling", 400, Transient),
    ("InternalError", 500, Transient),
    ("InstanceLimitExceeded", 400, QuotaExceeded),
    ("VcpuLimitExceeded", 400, QuotaExceeded),
    ("InsufficientInstanceCapacity", 500, QuotaExceeded),
    ("UnauthorizedOperation", 403, Permanent),
    ("InvalidAMIID.NotFound", 400, Permanent),  # not NotFound: the AMI, not the instance
    ("InvalidAMIID.Malformed", 400, Permanent),
    ("InvalidSubnetID.NotFound", 400, Permanent),
    ("InvalidParameterValue", 400, Permanent),
])
def test_run_instances_errors_are_classified(moto, provider, code, status, cls):
    moto.front.fail("RunInstances", code, status=status, message=f"{code}: as EC2 says it")
    with pytest.raises(cls) as err:
        provider.create(_request("0c000000-0000-4000-8000-000000000001"))
    assert type(err.value) is cls
    assert code in str(err.value) and "RunInstances" in str(err.value)
    assert err.value.__cause__ is not None  # the botocore error is kept
    provider.create(_request("0c000000-0000-4000-8000-000000000001"))  # the next attempt goes through


def test_an_ssm_parameter_that_does_not_exist_is_permanent(moto, make_provider):
    provider = make_provider(ami="ssm:/proxy-operator/test/missing")
    with pytest.raises(Permanent, match="ParameterNotFound"):
        provider.create(_request("0c000000-0000-4000-8000-000000000003"))


def test_botocore_retries_throttling_within_max_attempts(moto, make_provider):
    provider = make_provider(maxAttempts=3)
    moto.front.fail("RunInstances", "RequestLimitExceeded", status=503, times=2)
    inst = provider.create(_request("0c000000-0000-4000-8000-000000000004"))
    runs = moto.front.of("RunInstances")
    assert len(runs) == 3  # two throttled, the third launched
    assert len({r.params["ClientToken"] for r in runs}) == 1  # the same token: EC2 launches once
    assert inst.name == instance_name("0c000000-0000-4000-8000-000000000004")


def test_a_lost_answer_is_retried_with_the_same_client_token(moto, provider):
    req = _request("0c000000-0000-4000-8000-000000000005")
    moto.front.fail("RunInstances", "InternalError", status=500)
    with pytest.raises(Transient):
        provider.create(req)
    provider.create(req)
    first, second = moto.front.of("RunInstances")
    assert first.params["ClientToken"] == second.params["ClientToken"]


def test_describe_that_does_not_show_the_new_instance_yet_is_not_found_then_running(moto, provider):
    """EC2's reads lag behind RunInstances: the create's own answer is returned, a get may miss it."""
    inst = provider.create(_request("0c000000-0000-4000-8000-000000000006"))
    assert inst.state in (InstanceState.PROVISIONING, InstanceState.RUNNING)
    moto.front.lag()
    with pytest.raises(NotFound):
        provider.get(inst.provider_id)
    assert provider.get(inst.provider_id).state is InstanceState.RUNNING


def test_a_throttled_listing_fails_as_a_whole(moto, provider):
    moto.front.fail("DescribeInstances", "RequestLimitExceeded", status=503)
    with pytest.raises(Transient, match="RequestLimitExceeded"):
        provider.list_by_tag("proxy-operator")


def test_a_credentials_file_not_mounted_yet_is_transient_and_heals(moto, ami, credentials_file, tmp_path):
    from app.providers.aws.provider import AwsProvider

    later = tmp_path / "secret" / "credentials"
    provider = AwsProvider(aws_config(moto, str(later)))
    with pytest.raises(Transient, match="does not exist"):
        provider.create(_request("0c000000-0000-4000-8000-000000000007"))
    later.parent.mkdir()
    later.write_text(open(credentials_file).read())
    provider.create(_request("0c000000-0000-4000-8000-000000000007"))


def test_no_credentials_at_all_is_permanent_and_says_where_to_put_them(moto, ami, tmp_path, monkeypatch):
    from app.providers.aws.provider import AwsProvider

    empty = tmp_path / "empty"
    empty.write_text("[default]\n")
    for var in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_PROFILE",
                "AWS_WEB_IDENTITY_TOKEN_FILE", "AWS_CONTAINER_CREDENTIALS_FULL_URI",
                "AWS_CONTAINER_CREDENTIALS_RELATIVE_URI"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("AWS_CONFIG_FILE", str(empty))
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")  # the instance profile: not on this machine
    provider = AwsProvider(aws_config(moto, str(empty)))
    with pytest.raises(Permanent, match="no usable AWS credentials"):
        provider.create(_request("0c000000-0000-4000-8000-000000000008"))
