"""The composition root: the one place that knows every concrete provider.

To add a provider: implement the contract in ``app/providers/<type>/``, add its config block
parser to :data:`app.config.BLOCK_PARSERS`, and its constructor here (see docs/providers.md).
Constructors are imported lazily so a deployment without, say, libvirt installed still runs
its kubernetes and gcp providers.
"""

from __future__ import annotations

from app.config import ProviderConfig, ProvidersConfig, load
from app.providers import metrics as provider_metrics
from app.providers.registry import Registry, build


def _kubernetes(pc: ProviderConfig):
    from app.providers.kubernetes.provider import KubernetesProvider
    return KubernetesProvider(pc)


def _gcp(pc: ProviderConfig):
    from app.providers.gcp.provider import GcpProvider
    return GcpProvider(pc)


def _kvm(pc: ProviderConfig):
    from app.providers.kvm.provider import KvmProvider
    return KvmProvider(pc)


#: provider type -> constructor
CONSTRUCTORS = {"kubernetes": _kubernetes, "gcp": _gcp, "kvm": _kvm}


def build_registry(config: ProvidersConfig) -> Registry:
    """Build every configured provider, metered (constructors never dial)."""
    return build(config, CONSTRUCTORS, wrap=provider_metrics.wrap)


def load_registry(path: str | None) -> Registry:
    """Load the providers config at ``path`` and build the registry.

    Raises:
        app.validation.ConfigError: the config is invalid.
    """
    return build_registry(load(path))
