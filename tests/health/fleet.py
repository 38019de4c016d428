"""A small fleet of Proxy objects for health and API tests.

Proxies live in the Kubernetes API fake (the real ``kubernetes`` client talks to it); their
endpoints are real Squids on loopback.  External Proxies go through the reconciler's own
``create`` step (status Running, published to the serving view); Managed ones are written the
way the reconciler leaves them once the provider reports the instance Running (the provider
itself is outside these tests).
"""

from __future__ import annotations

import dataclasses
import os
import tempfile

from kubernetes import client as k8s

from app.serving import view as serving
from app.squid import conf as squid_conf
from app.config.providers import ProvidersConfig
from app.probes import engine
from app.probes.settings import HealthSettings
from app.kube.gateway import KubernetesGateway
from app.providers.registry import build
from app.proxy.reconcile import Context, Ref, create
from app.resources import API_VERSION, GROUP, KIND, PLURAL, VERSION, Proxy
from app.config.settings import Settings
from app.config.tenancy import Tenancy
from devcluster.squid import SquidProcess, loopback_policy, start_on_free_port


def start_squid(address: str, *, policy: squid_conf.SquidPolicy | None = None,
                egress: bool = True, loopback_origins: bool = True) -> SquidProcess:
    """Start a real Squid on ``address`` with the product policy; ``egress`` pins its outgoing
    address to ``address`` so an IP-echo origin sees a per-proxy egress IP;
    ``loopback_origins`` exempts the loopback test origins from the product's destination
    denial (:func:`devcluster.squid.loopback_policy`).  The port is the kernel's pick; a start
    that loses it to another process is tried again on a fresh one
    (:func:`devcluster.squid.start_on_free_port`, which also names the error raised)."""
    policy = policy or squid_conf.SquidPolicy()
    if loopback_origins:
        policy = loopback_policy(policy)
    if egress:
        policy = dataclasses.replace(policy, extra=(*policy.extra, f"tcp_outgoing_address {address}"))
    return start_on_free_port(address, lambda port: squid_conf.render(port, policy))


def htpasswd_file(user: str, password: str) -> str:
    """Write an htpasswd file Squid's helper (user ``proxy``) can read; return its path."""
    d = tempfile.mkdtemp(prefix="htpasswd-")
    os.chmod(d, 0o755)
    path = os.path.join(d, "htpasswd")
    with open(path, "w") as fh:
        fh.write(squid_conf.htpasswd_entry(user, password) + "\n")
    os.chmod(path, 0o644)
    return path


class Fleet:
    """Proxy objects in the API fake, published to the serving view in Redis.

    Args:
        api_client: ``kubernetes.client.ApiClient`` of the fake.
        r: ``redis.Redis`` (``decode_responses=True``).
        health_url: default ``healthCheck.url``.
    """

    def __init__(self, api_client, r, health_url: str) -> None:
        #: the gateway the health engine reads and writes through (the worker's records nothing)
        self.kube = KubernetesGateway(api_client, record_writes=False)
        self.custom = k8s.CustomObjectsApi(api_client)
        self.r = r
        self.health_url = health_url
        # the operator of these tests lets every namespace add External Proxies
        self.ctx = Context(kube=KubernetesGateway(api_client), registry=build(ProvidersConfig(()), {}), redis=r,
                           settings=Settings(), tenancy=Tenancy.open())

    def read(self, namespace: str, name: str) -> Proxy:
        """Read a Proxy back."""
        return self.kube.get_proxy(namespace, name)

    # -- creating proxies ----------------------------------------------------------------
    def _create(self, name: str, namespace: str, spec: dict, labels: dict | None) -> dict:
        body = {"apiVersion": API_VERSION, "kind": KIND,
                "metadata": {"name": name, "namespace": namespace, "labels": labels or {}}, "spec": spec}
        return self.custom.create_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, body)

    def _health(self, health: dict | None) -> dict:
        hc = {"url": self.health_url, "intervalSeconds": 3, "timeoutSeconds": 2,  # timeout below interval (CRD)
              "failureThreshold": 1, "successThreshold": 1}
        hc.update(health or {})
        return hc

    def external(self, name: str, host: str, port: int, *, namespace: str = "default",
                 labels: dict | None = None, max_leases: int | None = None, health: dict | None = None) -> Proxy:
        """Apply an External Proxy for ``host:port`` and run the reconciler's create step."""
        spec = {"mode": "External", "endpoint": {"host": host, "port": port}, "healthCheck": self._health(health)}
        if max_leases is not None:
            spec["maxLeases"] = max_leases
        obj = self._create(name, namespace, spec, labels)
        create(self.ctx, Ref(namespace, name, obj["metadata"]["uid"]))
        return self.read(namespace, name)

    def managed(self, name: str, host: str, port: int, *, provider: str, zone: str | None = None,
                namespace: str = "default", labels: dict | None = None, max_leases: int | None = None,
                health: dict | None = None) -> Proxy:
        """Apply a Managed Proxy and leave it as the reconciler does once its instance runs at
        ``host`` (status Running with the address, published to the serving view)."""
        spec = {"mode": "Managed", "provider": provider, "endpoint": {"port": port},
                "cloudInit": {"inline": "#cloud-config\n"}, "healthCheck": self._health(health)}
        if zone:
            spec["placement"] = {"zone": zone}
        if max_leases is not None:
            spec["maxLeases"] = max_leases
        obj = self._create(name, namespace, spec, labels)
        proxy = self.kube.patch_status(Proxy.from_dict(obj), {
            "phase": "Running", "address": host, "port": port,
            "observedGeneration": obj["metadata"].get("generation", 1)})
        serving.publish(self.r, proxy, address=host, port=port, phase="Running")
        return proxy

    # -- probing -------------------------------------------------------------------------
    def probe(self, proxies, settings: HealthSettings, **kw) -> engine.BatchReport:
        """Run one health batch over ``proxies`` (Proxy objects or uids)."""
        uids = [p if isinstance(p, str) else p.uid for p in proxies]
        return engine.probe_batch(self.r, uids, settings, kube=self.kube, **kw)
