"""Where kvm instances live, from the ``kvm:`` settings alone (pure: no SDK import).

The one definition of the host rules: :class:`~app.providers.kvm.provider.KvmProvider` uses it
to place instances, and the dispatcher (through :data:`HOSTS`, the type's
:class:`~app.config.provider_types.HostPlacement`) to route work to the host's queue without building
a provider.
"""

from __future__ import annotations

from app.providers.kvm.config import KvmSettings
from app.providers.kvm.domain import parse_provider_id


def hosts(settings: KvmSettings) -> list[str]:
    """Return the configured host names in config order."""
    return [h.name for h in settings.hosts]


def host_for(settings: KvmSettings, zone: str | None) -> str | None:
    """Return the host ``spec.placement.zone`` names.

    An empty ``zone`` means the only host when exactly one is configured.  ``None`` when no
    configured host matches (the provider refuses such a placement with ``SpecNotAllowed``).
    """
    if not zone:
        return settings.hosts[0].name if len(settings.hosts) == 1 else None
    host = settings.host(zone)
    return host.name if host is not None else None


def host_of(provider_id: str) -> str | None:
    """Return the host inside ``provider_id`` (``hosts/<host>/domains/<name>``), ``None`` if it does not parse."""
    try:
        return parse_provider_id(provider_id)[0]
    except ValueError:
        return None


class _Hosts:
    """:class:`~app.config.provider_types.HostPlacement` of the kvm type (the functions above)."""

    @staticmethod
    def hosts(settings: KvmSettings) -> list[str]:
        return hosts(settings)

    @staticmethod
    def host_for(settings: KvmSettings, zone: str | None) -> str | None:
        return host_for(settings, zone)

    @staticmethod
    def host_of(provider_id: str) -> str | None:
        return host_of(provider_id)


#: The kvm type's host placement (registered in :mod:`app.providers.kvm.registration`).
HOSTS = _Hosts()
