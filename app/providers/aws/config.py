"""The ``aws:`` block of a providers-config entry (no SDK import here).

Shape (every key but ``region`` and ``zones`` optional; docs/aws-provider.md is the user reference)::

    aws:
      region: eu-west-1
      zones: [eu-west-1a, eu-west-1b]     # required: where instances go, and the only zones a Proxy may name
      instanceType: t3.micro
      instanceTypes: [t3.small]           # other instance types a Proxy may name
      ami: ssm:/aws/service/debian/release/12/latest/amd64   # an AMI ID or ssm:<parameter name>
      amis: [ami-0123456789abcdef0]       # other AMIs a Proxy may name
      subnets: {eu-west-1a: subnet-0123456789abcdef0}        # optional; else the zone's default subnet
      externalIP: true
      instanceProfile: proxy-vm           # optional: an IAM instance profile name or ARN
      securityGroup:                      # the group every instance gets (docs/aws-provider.md)
        ensure: true                      # keep proxy-operator-<provider> (or name) in vpcId
        sourceRanges: [10.0.0.0/8]        # required with ensure: the client ranges
        ports: [3128]                     # the only spec.endpoint.port values a Proxy may ask for
        # id: sg-0123456789abcdef0        # or: use this group as it is (ensure off)
      maxInstances: 50                    # optional: refuse creates beyond this many live instances
      credentialsFile: /var/run/secrets/aws/credentials      # optional; else the standard chain
      profile: proxy-operator             # optional: a profile of that file (or of ~/.aws)
      endpointUrl: https://ec2.eu-west-1.amazonaws.com       # testing / private endpoints
      requestTimeout: 30s
      maxAttempts: 3                      # botocore's own retries of throttling and 5xx per call
      wireLogging: {enabled: false, fullPayloads: false}

Every check raises :class:`app.config.validation.ConfigError` naming the file, the provider and the
dotted field (``aws.securityGroup.sourceRanges[1]``).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from app.config.cloud_fields import WireLogSettings, cidr_list, endpoint_url, port_list, wire_logging
from app.config.provider_types import CheckTargets
from app.config.validation import Reader

DEFAULT_INSTANCE_TYPE = "t3.micro"
#: Debian 12 for x86_64, the public SSM parameter Debian publishes its current AMI under.
DEFAULT_AMI = "ssm:/aws/service/debian/release/12/latest/amd64"
DEFAULT_PORTS = (3128,)

#: An AWS region (``eu-west-1``, ``us-gov-west-1``, ``ap-southeast-3``).
REGION = re.compile(r"^[a-z]{2}(-[a-z]+)+-\d$")
#: An availability zone of a region (``eu-west-1a``) or a Local Zone (``us-east-1-bos-1a``).
ZONE = re.compile(r"^[a-z]{2}(-[a-z]+)+-\d(-[a-z]+-\d)?[a-z]$")
AMI_ID = re.compile(r"^ami-[0-9a-f]{8,17}$")
SSM_PARAMETER = re.compile(r"^ssm:/[A-Za-z0-9_./-]+$")
INSTANCE_TYPE = re.compile(r"^[a-z][a-z0-9-]*\.[a-z0-9]+$")
SUBNET_ID = re.compile(r"^subnet-[0-9a-f]{8,17}$")
GROUP_ID = re.compile(r"^sg-[0-9a-f]{8,17}$")
VPC_ID = re.compile(r"^vpc-[0-9a-f]{8,17}$")
#: A security group name we create: letters, digits and ``._-:/()#,@[]+=&;{}!$*`` may appear in
#: EC2, but we keep to the plain subset.
GROUP_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,254}$")
INSTANCE_PROFILE = re.compile(r"^(arn:aws[a-z-]*:iam::\d{12}:instance-profile/)?[\w+=,.@/-]{1,128}$")


@dataclass(frozen=True)
class SecurityGroupSettings:
    """The security group every instance gets.

    Attributes:
        id: an existing group (``sg-...``) used as it is, or ``None``.
        ensure: keep the group ``name`` (default ``proxy-operator-<provider>``) in ``vpc_id`` (the
            default VPC when ``None``) with exactly one ingress rule per port in ``ports`` from
            each of ``source_ranges``; the create refuses to run without it.
        name: the name of the ensured group, or ``None`` for ``proxy-operator-<provider>``.
        vpc_id: the VPC of the ensured group, or ``None`` for the default VPC.
        source_ranges: the client CIDRs allowed to reach Squid (required with ``ensure``).
        ports: the only Squid ports a Proxy may ask for (``spec.endpoint.port``): each one is an
            ingress rule to every proxy instance.
    """

    id: str | None = None
    ensure: bool = False
    name: str | None = None
    vpc_id: str | None = None
    source_ranges: tuple[str, ...] = ()
    ports: tuple[int, ...] = DEFAULT_PORTS


@dataclass(frozen=True)
class AwsSettings(CheckTargets):
    """Settings of an aws provider.

    Attributes:
        region: the EC2 region (required).
        zones: availability zones of ``region`` (required, non-empty): where instances go (the
            zone is picked deterministically from the instance name when a Proxy names none),
            and the only zones a Proxy may name in ``spec.placement.zone``.
        instance_type: default instance type; always allowed.
        instance_types: further instance types a Proxy may name in ``spec.placement.machineType``.
        ami: default image: an AMI ID or ``ssm:<parameter>`` resolved at create; always allowed.
        amis: further images (same forms) a Proxy may name in ``spec.placement.image``.
        subnets: zone -> subnet ID; a zone not listed uses its default subnet.
        external_ip: ask for a public IPv4 address (``AssociatePublicIpAddress``).
        instance_profile: IAM instance profile name or ARN attached to each instance, or ``None``.
        security_group: :class:`SecurityGroupSettings`.
        max_instances: the most live instances this provider runs (creates beyond it are
            refused with ``QuotaExceeded``/``InstanceLimit``), or ``None`` for no limit.
        credentials_file: a shared-credentials file (a mounted Secret), or ``None`` for the
            standard chain (environment, web identity / IRSA, ``~/.aws``, instance profile).
        profile: the profile to use, or ``None`` for ``default``.
        endpoint_url: the EC2 (and SSM) endpoint, for tests and private endpoints, or ``None``.
        request_timeout: seconds one HTTP call may take (connect and read).
        max_attempts: botocore's attempts per call (``standard`` retry mode: throttling and 5xx
            with its own backoff) before the error reaches the taxonomy.
        wire_logging: :class:`WireLogSettings`.
    """

    region: str
    zones: tuple[str, ...] = ()
    instance_type: str = DEFAULT_INSTANCE_TYPE
    instance_types: tuple[str, ...] = ()
    ami: str = DEFAULT_AMI
    amis: tuple[str, ...] = ()
    subnets: dict[str, str] = field(default_factory=dict)
    external_ip: bool = True
    instance_profile: str | None = None
    security_group: SecurityGroupSettings = field(default_factory=SecurityGroupSettings)
    max_instances: int | None = None
    credentials_file: str | None = None
    profile: str | None = None
    endpoint_url: str | None = None
    request_timeout: float = 30.0
    max_attempts: int = 3
    wire_logging: WireLogSettings = field(default_factory=WireLogSettings)

    def check_targets(self) -> list[str]:
        """The one check target, the region (what ``AwsProvider.check()`` names its verdict)."""
        return [self.region]

    def allowed_images(self) -> tuple[str, ...]:
        """Return every image a Proxy may name: ``ami`` first, then ``amis``."""
        return (self.ami, *(a for a in self.amis if a != self.ami))

    def allowed_instance_types(self) -> tuple[str, ...]:
        """Return every instance type a Proxy may name: ``instance_type`` first, then ``instance_types``."""
        return (self.instance_type, *(t for t in self.instance_types if t != self.instance_type))


def _checked(block: Reader, key: str, pattern: re.Pattern[str], what: str, default: str | None = None, *,
             required: bool = False) -> str | None:
    value = block.str(key, default, required=required)
    if value is not None and not pattern.match(value):
        raise block.error(key, f"{value!r} is not {what}")
    return value


def _checked_list(block: Reader, key: str, pattern: re.Pattern[str], what: str, *,
                  required: bool = False) -> tuple[str, ...]:
    values = block.str_list(key, required=required)
    for i, value in enumerate(values):
        if not pattern.match(value):
            raise block.error(f"{key}[{i}]", f"{value!r} is not {what}")
    return tuple(values)


def _image(block: Reader, key: str, value: str, where: str) -> None:
    if not (AMI_ID.match(value) or SSM_PARAMETER.match(value)):
        raise block.error(where, f"{value!r} is not an AMI ID (ami-0123456789abcdef0) or an SSM parameter "
                                 "(ssm:/aws/service/...)")


def _security_group(block: Reader) -> SecurityGroupSettings:
    sg = block.child("securityGroup", required=True)
    group_id = _checked(sg, "id", GROUP_ID, "a security group ID (sg-0123456789abcdef0)")
    ensure = bool(sg.bool("ensure", False))
    name = _checked(sg, "name", GROUP_NAME, "a security group name (letters, digits, '.', '_', '-')")
    vpc_id = _checked(sg, "vpcId", VPC_ID, "a VPC ID (vpc-0123456789abcdef0)")
    ranges = cidr_list(sg, "sourceRanges")
    ports = port_list(sg, "ports", DEFAULT_PORTS)
    if group_id and ensure:
        raise sg.error("ensure", "cannot be combined with id (use a named group as it is, or let the "
                                 "operator keep its own)")
    if not group_id and not ensure:
        raise sg.error("ensure", "set ensure: true (the operator keeps a group opening the Squid port to "
                                 "sourceRanges) or id: sg-... (a group you keep)")
    if ensure and not ranges:
        raise sg.error("sourceRanges", "required when ensure is true (the client CIDRs allowed to reach the proxies)")
    if group_id and (ranges or name or vpc_id):
        raise sg.error("id", "a group named by id is used as it is: leave out sourceRanges, name and vpcId")
    sg.done()
    return SecurityGroupSettings(id=group_id, ensure=ensure, name=name, vpc_id=vpc_id,
                                 source_ranges=ranges, ports=ports)


def _subnets(block: Reader, zones: tuple[str, ...]) -> dict[str, str]:
    raw = block.raw("subnets", {})
    if not isinstance(raw, dict):
        raise block.error("subnets", f"must be a mapping of zone to subnet ID, got {type(raw).__name__}")
    out = {}
    for zone, subnet in raw.items():
        if zone not in zones:
            raise block.error(f"subnets.{zone}", f"{zone!r} is not one of aws.zones ({', '.join(zones)})")
        if not isinstance(subnet, str) or not SUBNET_ID.match(subnet):
            raise block.error(f"subnets.{zone}", f"{subnet!r} is not a subnet ID (subnet-0123456789abcdef0)")
        out[zone] = subnet
    return out


def parse(block: Reader) -> AwsSettings:
    """Parse the ``aws`` block.

    Args:
        block: a :class:`Reader` over the block (``app.config.providers`` calls ``done()`` on it).
    Returns:
        :class:`AwsSettings`.
    Raises:
        app.config.validation.ConfigError: a missing region, zone list or security group, a
            malformed value, a zone outside the region, an unknown key in a nested block, or an
            inconsistent combination, naming the field.
    """
    region = _checked(block, "region", REGION, "an AWS region (e.g. eu-west-1)", required=True)
    assert region is not None
    zones = _checked_list(block, "zones", ZONE, "an availability zone (e.g. eu-west-1a)", required=True)
    if not zones:
        raise block.error("zones", "must list at least one zone (where instances go, and the zones a Proxy may name)")
    for i, zone in enumerate(zones):
        if not zone.startswith(region + "-") and not (zone[:-1] == region):
            raise block.error(f"zones[{i}]", f"{zone!r} is not a zone of region {region}")
    instance_type = _checked(block, "instanceType", INSTANCE_TYPE, "an instance type (e.g. t3.micro)",
                             DEFAULT_INSTANCE_TYPE)
    ami = block.str("ami", DEFAULT_AMI)
    assert ami is not None
    _image(block, "ami", ami, "ami")
    amis = tuple(block.str_list("amis"))
    for i, value in enumerate(amis):
        _image(block, "amis", value, f"amis[{i}]")
    max_instances = block.int("maxInstances", None, minimum=0)
    credentials_file = block.str("credentialsFile")
    profile = block.str("profile")
    instance_profile = _checked(block, "instanceProfile", INSTANCE_PROFILE, "an instance profile name or ARN")
    return AwsSettings(
        region=region,
        zones=zones,
        instance_type=instance_type or DEFAULT_INSTANCE_TYPE,
        instance_types=_checked_list(block, "instanceTypes", INSTANCE_TYPE, "an instance type (e.g. t3.small)"),
        ami=ami,
        amis=amis,
        subnets=_subnets(block, zones),
        external_ip=bool(block.bool("externalIP", True)),
        instance_profile=instance_profile,
        security_group=_security_group(block),
        max_instances=max_instances,
        credentials_file=credentials_file,
        profile=profile,
        endpoint_url=endpoint_url(block, "endpointUrl", "https://ec2.eu-west-1.amazonaws.com"),
        request_timeout=_positive(block, "requestTimeout", 30.0),
        max_attempts=int(block.int("maxAttempts", 3, minimum=1, maximum=10) or 3),
        wire_logging=wire_logging(block),
    )


def _positive(block: Reader, key: str, default: float) -> float:
    value = block.duration(key, default)
    if not value or value <= 0:
        raise block.error(key, "must be greater than 0")
    return value
