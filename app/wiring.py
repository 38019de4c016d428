"""The composition root: the one place that lists the provider types.

Each provider package registers its type once (``PROVIDER`` in
``app/providers/<type>/registration.py``: config parser, constructor, host placement); this
module lists the packages and hands their parts to the config loader (:func:`load_config`),
the registry (:func:`build_registry`) and the dispatcher's router (:func:`router`).  It also
injects the clients a provider gets from the rest of the product: the kubernetes type's
registration is built here (``provider_type(client_factory)``) with the gateway's per-process
client (:func:`kube_api_client`), so no provider imports the gateway.  To add a
provider: implement the contract in ``app/providers/<type>/``, register it there and add it to
:data:`PROVIDER_TYPES` (see docs/providers.md).  Registrations are pure and constructors import
their SDK when called, so a deployment without, say, libvirt installed still runs its
kubernetes and gcp providers (and no boto3 is needed without an aws provider), and the watcher
routes kvm work without importing libvirt.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Iterable

from app.config.providers import ProviderConfig, ProvidersConfig, load, parse
from app.config.provider_types import ProviderType
from app.providers.aws.registration import PROVIDER as AWS
from app.providers.gcp.registration import PROVIDER as GCP
from app.providers.kubernetes import registration as kubernetes_registration
from app.providers.kvm.registration import PROVIDER as KVM
from app.providers.registry import Registry, build


def kube_api_client():
    """Return the gateway's per-process ``ApiClient`` (:func:`app.kube.gateway.api_client`) for the kubernetes provider.

    Imported when first called, so routing and config checks never load the gateway; the
    provider calls it on every use, so a provider built before a fork uses the child's client.
    """
    from app.kube.gateway import api_client

    return api_client()


#: the kubernetes type, its providers given the gateway's client (injected here: a provider never imports the gateway)
KUBERNETES = kubernetes_registration.provider_type(kube_api_client)

#: provider type name -> its registration, in the order config messages list them
PROVIDER_TYPES: dict[str, ProviderType] = {t.name: t for t in (KUBERNETES, GCP, KVM, AWS)}

#: provider type -> constructor
CONSTRUCTORS = {name: t.build for name, t in PROVIDER_TYPES.items()}


def parse_config(data: Any, file: str) -> ProvidersConfig:
    """Validate an already-decoded providers config with every shipped provider type.

    Raises:
        app.config.validation.ConfigError: the first problem, naming the file, the provider and the field.
    """
    return parse(data, file, PROVIDER_TYPES)


def load_config(path: str | Path | None) -> ProvidersConfig:
    """Read and validate the providers config at ``path`` (``None``/``""``: no providers).

    Raises:
        app.config.validation.ConfigError: unreadable file, bad YAML or any validation problem.
    """
    return load(path, PROVIDER_TYPES)


def build_registry(config: ProvidersConfig) -> Registry:
    """Build every configured provider, metered (constructors never dial)."""
    from app.providers import metrics as provider_metrics  # prometheus-client: only where providers are built

    return build(config, CONSTRUCTORS, wrap=provider_metrics.wrap)


def load_registry(path: str | None) -> Registry:
    """Load the providers config at ``path`` and build the registry.

    Raises:
        app.config.validation.ConfigError: the config is invalid.
    """
    return build_registry(load_config(path))


def router(configs: ProvidersConfig | Iterable[ProviderConfig]):
    """Return the :class:`app.dispatch.proxies.Router` of ``configs``.

    Built from the config alone: no provider is made.
    """
    from app.dispatch.proxies import Router

    return Router(configs, PROVIDER_TYPES)
