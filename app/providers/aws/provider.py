"""The aws provider: EC2 instances through boto3.

Implements the contract of :mod:`app.providers.base`:

* ``create`` launches one instance named ``request.name`` (its ``Name`` tag) in ``request.zone``
  (else a zone of ``aws.zones`` picked from the name) with ``RunInstances``: the instance type and
  AMI from the allow-lists (an ``ssm:`` AMI resolved with ``ssm:GetParameter``), the security
  group (:meth:`AwsProvider.security_group`), IMDSv2 only, the tags at launch (``Name``,
  ``managed-by``, ``proxy-uid``, ``proxy-operator-provider``) and the user-data of
  :mod:`app.providers.aws.bootstrap`; idempotent by name (a live instance of that name in the
  zone is returned) and by ``ClientToken`` (a retried call whose answer was lost); a one-time
  spot instance for ``capacity: Spot``.
* ``get`` finds the instance by its ``Name`` tag in the zone: the live one if any, else the last
  terminated one (``Terminated``, with an :class:`~app.providers.base.InstanceNote` when EC2
  reclaimed a spot instance); none -> ``NotFound``.
* ``delete`` re-reads, refuses an instance without our tags (NotManaged) and terminates it; an
  instance already gone, shutting down or terminated is success.
* ``abandon`` adds the tag ``abandoned=true``; ``start`` starts a stopped instance.
* ``list_by_tag`` pages through ``DescribeInstances`` filtered on the managed-by and provider tags.
* ``check`` makes one ``DescribeInstances`` call (credentials, region and endpoint together).

EC2 is eventually consistent (https://docs.aws.amazon.com/ec2/latest/devguide/eventual-consistency.html):
an instance ``RunInstances`` has just returned may not show in ``DescribeInstances`` for a while.
``create`` returns the instance from the ``RunInstances`` answer itself, and a ``get`` that does not
find it yet raises ``NotFound``, which the reconciler's poll reads as "not visible yet" within its
visibility window (``app.proxy.reconcile.visibility_window``).

Nothing is dialled at construction: the session and clients are built on first use.  Errors are
mapped by :func:`app.providers.aws.classify.to_provider_error`; SDK types never leave this module.
"""

from __future__ import annotations

import logging
import os
import re
import threading
import time
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any, Callable

import boto3
import botocore.session
from botocore.config import Config

from app.config.providers import ProviderConfig
from app.errors import NotFound, Permanent, ProviderError, QuotaExceeded, Transient
from app.providers.aws import bootstrap, ids, wire
from app.providers.aws.classify import code_of, to_provider_error
from app.providers.aws.config import AwsSettings
from app.providers.base import (INTERRUPTED, CheckableProvider, CreateRequest, Instance, InstanceNote, InstanceState,
                                ListResult, Provider, TargetVerdict, require_managed)
from app.resources import CAPACITY_SPOT
from app.providers.placement import refuse_port, refuse_unlisted
from app.providers.naming import ABANDONED, MANAGED_BY, TAG_ABANDONED, TAG_MANAGED_BY

log = logging.getLogger("proxy_operator.aws")

#: Tag carrying the instance name (EC2's console shows it).
TAG_NAME = "Name"
#: Tag carrying the provider's name: two aws providers in one account and region list (and so
#: collect) only their own instances.
TAG_PROVIDER = "proxy-operator-provider"
#: Page size of the listings GC and ``maxInstances`` read.
LIST_PAGE_SIZE = 500
#: How long a resolved ``ssm:`` AMI is kept before it is asked for again (seconds).
AMI_CACHE_SECONDS = 600.0
#: EC2 states of an instance that runs or can run again.
LIVE_STATES = ("pending", "running", "stopping", "stopped")
#: EC2 state -> provider state (https://docs.aws.amazon.com/AWSEC2/latest/UserGuide/ec2-instance-lifecycle.html).
#: shutting-down and terminated instances can never run again.
_STATES = {
    "pending": InstanceState.PROVISIONING,
    "running": InstanceState.RUNNING,
    "stopping": InstanceState.STOPPED,
    "stopped": InstanceState.STOPPED,
    "shutting-down": InstanceState.TERMINATED,
    "terminated": InstanceState.TERMINATED,
}
#: ``StateReason.Code`` values of an instance EC2 reclaimed from the spot market.
SPOT_INTERRUPTION_CODES = frozenset({"Server.SpotInstanceTermination", "Server.SpotInstanceShutdown"})


