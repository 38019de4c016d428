"""The aws block of the providers config: defaults, and every rejection naming file, provider and field."""

from __future__ import annotations

import pytest

from app.config.validation import ConfigError
from app.providers.aws.config import DEFAULT_AMI, AwsSettings
from app.wiring import parse_config as parse

SG = {"ensure": True, "sourceRanges": ["10.0.0.0/8"]}


def _parse(aws):
    return parse({"providers": [{"name": "aws-eu", "type": "aws", "aws": aws}]}, "providers.yaml")


def test_minimal_block_gets_documented_defaults():
    s = _parse({"region": "eu-west-1", "zones": ["eu-west-1a"], "securityGroup": SG}).providers[0].settings
    assert isinstance(s, AwsSettings)
    assert s.allowed_images() == (DEFAULT_AMI,) and s.allowed_instance_types() == ("t3.micro",)
    assert s.security_group.ensure and s.security_group.ports == (3128,)
    assert s.external_ip and s.max_instances is None and s.credentials_file is None and s.endpoint_url is None
    assert s.request_timeout == 30.0 and s.max_attempts == 3 and s.check_targets() == ["eu-west-1"]


def test_full_block_is_read():
    s = _parse({
        "region": "us-east-1", "zones": ["us-east-1a", "us-east-1b", "us-east-1-bos-1a"],
        "instanceType": "t3.small", "instanceTypes": ["c7g.medium"], "ami": "ami-0123456789abcdef0",
        "amis": ["ssm:/aws/service/debian/release/12/latest/arm64"], "subnets": {"us-east-1a": "subnet-0123456789abcdef0"},
        "externalIP": False, "instanceProfile": "proxy-vm", "maxInstances": 20,
        "securityGroup": {"id": "sg-0123456789abcdef0", "ports": [3128, 8080]},
        "credentialsFile": "/var/run/secrets/aws/credentials", "profile": "operator",
        "endpointUrl": "https://ec2.us-east-1.amazonaws.com/", "requestTimeout": "10s", "maxAttempts": 5,
        "wireLogging": {"enabled": True},
    }).providers[0].settings
    assert s.zones == ("us-east-1a", "us-east-1b", "us-east-1-bos-1a")
    assert s.subnets == {"us-east-1a": "subnet-0123456789abcdef0"}
    assert s.security_group.id == "sg-0123456789abcdef0" and s.security_group.ports == (3128, 8080)
    assert s.endpoint_url == "https://ec2.us-east-1.amazonaws.com" and s.max_instances == 20
    assert s.allowed_images() == ("ami-0123456789abcdef0", "ssm:/aws/service/debian/release/12/latest/arm64")


@pytest.mark.parametrize("aws, field, problem", [
    ({"zones": ["eu-west-1a"], "securityGroup": SG}, "aws.region", "required"),
    ({"region": "Europe", "zones": ["eu-west-1a"], "securityGroup": SG}, "aws.region", "not an AWS region"),
    ({"region": "eu-west-1", "securityGroup": SG}, "aws.zones", "required"),
    ({"region": "eu-west-1", "zones": [], "securityGroup": SG}, "aws.zones", "at least one zone"),
    ({"region": "eu-west-1", "zones": ["eu-west-1a", "us-east-1a"], "securityGroup": SG}, "aws.zones[1]",
     "not a zone of region eu-west-1"),
    ({"region": "eu-west-1", "zones": ["eu-west-1a"]}, "aws.securityGroup", "required"),
    ({"region": "eu-west-1", "zones": ["eu-west-1a"], "securityGroup": {}}, "aws.securityGroup.ensure",
     "set ensure: true"),
    ({"region": "eu-west-1", "zones": ["eu-west-1a"], "securityGroup": {"ensure": True}},
     "aws.securityGroup.sourceRanges", "required when ensure"),
    ({"region": "eu-west-1", "zones": ["eu-west-1a"], "securityGroup": {"ensure": True, "sourceRanges": ["10/8x"]}},
     "aws.securityGroup.sourceRanges[0]", "not a CIDR"),
    ({"region": "eu-west-1", "zones": ["eu-west-1a"], "securityGroup": {"id": "sg-1", "ensure": False}},
     "aws.securityGroup.id", "not a security group ID"),
    ({"region": "eu-west-1", "zones": ["eu-west-1a"], "securityGroup": {**SG, "ports": [0]}},
     "aws.securityGroup.ports[0]", "port number"),
    ({"region": "eu-west-1", "zones": ["eu-west-1a"], "securityGroup": {**SG, "sourceRange": ["10.0.0.0/8"]}},
     "aws.securityGroup.sourceRange", "unknown key"),
    ({"region": "eu-west-1", "zones": ["eu-west-1a"], "securityGroup": SG, "ami": "debian-12"}, "aws.ami",
     "not an AMI ID"),
    ({"region": "eu-west-1", "zones": ["eu-west-1a"], "securityGroup": SG, "amis": ["ami-1"]}, "aws.amis[0]",
     "not an AMI ID"),
    ({"region": "eu-west-1", "zones": ["eu-west-1a"], "securityGroup": SG, "instanceType": "big"},
     "aws.instanceType", "not an instance type"),
    ({"region": "eu-west-1", "zones": ["eu-west-1a"], "securityGroup": SG, "subnets": {"eu-west-1b": "subnet-0123456789abcdef0"}},
     "aws.subnets.eu-west-1b", "not one of aws.zones"),
    ({"region": "eu-west-1", "zones": ["eu-west-1a"], "securityGroup": SG, "maxInstances": -1},
     "aws.maxInstances", "at least 0"),
    ({"region": "eu-west-1", "zones": ["eu-west-1a"], "securityGroup": SG, "endpointUrl": "ec2.local"},
     "aws.endpointUrl", "must be a URL"),
    ({"region": "eu-west-1", "zones": ["eu-west-1a"], "securityGroup": SG, "instanceTyp": "t3.small"},
     "aws.instanceTyp", "unknown key"),
])
def test_bad_blocks_are_refused_naming_the_field(aws, field, problem):
    with pytest.raises(ConfigError) as err:
        _parse(aws)
    assert err.value.file == "providers.yaml" and err.value.provider == "aws-eu"
    assert err.value.field == field, str(err.value)
    assert problem in err.value.problem, str(err.value)


def test_check_config_names_the_aws_field(tmp_path):
    import subprocess
    import sys

    path = tmp_path / "providers.yaml"
    path.write_text("providers:\n  - name: aws-eu\n    type: aws\n    aws: {region: eu-west-1, zones: [eu-west-1a]}\n")
    out = subprocess.run([sys.executable, "-m", "cli.main", "check-config", str(path)], capture_output=True,
                         text=True, timeout=60)
    assert out.returncode != 0
    assert f'{path}: provider "aws-eu": aws.securityGroup: required' in out.stderr


def test_the_sample_providers_file_is_valid():
    from pathlib import Path

    from app.wiring import load_config

    cfg = load_config(Path(__file__).resolve().parents[2] / "deploy" / "samples" / "providers_aws.yaml")
    [aws] = cfg.providers
    assert aws.type == "aws" and aws.settings.zones == ("eu-west-1a", "eu-west-1b", "eu-west-1c")
