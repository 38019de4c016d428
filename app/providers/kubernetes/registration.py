"""The kubernetes provider type: its config parser and constructor.

Unlike the other types, its constructor needs a client the provider does not make itself: the
Pods live in the operator's own cluster, reached with the gateway's per-process
``ApiClient``.  This package never imports the gateway (:mod:`app.kube.gateway`): the composition root
(:mod:`app.wiring`) builds the registration with :func:`provider_type`, passing the client factory in.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Callable

from app.config.provider_types import ProviderType
from app.providers.kubernetes import config

if TYPE_CHECKING:
    from kubernetes.client import ApiClient


def _check_entry(settings: config.KubernetesSettings, squid) -> tuple[str, str] | None:
    """Basic auth reads each Proxy's credentials Secret, which lives in the Proxy's namespace."""
    if squid.basic_auth_file and settings.namespace:
        return "squid.basicAuth", ("cannot be combined with kubernetes.namespace: the credentials "
                                   "Secret lives in each Proxy's namespace, where its Pod must run")
    return None


def provider_type(client_factory: Callable[[], "ApiClient"]) -> ProviderType:
    """Return the kubernetes type's registration, whose providers use ``client_factory()``.

    Args:
        client_factory: returns the ``ApiClient`` to use; called on every use, never when a
            provider is built (so a provider made before a fork uses the child's client, and
            building one never reads a kubeconfig).
    """

    def build(pc):
        """Build a :class:`~app.providers.kubernetes.provider.KubernetesProvider` (its client is made on first use)."""
        from app.providers.kubernetes.provider import KubernetesProvider

        return KubernetesProvider(pc, client_factory=client_factory)

    # Every key of the kubernetes: block has a default, so the block may be left out.  A new Pod
    # leaves through its node's address (SNAT), the same as the Pod it replaces on that node.
    return ProviderType(name="kubernetes", parse_settings=config.parse, build=build, block_required=False,
                        check_entry=_check_entry, replacement_keeps_ip=True)
