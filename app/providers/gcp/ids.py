"""GCE provider IDs, zone choice and resource paths (pure; no SDK import).

A gcp provider ID is ``projects/<project>/zones/<zone>/instances/<name>``: enough
to find the instance with no other state.  Zones and names are RFC 1035 labels and projects
never contain ``/``, so the ID always splits back into its three parts.
"""

from __future__ import annotations

import hashlib
import re

from app.providers.gcp.config import PROJECT_ID, RFC1035

_ID = re.compile(r"^projects/(?P<project>[^/]+)/zones/(?P<zone>[^/]+)/instances/(?P<name>[^/]+)$")


def provider_id(project: str, zone: str, name: str) -> str:
    """Return ``projects/<project>/zones/<zone>/instances/<name>``."""
    return f"projects/{project}/zones/{zone}/instances/{name}"


def parse_provider_id(value: str) -> tuple[str, str, str]:
    """Split a gcp provider ID.

    Returns:
        ``(project, zone, name)``.
    Raises:
        ValueError: ``value`` is not ``projects/<p>/zones/<z>/instances/<name>`` with a valid
            project ID, zone and instance name.
    """
    m = _ID.match(value or "")
    if not m:
        raise ValueError(f"not a gcp provider ID (projects/<p>/zones/<z>/instances/<name>): {value!r}")
    project, zone, name = m.group("project", "zone", "name")
    if not PROJECT_ID.match(project) or not RFC1035.match(zone) or not RFC1035.match(name):
        raise ValueError(f"malformed gcp provider ID: {value!r}")
    return project, zone, name


def pick_zone(name: str, zones: tuple[str, ...] | list[str]) -> str:
    """Return the zone for instance ``name`` out of ``zones``, the same in every process.

    The index is ``sha256(name) mod len(zones)``: names are uniformly distributed hashes, so
    instances spread evenly, and a retried create always lands in the zone it tried before
    (which keeps create idempotent by name).

    Raises:
        ValueError: ``zones`` is empty.
    """
    if not zones:
        raise ValueError("no zone: set spec.placement.zone or the provider's gcp.zones")
    index = int.from_bytes(hashlib.sha256(name.encode("utf-8")).digest()[:8], "big") % len(zones)
    return zones[index]


def region_of(zone: str) -> str:
    """Return the region of ``zone`` (``europe-west1-b`` -> ``europe-west1``)."""
    return zone.rsplit("-", 1)[0]


def machine_type_path(zone: str, machine_type: str) -> str:
    """Return a zone-qualified machine type (``zones/<z>/machineTypes/<t>``) unless already a path."""
    return machine_type if "/" in machine_type else f"zones/{zone}/machineTypes/{machine_type}"


def network_path(project: str, network: str) -> str:
    """Return ``projects/<p>/global/networks/<n>`` for a bare network name, else ``network``."""
    return network if "/" in network else f"projects/{project}/global/networks/{network}"


def subnetwork_path(project: str, zone: str, subnetwork: str) -> str:
    """Return ``projects/<p>/regions/<region of zone>/subnetworks/<s>`` for a bare name, else ``subnetwork``."""
    if "/" in subnetwork:
        return subnetwork
    return f"projects/{project}/regions/{region_of(zone)}/subnetworks/{subnetwork}"


def last_segment(url: str) -> str:
    """Return the last path segment of a GCE resource URL (``.../zones/europe-west1-b`` -> ``europe-west1-b``)."""
    return url.rstrip("/").rsplit("/", 1)[-1]


def firewall_name(prefix: str, port: int) -> str:
    """Return the firewall rule name for Squid port ``port``: ``<prefix>-<port>``, at most 63 characters.

    A prefix that would make the name too long is shortened and suffixed with a hash of the
    full prefix, so two long provider names never share a rule.
    """
    name = f"{prefix}-{port}"
    if len(name) <= 63:
        return name
    digest = hashlib.sha256(prefix.encode("utf-8")).hexdigest()[:8]
    keep = 63 - len(f"-{digest}-{port}")
    return f"{prefix[:keep].rstrip('-')}-{digest}-{port}"