#: Seconds after a spot interruption during which ``get`` reports the reclaimed instance (Terminated,
#: with the interruption note) instead of NotFound: long enough for a poll to see it, short enough
#: that a Proxy deleted meanwhile waits at most this long for EC2 to stop listing it.
INTERRUPTION_WINDOW = 600.0
_TRANSITION_TIME = re.compile(r"\((\d{4}-\d{2}-\d{2} \d{2}:\d{2}:\d{2}) (?:GMT|UTC)\)")

#: The taxonomy class a call's ``*.NotFound`` answer becomes (the class's own ``type`` attribute shadows the builtin).
ErrorClass = type[ProviderError]


@dataclass(frozen=True)
class _Clients:
    ec2: Any
    ssm: Any


def state_of(ec2_state: str) -> InstanceState:
    """Map an EC2 instance state name onto :class:`InstanceState` (unknown -> Provisioning)."""
    return _STATES.get((ec2_state or "").lower(), InstanceState.PROVISIONING)


def _tags(raw: list[dict[str, str]] | None) -> dict[str, str]:
    return {t["Key"]: t.get("Value", "") for t in raw or () if "Key" in t}


def _created(value: Any) -> datetime | None:
    if isinstance(value, datetime):
        return value if value.tzinfo else value.replace(tzinfo=timezone.utc)
    return None


def interruption_note(raw: dict[str, Any]) -> InstanceNote | None:
    """Return the note of an instance EC2 reclaimed from the spot market, else ``None``.

    EC2 terminates (or stops) a reclaimed spot instance with ``StateReason.Code``
    ``Server.SpotInstanceTermination`` (https://docs.aws.amazon.com/AWSEC2/latest/UserGuide/spot-interruptions.html).
    """
    reason = raw.get("StateReason") or {}
    if reason.get("Code") in SPOT_INTERRUPTION_CODES:
        return InstanceNote(reason=INTERRUPTED, message=f"EC2 reclaimed the spot instance {raw.get('InstanceId')} "
                                                        f"({reason.get('Code')})", degraded=True)
    return None


def _recent(raw: dict[str, Any], window: float) -> bool:
    """Whether the state transition EC2 records (``StateTransitionReason``, ``"... (YYYY-MM-DD HH:MM:SS GMT)"``)
    happened less than ``window`` seconds ago; ``False`` when it carries no time."""
    m = _TRANSITION_TIME.search(str(raw.get("StateTransitionReason") or ""))
    if not m:
        return False
    at = datetime.strptime(m.group(1), "%Y-%m-%d %H:%M:%S").replace(tzinfo=timezone.utc)
    return (datetime.now(timezone.utc) - at).total_seconds() < window


def to_instance(raw: dict[str, Any], region: str) -> Instance:
    """Convert one ``DescribeInstances``/``RunInstances`` instance into an :class:`Instance`."""
    tags = _tags(raw.get("Tags"))
    zone = (raw.get("Placement") or {}).get("AvailabilityZone") or ""
    name = tags.get(TAG_NAME, raw.get("InstanceId", ""))
    state = state_of((raw.get("State") or {}).get("Name", ""))
    address = raw.get("PublicIpAddress") or raw.get("PrivateIpAddress") or None
    return Instance(provider_id=ids.provider_id(region, zone, name), name=name, state=state,
                    address=address if state is InstanceState.RUNNING else None,
                    created=_created(raw.get("LaunchTime")), tags=tags, zone=zone or None,
                    note=interruption_note(raw) if state is InstanceState.TERMINATED else None)


