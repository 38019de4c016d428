"""The ``gcp:`` block of a providers-config entry (no SDK import here).

Shape (every key but ``project`` optional; docs/gcp-provider.md is the user reference)::

    gcp:
      project: demo-project
      zones: [europe-west1-b, europe-west1-c]   # required: where instances go, and the only zones a Proxy may name
      machineType: e2-micro
      machineTypes: [e2-small]          # other machine types a Proxy may name (machineType always allowed)
      image: projects/debian-cloud/global/images/family/debian-12
      images: [projects/my-project/global/images/squid-2026]   # other images a Proxy may name
      network: default
      subnetwork: proxies-eu            # optional
      networkTags: [proxy-operator]
      externalIP: true
      serviceAccount: proxy-vm@demo-project.iam.gserviceaccount.com   # optional
      serviceAccountScopes: [logging.write, monitoring.write]          # optional: the default
      credentialsFile: /var/run/secrets/gcp/key.json                   # optional; else ADC
      apiEndpoint: https://compute.googleapis.com                      # testing / private endpoints
      anonymous: false                  # only with apiEndpoint: a local fake or emulator
      requestTimeout: 30s
      operationTimeout: 5m
      # firewall ports: the only spec.endpoint.port values allowed while ensure is on
      firewall: {ensure: false, sourceRanges: [10.0.0.0/8], ports: [3128]}
      wireLogging: {enabled: false, fullPayloads: false}

Every check raises :class:`app.config.validation.ConfigError` naming the file, the provider and the
dotted field (``gcp.firewall.sourceRanges[1]``), so the operator refuses to start on a bad
block instead of failing per Proxy later.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import overload

from app.config.cloud_fields import WireLogSettings, cidr_list, endpoint_url, port_list, wire_logging
from app.config.provider_types import CheckTargets
from app.config.validation import Reader

DEFAULT_IMAGE = "projects/debian-cloud/global/images/family/debian-12"
DEFAULT_MACHINE_TYPE = "e2-micro"
DEFAULT_NETWORK_TAG = "proxy-operator"

#: A GCP project ID (6-30 characters), optionally domain-scoped (``example.com:my-project``).
PROJECT_ID = re.compile(r"^(?:[a-z][-a-z0-9.]*[a-z0-9]:)?[a-z][-a-z0-9]{4,28}[a-z0-9]$")
#: An RFC 1035 label: zone names, network tags, resource names.  Never contains ``/``, so a
#: provider ID ``projects/<p>/zones/<z>/instances/<name>`` always splits back.
RFC1035 = re.compile(r"^[a-z]([-a-z0-9]{0,61}[a-z0-9])?$")
#: A resource path segment of a network/subnetwork/image/machine type: no spaces or quotes.
_RESOURCE = re.compile(r"^[A-Za-z0-9][-A-Za-z0-9_./:]*$")


@dataclass(frozen=True)
class FirewallSettings:
    """The firewall opt-in: ensure an ingress rule lets clients reach Squid.

    Attributes:
        ensure: when true, every create first ensures (creates or patches) a rule named
            ``name`` allowing TCP to the Proxy's port from ``source_ranges`` to instances
            carrying the first network tag.  Needs ``roles/compute.securityAdmin``.
        source_ranges: client CIDRs allowed to reach the proxies (required when ``ensure``).
        name: rule name prefix; the rule for port P is ``<name>-<P>``.  ``None`` means
            ``proxy-operator-<provider>``.
        ports: the only ports a Proxy may ask for (``spec.endpoint.port``) while ``ensure`` is
            on: the port becomes an ingress rule to every instance carrying the tag, so a Proxy
            author must not pick it (22 would open SSH on every proxy VM; each new port is one
            more rule).  Default ``(3128,)``.
    """

    ensure: bool = False
    source_ranges: tuple[str, ...] = ()
    name: str | None = None
    ports: tuple[int, ...] = (3128,)


@dataclass(frozen=True)
class GcpSettings(CheckTargets):
    """Settings of a gcp provider.

    Attributes:
        project: GCP project ID (required).
        zones: zones to spread instances over when a Proxy names none (the zone is picked
            deterministically from the instance name), and the only zones a Proxy may name in
            ``spec.placement.zone`` (required, non-empty).
        machine_type: default machine type (a name such as ``e2-micro``, or a
            ``zones/<z>/machineTypes/<t>`` path); always allowed.
        image: default boot image (an image or image-family path/URL); always allowed.
        images: further images a Proxy may name in ``spec.placement.image`` (exact strings).
        machine_types: further machine types a Proxy may name in ``spec.placement.machineType``
            (exact strings).
        network: VPC network name or path (default ``default``).
        subnetwork: subnetwork name or path, or ``None`` (auto-mode network).
        network_tags: network tags put on every instance; the firewall rule targets the first.
        external_ip: give instances an ephemeral external IPv4 (ONE_TO_ONE_NAT).
        service_account: e-mail of a service account to attach, or ``None`` for none (the
            instances then get no access token at all).
        service_account_scopes: the OAuth scopes of that service account's tokens on the
            instance (``serviceAccountScopes``; default :data:`DEFAULT_SERVICE_ACCOUNT_SCOPES`,
            writing logs and metrics only: Squid needs no Google API).  A VM's token can do at
            most what both its scopes and the account's IAM roles allow
            (https://cloud.google.com/compute/docs/access/service-accounts#accesscopesiam).
        credentials_file: key file (service account or external account JSON), or ``None``
            for Application Default Credentials.
        anonymous: send no credentials at all; only allowed with ``api_endpoint`` (a local
            fake or an emulator).
        api_endpoint: ``scheme://host[:port]`` of the Compute API for every client (testing
            and private endpoints), or ``None`` for ``https://compute.googleapis.com``.
        request_timeout: seconds one HTTP call may take.
        operation_timeout: seconds create/delete wait for their zone operation.
        firewall: :class:`FirewallSettings`.
        wire_logging: :class:`WireLogSettings`.
    """

    project: str
    zones: tuple[str, ...] = field(default_factory=tuple)
    machine_type: str = DEFAULT_MACHINE_TYPE
    image: str = DEFAULT_IMAGE
    network: str = "default"
    subnetwork: str | None = None
    network_tags: tuple[str, ...] = (DEFAULT_NETWORK_TAG,)
    external_ip: bool = True
    service_account: str | None = None
    service_account_scopes: tuple[str, ...] = ()
    credentials_file: str | None = None
    anonymous: bool = False
    api_endpoint: str | None = None
    request_timeout: float = 30.0
    operation_timeout: float = 300.0
    firewall: FirewallSettings = field(default_factory=FirewallSettings)
    wire_logging: WireLogSettings = field(default_factory=WireLogSettings)
    images: tuple[str, ...] = ()
    machine_types: tuple[str, ...] = ()

    def check_targets(self) -> list[str]:
        """The one check target, the project (what ``GcpProvider.check()`` names its verdict);
        none when no project is set."""
        return [self.project] if self.project else []

    def allowed_images(self) -> tuple[str, ...]:
        """Return every image a Proxy may name: ``image`` first, then ``images``."""
        return (self.image, *(i for i in self.images if i != self.image))

    def allowed_machine_types(self) -> tuple[str, ...]:
        """Return every machine type a Proxy may name: ``machine_type`` first, then ``machine_types``."""
        return (self.machine_type, *(m for m in self.machine_types if m != self.machine_type))


def _labels(block: Reader, key: str, default: list[str] | None = None, *, required: bool = False) -> list[str]:
    values = block.str_list(key, default, required=required)
    for i, value in enumerate(values):
        if not RFC1035.match(value):
            raise block.error(f"{key}[{i}]", f"{value!r} is not a lowercase RFC 1035 label "
                                             "(letters, digits, dashes; starts with a letter)")
    return values


@overload
def _resource(block: Reader, key: str, default: str) -> str: ...


@overload
def _resource(block: Reader, key: str, default: None = None) -> str | None: ...


def _resource(block: Reader, key: str, default: str | None = None) -> str | None:
    """Read a GCE resource name or path at ``key`` (``default`` when absent).

    Raises:
        app.config.validation.ConfigError: the value is not a resource name or path.
    """
    value = block.str(key, default)
    if value is not None and not _RESOURCE.match(value):
        raise block.error(key, f"{value!r} is not a resource name or path")
    return value


#: The scopes an attached service account gets by default: write logs and metrics (an ops agent),
#: nothing else.  Squid itself calls no Google API.
DEFAULT_SERVICE_ACCOUNT_SCOPES = ("https://www.googleapis.com/auth/logging.write",
                                  "https://www.googleapis.com/auth/monitoring.write")
_SCOPE_PREFIX = "https://www.googleapis.com/auth/"


def _scopes(block: Reader, service_account: str | None) -> tuple[str, ...]:
    """``serviceAccountScopes``: full scope URLs or their short names (``logging.write``).

    Raises:
        ConfigError: set without ``serviceAccount``, or an entry that is not a scope name.
    """
    if not block.has("serviceAccountScopes"):
        return DEFAULT_SERVICE_ACCOUNT_SCOPES if service_account else ()
    if service_account is None:
        raise block.error("serviceAccountScopes", "needs serviceAccount (the account whose tokens the scopes limit)")
    out = []
    for i, scope in enumerate(block.str_list("serviceAccountScopes")):
        name = scope.removeprefix(_SCOPE_PREFIX)
        if not re.fullmatch(r"[a-z][a-z0-9._-]*", name):
            raise block.error(f"serviceAccountScopes[{i}]", f"{scope!r} is not an OAuth scope "
                                                            f"(e.g. logging.write or {_SCOPE_PREFIX}logging.write)")
        out.append(_SCOPE_PREFIX + name)
    return tuple(out)


def _resources(block: Reader, key: str) -> tuple[str, ...]:
    values = block.str_list(key)
    for i, value in enumerate(values):
        if not _RESOURCE.match(value):
            raise block.error(f"{key}[{i}]", f"{value!r} is not a resource name or path")
    return tuple(values)


def _positive_duration(block: Reader, key: str, default: float) -> float:
    value = block.duration(key, default)
    if not value or value <= 0:
        raise block.error(key, "must be greater than 0")
    return value


def _firewall(block: Reader) -> FirewallSettings:
    fw = block.child("firewall")
    ensure = bool(fw.bool("ensure", False))
    ranges = cidr_list(fw, "sourceRanges")
    name = fw.str("name")
    if name is not None and (not RFC1035.match(name) or len(name) > 50):
        raise fw.error("name", f"{name!r} must be an RFC 1035 label of at most 50 characters")
    if ensure and not ranges:
        raise fw.error("sourceRanges", "required when ensure is true (the client CIDRs allowed "
                                       "to reach the proxies)")
    ports = port_list(fw, "ports", (3128,))
    fw.done()
    return FirewallSettings(ensure=ensure, source_ranges=ranges, name=name, ports=ports)


def parse(block: Reader) -> GcpSettings:
    """Parse the ``gcp`` block.

    Args:
        block: a :class:`Reader` over the block (``app.config.providers`` calls ``done()`` on it).
    Returns:
        :class:`GcpSettings`.
    Raises:
        app.config.validation.ConfigError: a missing project or zone list, a malformed value, an
            unknown key in a nested block, or an inconsistent combination (``anonymous`` without
            ``apiEndpoint`` or with ``credentialsFile``, ``firewall.ensure`` without source
            ranges or network tags), naming the field.
    """
    project = block.str("project", required=True)
    if not PROJECT_ID.match(project):
        raise block.error("project", f"{project!r} is not a GCP project ID")
    zones = _labels(block, "zones", required=True)
    if not zones:
        raise block.error("zones", "must list at least one zone (where instances go, and the zones a Proxy may name)")
    tags = _labels(block, "networkTags", [DEFAULT_NETWORK_TAG])
    service_account = block.str("serviceAccount")
    if service_account is not None and "@" not in service_account and service_account != "default":
        raise block.error("serviceAccount", f"{service_account!r} is not a service account e-mail")
    scopes = _scopes(block, service_account)
    credentials_file = block.str("credentialsFile")
    anonymous = bool(block.bool("anonymous", False))
    api_endpoint = endpoint_url(block, "apiEndpoint", "https://compute.googleapis.com")
    if anonymous and credentials_file:
        raise block.error("anonymous", "cannot be combined with credentialsFile")
    if anonymous and not api_endpoint:
        raise block.error("anonymous", "only allowed together with apiEndpoint (a local fake or emulator)")
    firewall = _firewall(block)
    if firewall.ensure and not tags:
        raise block.error("networkTags", "firewall.ensure needs at least one network tag to target")
    return GcpSettings(
        project=project,
        zones=tuple(zones),
        machine_type=_resource(block, "machineType", DEFAULT_MACHINE_TYPE),
        image=_resource(block, "image", DEFAULT_IMAGE),
        network=_resource(block, "network", "default"),
        subnetwork=_resource(block, "subnetwork"),
        network_tags=tuple(tags),
        external_ip=bool(block.bool("externalIP", True)),
        service_account=service_account,
        service_account_scopes=scopes,
        credentials_file=credentials_file,
        anonymous=anonymous,
        api_endpoint=api_endpoint,
        request_timeout=_positive_duration(block, "requestTimeout", 30.0),
        operation_timeout=_positive_duration(block, "operationTimeout", 300.0),
        firewall=firewall,
        wire_logging=wire_logging(block),
        images=_resources(block, "images"),
        machine_types=_resources(block, "machineTypes"),
    )
