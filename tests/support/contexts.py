"""The reconcile :class:`app.proxy.reconcile.Context` on the API fake, for reconcile-level tests.

A pytest plugin (``pytest_plugins`` in tests/conftest.py): the ``make_context`` fixture builds
the Context a worker would, with the kubernetes provider bound to the test's API fake
(``kube_client``) and the session Redis (``redis_client``), so test modules do not each copy
the wiring.

* :data:`QUICK` — short poll and retry delays (the default).
* :func:`k8s_provider` — a ``kubernetes`` provider entry as the config loader would parse it.
"""

from __future__ import annotations

import pytest

from app.config.providers import ProviderConfig, ProvidersConfig
from app.kube.gateway import KubernetesGateway
from app.providers.kubernetes.config import KubernetesSettings
from app.providers.kubernetes.provider import KubernetesProvider
from app.providers.registry import build
from app.proxy.reconcile import Context
from app.config.settings import Settings
from app.config.tenancy import Tenancy

#: Short poll and retry delays: followups in tests come within a second.
QUICK = Settings(poll_initial=0.2, poll_max=1, retry_initial=0.2, retry_max=1, quota_backoff=1)


def k8s_provider(name: str = "k8s-local", **settings) -> ProviderConfig:
    """A ``kubernetes`` provider named ``name`` (checks every 60 s, 15 s timeout) with
    :class:`KubernetesSettings` ``settings`` (``namespace=``, ``images=`` ...); replacements keep
    the egress IP, as the type's default says (Pods behind their node's address)."""
    return ProviderConfig(name, "kubernetes", 60, 15, KubernetesSettings(**settings), replacement_keeps_ip=True)


@pytest.fixture
def make_context(kube_client, redis_client):
    """Factory: ``make_context(*providers, settings=QUICK, retire=None, factories=None) -> Context``.

    ``providers`` are :class:`ProviderConfig` entries (default: one :func:`k8s_provider`);
    kubernetes providers talk to the test's API fake; ``factories`` adds provider classes by
    type (``{"gcp": GcpProvider}``, ``{"kvm": KvmProvider}``); ``tenancy`` is the operator's
    namespace settings (default: every namespace may add External Proxies and cloud-init).  The Context's gateway is a
    :class:`KubernetesGateway` on ``kube_client``, its Redis ``redis_client``.
    """
    def make(*providers: ProviderConfig, settings: Settings | None = None, retire=None,
             factories: dict | None = None, tenancy: Tenancy | None = None) -> Context:
        registry = build(ProvidersConfig(tuple(providers or (k8s_provider(),))),
                         {"kubernetes": lambda pc: KubernetesProvider(pc, client=kube_client), **(factories or {})})
        return Context(kube=KubernetesGateway(kube_client), registry=registry, redis=redis_client,
                       settings=settings or QUICK, retire=retire, tenancy=tenancy or Tenancy.open())

    return make