def _launched(raw: dict[str, Any]) -> datetime:
    """The launch time of a described instance (the earliest time when EC2 gives none)."""
    return _created(raw.get("LaunchTime")) or datetime.min.replace(tzinfo=timezone.utc)


def _ec2_tags(tags: dict[str, str]) -> list[dict[str, str]]:
    return [{"Key": k, "Value": v} for k, v in tags.items()]


class AwsProvider(Provider, CheckableProvider):
    """A configured aws provider (see the module docstring); it has checks.

    Args:
        pc: the provider's config entry; ``pc.settings`` is an :class:`AwsSettings`.
    Raises:
        TypeError: ``pc.settings`` is not an :class:`AwsSettings` (a wiring bug).
    """

    type = "aws"
    #: The htpasswd travels in the user-data, so a rotated Secret means a new instance.
    credentials_in_instance = True

    def __init__(self, pc: ProviderConfig) -> None:
        if not isinstance(pc.settings, AwsSettings):
            raise TypeError(f"AwsProvider needs AwsSettings, got {type(pc.settings).__name__}")
        self.name = pc.name
        self.settings: AwsSettings = pc.settings
        self.check_timeout = pc.check_timeout or self.settings.request_timeout
        self._lock = threading.Lock()
        self._clients: _Clients | None = None
        self._group_id: str | None = self.settings.security_group.id
        self._group_checked = False
        self._amis: dict[str, tuple[str, float]] = {}
        if self.settings.credentials_file and not os.access(self.settings.credentials_file, os.R_OK):
            log.warning("aws provider %s: credentialsFile %s is not readable (yet)",
                        self.name, self.settings.credentials_file)

    # -- clients -----------------------------------------------------------------------
    def _api(self) -> _Clients:
        """Build the session and clients once (thread-safe); a failure is retried on the next call.

        Raises:
            Transient: ``aws.credentialsFile`` does not exist (yet): a Secret mounted later heals.
            Permanent: the profile does not exist.
        """
        with self._lock:
            if self._clients is None:
                s = self.settings
                wire.bridge()  # before the SDK makes its first record
                if s.credentials_file and not os.path.exists(s.credentials_file):
                    raise Transient(f"aws provider {self.name}: credentialsFile {s.credentials_file} "
                                    "does not exist (yet)")
                core = botocore.session.Session()
                if s.credentials_file:
                    core.set_config_variable("credentials_file", s.credentials_file)
                if s.profile:
                    core.set_config_variable("profile", s.profile)
                try:
                    session = boto3.Session(botocore_session=core, region_name=s.region)
                except Exception as exc:  # ProfileNotFound and the like: classified
                    raise to_provider_error(exc, "session") from exc
                config = Config(connect_timeout=s.request_timeout, read_timeout=s.request_timeout,
                                retries={"mode": "standard", "total_max_attempts": s.max_attempts},
                                user_agent_extra="proxy-operator")

                def make(service: str) -> Any:
                    client = session.client(service, endpoint_url=s.endpoint_url, config=config)
                    wire.attach(client, self.name, enabled=s.wire_logging.enabled,
                                full_payloads=s.wire_logging.full_payloads)
                    return client

                self._clients = _Clients(ec2=make("ec2"), ssm=make("ssm"))
            return self._clients

    def _call(self, what: str, fn: Callable[[], Any], *, on_404: ErrorClass = NotFound) -> Any:
        """Run one SDK call; log one DEBUG line with outcome and duration; classify failures."""
        start = time.monotonic()
        try:
            result = fn()
        except Exception as exc:
            err = to_provider_error(exc, what, on_404=on_404)
            log.debug("aws %s: %s (%.3fs)", what, err.reason, time.monotonic() - start)
            raise err from exc
        log.debug("aws %s: ok (%.3fs)", what, time.monotonic() - start)
        return result

    def _describe(self, what: str, filters: list[dict[str, Any]], page_size: int | None = None,
                  pages: int | None = None) -> list[dict[str, Any]]:
        """Every instance ``DescribeInstances`` gives for ``filters``, over every page (or ``pages``)."""
        ec2 = self._api().ec2

        def read() -> list[dict[str, Any]]:
            out: list[dict[str, Any]] = []
            kwargs: dict[str, Any] = {"Filters": filters}
            if page_size:
                kwargs["MaxResults"] = page_size
            n = 0
            while True:
                answer = ec2.describe_instances(**kwargs)
                for reservation in answer.get("Reservations", ()):
                    out.extend(reservation.get("Instances", ()))
                n += 1
                token = answer.get("NextToken")
                if not token or (pages is not None and n >= pages):
                    return out
                kwargs["NextToken"] = token

        return self._call(what, read)

    def _by_name(self, zone: str, name: str) -> list[dict[str, Any]]:
        """The instances tagged ``Name=name`` in ``zone`` (terminated ones EC2 still shows included)."""
        return self._describe(f"DescribeInstances {zone}/{name}", [
            {"Name": f"tag:{TAG_NAME}", "Values": [name]},
            {"Name": "availability-zone", "Values": [zone]}])

    @staticmethod
    def _live(found: list[dict[str, Any]]) -> list[dict[str, Any]]:
        live = [i for i in found if (i.get("State") or {}).get("Name") in LIVE_STATES]
        return sorted(live, key=lambda i: i.get("LaunchTime") or datetime.min.replace(tzinfo=timezone.utc))

    # -- contract ----------------------------------------------------------------------
    def instance_ids(self, name: str, namespace: str, zone: str | None = None) -> list[str]:
        """Return the provider IDs an instance named ``name`` may have, the one :meth:`create` uses first.

        First ``regions/<region>/zones/<zone>/instances/<name>`` for ``zone`` (else the zone
        :func:`~app.providers.aws.ids.pick_zone` picks), then every other configured zone.

        Raises:
            Permanent: no zone is given and none is configured.
        """
        s = self.settings
        try:
            first = zone or ids.pick_zone(name, s.zones)
        except ValueError as exc:
            raise Permanent(f"aws provider {self.name}: {exc}") from exc
        return [ids.provider_id(s.region, z, name) for z in [first] + [z for z in s.zones if z != first]]

    def check_placement(self, request: CreateRequest) -> None:
        """Refuse a zone, image, instance type or port the providers config does not list.

        Raises:
            SpecNotAllowed: naming ``spec.placement.zone`` (``aws.zones``), ``spec.placement.image``
                (``aws.ami``/``amis``), ``spec.placement.machineType`` (``aws.instanceType``/
                ``instanceTypes``) or ``spec.endpoint.port`` (``aws.securityGroup.ports``).
        """
        s = self.settings
        checks = (("spec.placement.zone", request.zone, s.zones, "aws.zones"),
                  ("spec.placement.image", request.image, s.allowed_images(), "aws.ami/amis"),
                  ("spec.placement.machineType", request.machine_type, s.allowed_instance_types(),
                   "aws.instanceType/instanceTypes"))
        refuse_unlisted(self.name, checks)
        refuse_port(self.name, request.port, s.security_group.ports, "aws.securityGroup.ports",
                    "each port is an ingress rule to every proxy instance")

    def create(self, request: CreateRequest) -> Instance:
        """Launch the instance ``request.name`` (idempotent by name) and return it.

        Raises:
            SpecNotAllowed: (Permanent) a placement or port the config does not allow; nothing is sent.
            Permanent: user-data that is not UTF-8 or too large, an AMI or parameter EC2 refuses,
                missing permissions.
            QuotaExceeded: EC2's limits or capacity, or ``aws.maxInstances`` reached.
            Transient: throttling, 5xx, timeouts, connection errors.
        """
        s = self.settings
        self.check_placement(request)
        try:
            zone = request.zone or ids.pick_zone(request.name, s.zones)
        except ValueError as exc:
            raise Permanent(f"aws provider {self.name}: {exc}") from exc
        pid = ids.provider_id(s.region, zone, request.name)
        found = self._by_name(zone, request.name)
        live = self._live(found)
        if live:
            log.info("aws create %s: already exists (%s); returning it", pid, live[-1].get("InstanceId"))
            return to_instance(live[-1], s.region)
        self._check_limit(request.name)
        try:
            data = bootstrap.user_data(user=request.user_data, squid_config=request.squid_config,
                                       egress_rules=request.egress_rules, htpasswd=request.auth_htpasswd)
        except ValueError as exc:
            raise Permanent(f"aws provider {self.name}: {exc}") from None
        group = self.security_group()
        image = self._image(request.image or s.ami)
        ended = [i for i in found if i not in live]  # terminated ones EC2 still shows
        previous = str(max(ended, key=_launched).get("InstanceId") or "") if ended else ""
        instance_type = request.machine_type or s.instance_type
        token = ids.client_token(request.name, zone, previous, datetime.now(timezone.utc).strftime("%Y%m%d"),
                                 f"{image}/{instance_type}/{request.capacity}")
        tags = {TAG_NAME: request.name, **request.tags, TAG_PROVIDER: self.name}
        nic: dict[str, Any] = {"DeviceIndex": 0, "Groups": [group], "AssociatePublicIpAddress": s.external_ip,
                               "DeleteOnTermination": True}
        if zone in s.subnets:
            nic["SubnetId"] = s.subnets[zone]
        params: dict[str, Any] = {
            "ImageId": image, "InstanceType": instance_type, "MinCount": 1, "MaxCount": 1,
            "ClientToken": token, "UserData": data, "Placement": {"AvailabilityZone": zone},
            "NetworkInterfaces": [nic],
            "MetadataOptions": {"HttpTokens": "required", "HttpPutResponseHopLimit": 1, "HttpEndpoint": "enabled"},
            "TagSpecifications": [{"ResourceType": "instance", "Tags": _ec2_tags(tags)},
                                  {"ResourceType": "volume", "Tags": _ec2_tags(tags)}],
        }
        if request.capacity == CAPACITY_SPOT:
            # One-time spot: EC2 terminates it when it reclaims the capacity (no restart, no
            # persistent request left behind); the poll replaces it (InstanceInterrupted).
            params["InstanceMarketOptions"] = {"MarketType": "spot", "SpotOptions": {
                "SpotInstanceType": "one-time", "InstanceInterruptionBehavior": "terminate"}}
        if s.instance_profile:
            key = "Arn" if s.instance_profile.startswith("arn:") else "Name"
            params["IamInstanceProfile"] = {key: s.instance_profile}
        ec2 = self._api().ec2
        answer = self._call(f"RunInstances {pid}", lambda: ec2.run_instances(**params), on_404=Permanent)
        [raw] = answer.get("Instances") or [{}]
        log.info("aws instance %s launched as %s", pid, raw.get("InstanceId"))
        inst = to_instance({**raw, "Tags": raw.get("Tags") or _ec2_tags(tags)}, s.region)
        return inst if inst.zone else Instance(provider_id=pid, name=request.name, state=inst.state,
                                                address=inst.address, created=inst.created, tags=inst.tags,
                                                zone=zone)

    def _check_limit(self, name: str) -> None:
        """Refuse a create beyond ``aws.maxInstances`` live instances of this provider.

        Raises:
            QuotaExceeded: the limit is reached (the quota backoff path: the create is retried
                much later, and goes through once an instance is gone).
        """
        limit = self.settings.max_instances
        if limit is None:
            return
        live = self._describe(f"DescribeInstances (maxInstances of {self.name})", [
            {"Name": f"tag:{TAG_PROVIDER}", "Values": [self.name]},
            {"Name": "instance-state-name", "Values": list(LIVE_STATES)}], LIST_PAGE_SIZE)
        names = {_tags(i.get("Tags")).get(TAG_NAME) for i in live}
        if len(live) >= limit and name not in names:
            raise QuotaExceeded(f"aws provider {self.name}: aws.maxInstances is {limit} and {len(live)} instances "
                                "run; this Proxy is created once one of them is gone or the limit is raised")

    def _image(self, image: str) -> str:
        """Return the AMI ID of ``image``: itself, or the value of its ``ssm:`` parameter (cached).

        Raises:
            Permanent: the parameter does not exist or does not hold an AMI ID.
        """
        if not image.startswith("ssm:"):
            return image
        now = time.monotonic()
        cached = self._amis.get(image)
        if cached and now - cached[1] < AMI_CACHE_SECONDS:
            return cached[0]
        name = image.removeprefix("ssm:")
        ssm = self._api().ssm
        answer = self._call(f"GetParameter {name}", lambda: ssm.get_parameter(Name=name), on_404=Permanent)
        value = str((answer.get("Parameter") or {}).get("Value") or "")
        if not value.startswith("ami-"):
            # Not echoed: a parameter named by mistake may hold anything, a secret included.
            raise Permanent(f"aws provider {self.name}: SSM parameter {name} does not hold an AMI ID (ami-...)")
        self._amis[image] = (value, now)
        return value

    def security_group(self) -> str:
        """Return the ID of the security group instances get, ensuring it first when configured.

        With ``securityGroup.id`` that group as it is.  With ``ensure``: the group ``name``
        (``proxy-operator-<provider>``) in ``vpcId`` (the default VPC), created when missing and
        tagged ``managed-by``; its ingress rules made exactly TCP ``ports`` from ``sourceRanges``
        (missing ones authorized, every other one revoked: other CIDRs, ports and protocols, and
        rules from another security group or a prefix list).  Egress is left as EC2 makes it; the guest's
        nftables rules (:mod:`app.squid.egress`) restrict Squid's own.  Checked once per process.

        Raises:
            Permanent: EC2 refused (``UnauthorizedOperation``: the IAM policy lacks the
                security-group actions of docs/aws-provider.md), or the VPC does not exist.
            QuotaExceeded / Transient: as for any call.
        """
        sg = self.settings.security_group
        if self._group_id and (sg.id or self._group_checked):
            return self._group_id
        ec2 = self._api().ec2
        name = sg.name or f"proxy-operator-{self.name}"
        filters = [{"Name": "group-name", "Values": [name]}]
        if sg.vpc_id:
            filters.append({"Name": "vpc-id", "Values": [sg.vpc_id]})
        what = f"security group {name}"
        groups = self._call(f"DescribeSecurityGroups {name}",
                            lambda: ec2.describe_security_groups(Filters=filters)).get("SecurityGroups", [])
        if groups:
            group = groups[0]
        else:
            params: dict[str, Any] = {
                "GroupName": name, "Description": f"proxy-operator provider {self.name}: clients to Squid",
                "TagSpecifications": [{"ResourceType": "security-group", "Tags": _ec2_tags(
                    {TAG_MANAGED_BY: MANAGED_BY, TAG_PROVIDER: self.name})}]}
            if sg.vpc_id:
                params["VpcId"] = sg.vpc_id
            try:
                created = self._call(f"CreateSecurityGroup {name}", lambda: ec2.create_security_group(**params),
                                     on_404=Permanent)
            except ProviderError as exc:
                if code_of(exc.__cause__ or exc) != "InvalidGroup.Duplicate":
                    raise
                created = self._call(f"DescribeSecurityGroups {name}", lambda: ec2.describe_security_groups(
                    Filters=filters))["SecurityGroups"][0]
            group = {"GroupId": created["GroupId"], "IpPermissions": created.get("IpPermissions", [])}
            log.info("aws %s created (%s)", what, group["GroupId"])
        group_id = group["GroupId"]
        want = {(p, cidr) for p in sg.ports for cidr in sg.source_ranges}
        have: set[tuple[int, str]] = set()
        extra: list[dict[str, Any]] = []
        for perm in group.get("IpPermissions", []):
            port = perm.get("FromPort")
            same_port = perm.get("IpProtocol") == "tcp" and port == perm.get("ToPort")
            head = {k: perm[k] for k in ("IpProtocol", "FromPort", "ToPort") if k in perm}
            for ranges_key, cidr_key in (("IpRanges", "CidrIp"), ("Ipv6Ranges", "CidrIpv6")):
                for rng in perm.get(ranges_key, []):
                    key = (port, rng.get(cidr_key))
                    if same_port and key in want:
                        have.add(key)
                    else:
                        extra.append({**head, ranges_key: [{cidr_key: rng.get(cidr_key)}]})
            # Rules from another security group or a prefix list are never ours.
            for pair in perm.get("UserIdGroupPairs", []):
                extra.append({**head, "UserIdGroupPairs": [{k: pair[k] for k in ("GroupId", "UserId") if pair.get(k)}]})
            for plist in perm.get("PrefixListIds", []):
                extra.append({**head, "PrefixListIds": [{"PrefixListId": plist.get("PrefixListId")}]})
        missing = sorted(want - have)
        if missing:
            perms = [{"IpProtocol": "tcp", "FromPort": p, "ToPort": p,
                      **({"Ipv6Ranges": [{"CidrIpv6": c, "Description": "proxy-operator clients"}]} if ":" in c else
                         {"IpRanges": [{"CidrIp": c, "Description": "proxy-operator clients"}]})}
                     for p, c in missing]
            self._call(f"AuthorizeSecurityGroupIngress {group_id}", lambda: ec2.authorize_security_group_ingress(
                GroupId=group_id, IpPermissions=perms))
        if extra:
            log.info("aws %s: revoking %d ingress rule(s) the configuration does not list", what, len(extra))
            self._call(f"RevokeSecurityGroupIngress {group_id}", lambda: ec2.revoke_security_group_ingress(
                GroupId=group_id, IpPermissions=extra))
        self._group_id, self._group_checked = group_id, True
        return group_id

    def get(self, provider_id: str) -> Instance:
        """Return the instance behind ``provider_id``: the live one of that name, else the last one ended.

        An instance shutting down is ``Terminated`` (it still exists: a delete waits for it); a
        terminated one is gone (``NotFound``), unless EC2 reclaimed it from the spot market less
        than :data:`INTERRUPTION_WINDOW` ago: then it is ``Terminated`` with the note
        :data:`~app.providers.base.INTERRUPTED`, so the poll replaces it as interrupted.

        Raises:
            Permanent: a malformed provider ID, or a refused request.
            NotFound: EC2 shows no instance of that name in the zone (none, not yet, or terminated).
            QuotaExceeded / Transient: see :func:`app.providers.aws.classify.to_provider_error`.
        """
        _, zone, name = self._parse(provider_id)
        found = self._by_name(zone, name)
        if not found:
            raise NotFound(f"aws instance {provider_id} does not exist")
        live = self._live(found)
        if live:
            return to_instance(live[-1], self.settings.region)
        last = max(found, key=lambda i: i.get("LaunchTime") or datetime.min.replace(tzinfo=timezone.utc))
        state = (last.get("State") or {}).get("Name")
        if state == "terminated" and not (interruption_note(last) and _recent(last, INTERRUPTION_WINDOW)):
            # Gone: EC2 lists terminated instances for about an hour, but they are nothing to wait for.
            raise NotFound(f"aws instance {provider_id} is terminated ({last.get('InstanceId')})")
        return to_instance(last, self.settings.region)

    def delete(self, provider_id: str) -> None:
        """Terminate the live instance(s) of that name if ours; an instance already gone is success.

        Raises:
            NotManaged: (Permanent) the instance is not ours; it is left in place.
            Permanent: a malformed provider ID, or a refused request.
            QuotaExceeded / Transient: throttling, 5xx, timeouts.
        """
        _, zone, name = self._parse(provider_id)
        live = self._live(self._by_name(zone, name))
        if not live:
            log.debug("aws delete %s: already gone", provider_id)
            return
        for raw in live:
            require_managed(_tags(raw.get("Tags")), self.name, provider_id)
        instance_ids = [raw["InstanceId"] for raw in live]
        ec2 = self._api().ec2
        try:
            self._call(f"TerminateInstances {provider_id}", lambda: ec2.terminate_instances(InstanceIds=instance_ids))
        except NotFound:
            log.debug("aws delete %s: gone meanwhile", provider_id)
            return
        log.info("aws instance %s (%s) terminating", provider_id, ", ".join(instance_ids))

    def abandon(self, provider_id: str) -> None:
        """Tag the live instance ``abandoned=true``; an instance already gone or marked is success.

        Raises:
            Permanent: a malformed provider ID, or a refused request.
            QuotaExceeded / Transient: as for any call.
        """
        _, zone, name = self._parse(provider_id)
        live = self._live(self._by_name(zone, name))
        todo = [raw["InstanceId"] for raw in live if _tags(raw.get("Tags")).get(TAG_ABANDONED) != ABANDONED]
        if not todo:
            return
        ec2 = self._api().ec2
        try:
            self._call(f"CreateTags {provider_id}", lambda: ec2.create_tags(
                Resources=todo, Tags=[{"Key": TAG_ABANDONED, "Value": ABANDONED}]))
        except NotFound:
            return
        log.info("aws instance %s marked abandoned", provider_id)

    def start(self, provider_id: str) -> None:
        """Start a stopped instance again (the same instance); a running or pending one is left alone.

        Raises:
            NotFound: no live instance of that name.
            Transient: the instance is still stopping.
            QuotaExceeded: EC2 has no capacity to start it (``InsufficientInstanceCapacity``).
        """
        _, zone, name = self._parse(provider_id)
        live = self._live(self._by_name(zone, name))
        if not live:
            raise NotFound(f"aws instance {provider_id} does not exist")
        raw = live[-1]
        state = (raw.get("State") or {}).get("Name")
        if state == "stopping":
            raise Transient(f"aws instance {provider_id} is stopping; it can be started once it has stopped")
        if state != "stopped":
            return
        ec2 = self._api().ec2
        self._call(f"StartInstances {provider_id}", lambda: ec2.start_instances(InstanceIds=[raw["InstanceId"]]))
        log.info("aws instance %s was stopped; started", provider_id)

    def list_by_tag(self, tag: str) -> ListResult:
        """Return every live instance of this provider tagged ``managed-by=<tag>``, over every page.

        Raises:
            QuotaExceeded / Transient / Permanent: the listing failed as a whole.
        """
        found = self._describe(f"DescribeInstances managed-by={tag} (all pages)", [
            {"Name": f"tag:{TAG_MANAGED_BY}", "Values": [tag]},
            {"Name": f"tag:{TAG_PROVIDER}", "Values": [self.name]},
            {"Name": "instance-state-name", "Values": list(LIVE_STATES)}], LIST_PAGE_SIZE)
        return ListResult(instances=[to_instance(raw, self.settings.region) for raw in found])

    def check(self) -> list[TargetVerdict]:
        """Ask EC2 for one page of this provider's instances; never raises.

        Returns:
            one :class:`TargetVerdict` named after the region.
        """
        region = self.settings.region
        try:
            found = self._describe(f"check {region}", [
                {"Name": f"tag:{TAG_PROVIDER}", "Values": [self.name]},
                {"Name": "instance-state-name", "Values": list(LIVE_STATES)}], 5, pages=1)
        except Exception as exc:  # noqa: BLE001 - a check reports, it never raises
            err = to_provider_error(exc, f"check {region}")
            return [TargetVerdict(name=region, ready=False, reason=err.reason, message=str(err))]
        return [TargetVerdict(name=region, ready=True, reason="Ready", message=f"EC2 answered in {region}",
                              details={"liveInstancesOnFirstPage": str(len(found))})]

    # -- helpers -----------------------------------------------------------------------
    def _parse(self, provider_id: str) -> tuple[str, str, str]:
        try:
            region, zone, name = ids.parse_provider_id(provider_id)
        except ValueError as exc:
            raise Permanent(f"aws provider {self.name}: {exc}") from exc
        if region != self.settings.region:
            raise Permanent(f"aws provider {self.name}: {provider_id} is in region {region}, "
                            f"not {self.settings.region}")
        return region, zone, name
