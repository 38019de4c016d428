"""The kubernetes provider type, registered once: its config parser and constructor."""

from __future__ import annotations

from app.providers.base import ProviderType
from app.providers.kubernetes import config


def _build(pc):
    """Build a :class:`~app.providers.kubernetes.provider.KubernetesProvider` (its client is made on first use)."""
    from app.providers.kubernetes.provider import KubernetesProvider

    return KubernetesProvider(pc)


def _check_entry(settings: config.KubernetesSettings, squid) -> tuple[str, str] | None:
    """Basic auth reads each Proxy's credentials Secret, which lives in the Proxy's namespace."""
    if squid.basic_auth_file and settings.namespace:
        return "squid.basicAuth", ("cannot be combined with kubernetes.namespace: the credentials "
                                   "Secret lives in each Proxy's namespace, where its Pod must run")
    return None


# Every key of the kubernetes: block has a default, so the block may be left out.
PROVIDER = ProviderType(name="kubernetes", parse_settings=config.parse, build=_build, block_required=False,
                        check_entry=_check_entry)
