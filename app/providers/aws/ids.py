"""aws provider IDs and zone choice (pure; no SDK import).

An EC2 instance ID (``i-...``) is chosen by EC2 at launch, so it cannot be known before the
create (the contract's ``instance_ids``).  The provider ID is therefore built from what *is*
known, ``regions/<region>/zones/<zone>/instances/<name>``, and the provider finds the instance
by its ``Name`` tag in that zone (every create tags the instance at launch).
"""

from __future__ import annotations

import hashlib
import re

_ID = re.compile(r"^regions/(?P<region>[a-z0-9-]+)/zones/(?P<zone>[a-z0-9-]+)/instances/(?P<name>[a-z0-9-]+)$")


def provider_id(region: str, zone: str, name: str) -> str:
    """Return ``regions/<region>/zones/<zone>/instances/<name>``."""
    return f"regions/{region}/zones/{zone}/instances/{name}"


def parse_provider_id(value: str) -> tuple[str, str, str]:
    """Split an aws provider ID.

    Returns:
        ``(region, zone, name)``.
    Raises:
        ValueError: ``value`` is not ``regions/<region>/zones/<zone>/instances/<name>``.
    """
    m = _ID.match(value or "")
    if not m:
        raise ValueError(f"not an aws provider ID (regions/<region>/zones/<zone>/instances/<name>): {value!r}")
    return m.group("region"), m.group("zone"), m.group("name")


def pick_zone(name: str, zones: tuple[str, ...] | list[str]) -> str:
    """Return the zone for instance ``name`` out of ``zones``, the same in every process.

    ``sha256(name) mod len(zones)``, as the gcp provider does: instances spread evenly and a
    retried create lands where it tried before.

    Raises:
        ValueError: ``zones`` is empty.
    """
    if not zones:
        raise ValueError("no zone: set spec.placement.zone or the provider's aws.zones")
    index = int.from_bytes(hashlib.sha256(name.encode("utf-8")).digest()[:8], "big") % len(zones)
    return zones[index]


def client_token(name: str, zone: str, previous: str, day: str, shape: str = "") -> str:
    """Return the ``ClientToken`` of a RunInstances call (at most 64 ASCII characters).

    EC2 answers a repeated RunInstances with the same token with the instance the first call
    launched, so a create whose answer was lost never launches a second instance.  A token is
    remembered for a long time after its instance terminated (EC2 then answers
    ``IdempotentInstanceTerminated``), so a replacement must use another one.  ``previous`` is the
    ID of the newest terminated instance of ``name`` EC2 still lists (``""`` for none): every launch
    ends the run of its predecessor, and an instance stops being listed only after every older one
    did, so a later launch never sees the ``previous`` an earlier one saw (a count of the listed
    instances would repeat once the oldest ages out).  ``day`` (UTC ``YYYYMMDD``) keeps the
    ``""`` case from repeating a token of another day.  ``shape`` (image, instance type, capacity)
    is part of it too: EC2 refuses a known token with other parameters
    (``IdempotentParameterMismatch``).

    Args:
        name: the instance name.
        zone: the availability zone.
        previous: the newest terminated instance ID of ``name`` still listed, or ``""``.
        day: the UTC day, ``YYYYMMDD``.
        shape: image, instance type and capacity, joined.
    Returns:
        ``<name>-<24 hex digits>``, cut to 64 characters.
    """
    digest = hashlib.sha256(f"{name}/{zone}/{previous}/{day}/{shape}".encode()).hexdigest()[:24]
    return f"{name}-{digest}"[:64]
