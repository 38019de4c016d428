"""A ProxyPool's zones: which may get new members, and the ones skipped as the status shows them.

The pool's zones are ``spec.spread.zones`` (in their order), or the template's
``placement.zone`` (``""`` when it has none: the provider as a whole decides).  A zone whose
provider target is not Ready (its ProviderHealth) gets no new member; ``status.skippedZones``
lists each such zone with that target's reason and message and since when it is skipped.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping

from app.pools.model import Pool, format_time, parse_time

#: Zones a condition message names at most (the rest are counted): messages stay bounded
#: whatever ``spec.spread.zones`` holds (up to 64 zones).
MAX_ZONES_NAMED = 10
#: Characters of a provider target's message kept in ``status.skippedZones`` and in messages.
MAX_ZONE_MESSAGE = 200
#: Characters :func:`describe_zones` spends on zones at most (a condition message is cut at 1024).
ZONES_TEXT_BUDGET = 700


@dataclass(frozen=True)
class ZoneHealth:
    """Why a zone's provider target is not Ready, as its ProviderHealth says.

    Attributes:
        target: the ProviderHealth target the zone follows (a KVM host, a GCP project, ``cluster``).
        reason: the target's reason (CamelCase: ``HostUnreachable``, ``CheckStale``, ...).
        message: the target's message (cut at :data:`MAX_ZONE_MESSAGE` characters where shown).
    """

    target: str
    reason: str
    message: str = ""


def zone_is_ready(zone_ready: Mapping[str, bool], zone: str | None) -> bool:
    """Return whether members may be placed in ``zone``.

    Args:
        zone_ready: zone -> whether its provider target is Ready.
        zone: the zone (``None`` or ``""``: the template's placement).
    Returns:
        ``True`` unless ``zone_ready`` says ``False`` for it (a zone nobody checks is not held
        against the pool).
    """
    return zone_ready.get(zone or "", True)


def pool_zones(pool: Pool) -> list[str]:
    """Return the zones of ``pool``: ``spec.spread.zones``, else ``[template zone or ""]``.

    Args:
        pool: the pool.
    Raises:
        ValueError: its spec is invalid.
    """
    spec = pool.valid_spec
    return list(spec.zones) or [spec.template_zone or ""]


def cut(text: Any, limit: int = MAX_ZONE_MESSAGE) -> str:
    """Return ``text`` on one line (white space folded), at most ``limit`` characters (``...`` when cut)."""
    text = " ".join(str(text or "").split())
    return text if len(text) <= limit else text[:limit - 3] + "..."


def zone_label(zone: str) -> str:
    """Return how a message names ``zone`` (``""``: the template's placement)."""
    return zone or "the template's placement"


def skipped_zones(pool: Pool, zone_ready: Mapping[str, bool], zone_health: "Mapping[str, ZoneHealth] | None",
                  *, now: float) -> list[dict]:
    """The zones of ``pool`` that get no new member because their provider target is not Ready,
    as ``status.skippedZones`` holds them.

    Args:
        pool: the pool (valid spec); its current ``status.skippedZones`` keeps each zone's ``since``.
        zone_ready: as :func:`app.pools.plan.plan` takes it.
        zone_health: zone -> :class:`ZoneHealth` for the zones that are not Ready (a zone
            missing here gets reason ``NotReady``, no target and no message).
        now: epoch seconds (``since`` of a zone skipped from this pass on).
    Returns:
        ``[{"zone", "target", "reason", "message", "since"}]`` (``message`` at most
        :data:`MAX_ZONE_MESSAGE` characters, ``since`` RFC 3339), ``[]`` when every zone is Ready.
    """
    before = {}
    for entry in pool.status.get("skippedZones") or ():
        if isinstance(entry, Mapping) and isinstance(entry.get("zone"), str) and parse_time(entry.get("since")):
            before[entry["zone"]] = entry["since"]
    out = []
    for zone in pool_zones(pool):
        if zone_is_ready(zone_ready, zone):
            continue
        why = (zone_health or {}).get(zone or "")
        out.append({"zone": zone or "", "target": cut(why.target, 253) if why else "",
                    "reason": cut(why.reason, 128) if why else "NotReady",
                    "message": cut(why.message) if why else "",
                    "since": before.get(zone or "") or format_time(now)})
    return out


def describe_zones(skipped: list[Mapping[str, Any]]) -> str:
    """Return ``skipped`` (:func:`skipped_zones`) as one bounded line.

    Each zone with its target's reason and message (cut at 80 characters), at most
    :data:`MAX_ZONES_NAMED` of them and :data:`ZONES_TEXT_BUDGET` characters; the rest are
    counted (``and N more zone(s)``).

    Args:
        skipped: ``status.skippedZones`` entries.
    """
    parts: list[str] = []
    used = 0
    for z in skipped[:MAX_ZONES_NAMED]:
        target = f"target {cut(z['target'], 80)}: " if z.get("target") and z["target"] != z["zone"] else ""
        message = f": {cut(z['message'], 80)}" if z.get("message") else ""
        part = f"{cut(zone_label(z['zone']), 80)} ({target}{z['reason']}{message})"
        if parts and used + len(part) > ZONES_TEXT_BUDGET:
            break
        parts.append(part)
        used += len(part) + 2
    more = len(skipped) - len(parts)
    return "; ".join(parts) + (f"; and {more} more zone(s)" if more > 0 else "")


__all__ = ["MAX_ZONES_NAMED", "MAX_ZONE_MESSAGE", "ZONES_TEXT_BUDGET", "ZoneHealth", "cut", "describe_zones",
           "pool_zones", "skipped_zones", "zone_is_ready", "zone_label"]
