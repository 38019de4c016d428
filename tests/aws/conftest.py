"""Fixtures of the aws provider tests: moto's EC2/SSM emulator in server mode behind a recording,
fault-injecting front (tests/aws/ec2_front.py), providers built through the real config parser
with a shared-credentials file (the Secret path), and the loopback guard."""

from __future__ import annotations

from typing import Any, Callable

import boto3
import pytest

from app.config.providers import ProviderConfig
from app.wiring import parse_config as parse
from tests.aws.ec2_front import DEBIAN_AMI, Moto
from tests.support.netguard import loopback_only  # noqa: F401 - an autouse fixture of this area

REGION = "eu-west-1"
ZONES = ["eu-west-1a", "eu-west-1b", "eu-west-1c"]
CLIENTS = "10.20.0.0/16"
#: Fake keys: moto accepts any; they must never show in a log.
ACCESS_KEY, SECRET_KEY = "AKIAPROXYOPERATOR0001", "proxy-operator-test-secret-key-do-not-log"


@pytest.fixture(scope="session")
def moto_server():
    """One moto server (and front) per test process; each test starts from :meth:`Moto.reset`."""
    server = Moto()
    yield server
    server.stop()


@pytest.fixture()
def moto(moto_server):
    """The emptied emulator of this test."""
    moto_server.reset()
    return moto_server


@pytest.fixture()
def credentials_file(tmp_path):
    """A shared-credentials file as a mounted Secret holds it."""
    path = tmp_path / "credentials"
    path.write_text(f"[default]\naws_access_key_id = {ACCESS_KEY}\naws_secret_access_key = {SECRET_KEY}\n")
    return str(path)


@pytest.fixture()
def ec2(moto):
    """A boto3 EC2 client on the emulator itself (behind the front: its calls are not recorded)."""
    return boto3.client("ec2", region_name=REGION, endpoint_url=moto.moto_url,
                        aws_access_key_id=ACCESS_KEY, aws_secret_access_key=SECRET_KEY)


@pytest.fixture()
def ami(moto, ec2):
    """The AMI the emulator knows, also published as the SSM parameter ``/proxy-operator/test/ami``."""
    image = DEBIAN_AMI
    boto3.client("ssm", region_name=REGION, endpoint_url=moto.moto_url, aws_access_key_id=ACCESS_KEY,
                 aws_secret_access_key=SECRET_KEY).put_parameter(
        Name="/proxy-operator/test/ami", Value=image, Type="String")
    return image


def aws_config(moto: Moto, credentials_file: str, name: str = "aws-test", **block: Any) -> ProviderConfig:
    """Build an aws :class:`ProviderConfig` through the real config parser, pointed at the front."""
    aws: dict[str, Any] = {"region": REGION, "zones": list(ZONES), "endpointUrl": moto.url,
                           "credentialsFile": credentials_file, "requestTimeout": "5s", "maxAttempts": 1,
                           "ami": "ssm:/proxy-operator/test/ami",
                           "securityGroup": {"ensure": True, "sourceRanges": [CLIENTS]}}
    aws.update(block)
    aws = {k: v for k, v in aws.items() if v is not None}
    cfg = parse({"providers": [{"name": name, "type": "aws", "checkTimeout": "5s", "aws": aws}]},
                "providers-test.yaml")
    return cfg.providers[0]


@pytest.fixture()
def make_provider(moto, credentials_file, ami) -> Callable[..., Any]:
    """``make_provider(name=..., **aws_block_overrides)`` -> an :class:`AwsProvider` against the emulator."""
    from app.providers.aws.provider import AwsProvider

    def build(name: str = "aws-test", **block: Any) -> AwsProvider:
        return AwsProvider(aws_config(moto, credentials_file, name, **block))

    return build


@pytest.fixture()
def provider(make_provider):
    """An :class:`AwsProvider` against the emulator."""
    return make_provider()
