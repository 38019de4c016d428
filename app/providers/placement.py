"""Refusing a Proxy's placement or port that a cloud provider's config does not list.

The gcp and aws providers allow a Proxy only the zones, images, machine types and Squid ports
their config lists; these helpers raise the same :class:`app.errors.SpecNotAllowed` for both.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from app.errors import SpecNotAllowed


def refuse_unlisted(provider: str, checks: Iterable[tuple[str, str | None, Sequence[str], str]]) -> None:
    """Raise for the first value a Proxy names that its provider's config does not list.

    Args:
        provider: the provider's name (for the message).
        checks: ``(spec_field, value, allowed, config_keys)`` tuples: the Proxy's field (e.g.
            ``"spec.placement.zone"``), its value (``None`` or empty: not named, the default
            applies), the allowed values and the config keys that list them (e.g. ``"gcp.zones"``).
    Raises:
        SpecNotAllowed: naming ``spec_field``, the value and the allowed values.
    """
    for spec_field, value, allowed, keys in checks:
        if value and value not in allowed:
            raise SpecNotAllowed(spec_field, f"{value!r} is not allowed by provider {provider} "
                                             f"({keys}: {', '.join(allowed)})")


def refuse_port(provider: str, port: int, allowed: Sequence[int], key: str, why: str) -> None:
    """Raise when the Proxy's Squid port is not one of the config's ports.

    Args:
        provider: the provider's name (for the message).
        port: the Proxy's ``spec.endpoint.port``.
        allowed: the ports the config lists.
        key: the config key that lists them (e.g. ``"aws.securityGroup.ports"``).
        why: why the list exists, the message's last clause.
    Raises:
        SpecNotAllowed: naming ``spec.endpoint.port``.
    """
    if port not in allowed:
        raise SpecNotAllowed("spec.endpoint.port", f"{port} is not allowed by provider {provider} "
                             f"({key}: {', '.join(map(str, allowed))}); {why}")
