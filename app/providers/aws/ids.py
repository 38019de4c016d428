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


def client_token(name: str, zone: str, generation: int, day: str, shape: str = "") -> str:
    """Return the ``ClientToken`` of a RunInstances call (at most 64 ASCII characters).

    EC2 answers a repeated RunInstances with the same token with the instance the first call
    launched, so a create whose answer was lost never launches a second instance.  A token is
    remembered for a long time after its instance terminated, so a replacement (after an
    interruption) must use another one: ``generation`` is the number of terminated instances of
    ``name`` EC2 still shows, and ``day`` (UTC ``YYYYMMDD``) keeps a token from being reused
    once those have aged out of the listings.  ``shape`` (image, instance type, capacity) is part
    of it too: EC2 refuses a known token with other parameters (``IdempotentParameterMismatch``).
    """
    digest = hashlib.sha256(f"{name}/{zone}/{generation}/{day}/{shape}".encode()).hexdigest()[:24]
    return f"{name}-{digest}"[:64]
