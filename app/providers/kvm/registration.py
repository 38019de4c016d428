"""The kvm provider type, registered once: its config parser, constructor and host placement.

Pure at import (no libvirt or paramiko): the constructor imports the provider module when it
is called, so loading the providers config or routing a task never does.
"""

from __future__ import annotations

from app.config.provider_types import ProviderType
from app.providers.kvm import config
from app.providers.kvm.placement import HOSTS


def _build(pc):
    """Build a :class:`~app.providers.kvm.provider.KvmProvider` (imports libvirt; never dials)."""
    from app.providers.kvm.provider import KvmProvider

    return KvmProvider(pc)


def _check_entry(settings: config.KvmSettings, squid) -> tuple[str, str] | None:
    """Basic auth needs the operator's squid.conf on the VM (nothing else installs the credentials)."""
    if squid.basic_auth_file and not settings.configure_squid:
        return "squid.basicAuth", ("needs kvm.configureSquid: true (nothing else would install "
                                   "the credentials on the instance)")
    return None


PROVIDER = ProviderType(name="kvm", parse_settings=config.parse, build=_build, check_entry=_check_entry,
                        placement=HOSTS)
