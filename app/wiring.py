"""The composition root: the one place that lists the provider types.

Each provider package registers its type once (``PROVIDER`` in
``app/providers/<type>/registration.py``: config parser, constructor, host placement); this
module lists the packages and hands their parts to the config loader (:func:`load_config`),
the registry (:func:`build_registry`) and the dispatcher's router (:func:`router`).  To add a
provider: implement the contract in ``app/providers/<type>/``, register it there and add it to
:data:`PROVIDER_TYPES` (see docs/providers.md).  Registrations are pure and constructors import
their SDK when called, so a deployment without, say, libvirt installed still runs its
kubernetes and gcp providers, and the watcher routes kvm work without importing libvirt.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Iterable

from app.config import ProviderConfig, ProvidersConfig, load, parse
from app.providers.base import ProviderType
from app.providers.gcp.registration import PROVIDER as GCP
from app.providers.kubernetes.registration import PROVIDER as KUBERNETES
from app.providers.kvm.registration import PROVIDER as KVM
from app.providers.registry import Registry, build

#: provider type name -> its registration, in the order config messages list them
PROVIDER_TYPES: dict[str, ProviderType] = {t.name: t for t in (KUBERNETES, GCP, KVM)}

#: provider type -> constructor
CONSTRUCTORS = {name: t.build for name, t in PROVIDER_TYPES.items()}


def parse_config(data: Any, file: str) -> ProvidersConfig:
    """Validate an already-decoded providers config with every shipped provider type.

    Raises:
        app.validation.ConfigError: the first problem, naming the file, the provider and the field.
    """
    return parse(data, file, PROVIDER_TYPES)


def load_config(path: str | Path | None) -> ProvidersConfig:
    """Read and validate the providers config at ``path`` (``None``/``""``: no providers).

    Raises:
        app.validation.ConfigError: unreadable file, bad YAML or any validation problem.
    """
    return load(path, PROVIDER_TYPES)


def build_registry(config: ProvidersConfig) -> Registry:
    """Build every configured provider, metered (constructors never dial)."""
    from app.providers import metrics as provider_metrics  # prometheus-client: only where providers are built

    return build(config, CONSTRUCTORS, wrap=provider_metrics.wrap)


def load_registry(path: str | None) -> Registry:
    """Load the providers config at ``path`` and build the registry.

    Raises:
        app.validation.ConfigError: the config is invalid.
    """
    return build_registry(load_config(path))


def router(configs: ProvidersConfig | Iterable[ProviderConfig]):
    """Return the :class:`app.dispatch.Router` of ``configs`` (built from the config alone: no provider is made)."""
    from app.dispatch import Router

    return Router(configs, PROVIDER_TYPES)
