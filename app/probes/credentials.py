"""Basic-auth credentials for the health probes, read from each Proxy's Secret (cached).

The serving view only names the Secret (``authSecret``).  The probe batch
(:mod:`app.probes.engine`) copies the credentials it probed with into their own Redis hash,
:func:`app.store.keys.auth`, which only the lease scripts read: the API hands them to the client
that leases the proxy (a crawler outside the cluster cannot read the Secret).  They are never
part of the serving record (:func:`app.store.keys.proxy`), never logged and never in metrics.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Callable, Protocol, runtime_checkable

from app.kube import credentials
from app.kube.gateway import KubeGateway
from app.serving.records import ServingRecord

log = logging.getLogger(__name__)


@runtime_checkable
class RefreshableCredentials(Protocol):
    """Probe credentials that keep a cache and can read past it.

    ``credentials(record) -> (username, password) | None`` as :func:`app.probes.engine.probe_batch`
    takes them, plus ``fresh(record)``: the same answer read again whatever the cache holds.
    After a 407 the engine asks ``fresh`` only of credentials that declare this (a class
    subclasses it; a plain callable has no cache to go past).
    """

    def __call__(self, record: ServingRecord | dict[str, str]) -> tuple[str, str] | None: ...

    def fresh(self, record: ServingRecord | dict[str, str]) -> tuple[str, str] | None: ...


class SecretCredentials(RefreshableCredentials):
    """``credentials(record) -> (username, password) | None`` for :func:`app.probes.engine.probe_batch`.

    A serving-view record is a claim, not a fact: anything that can write to Redis can forge
    one naming any namespace, Secret and address.  So the record only says *which* Proxy to
    look up; the credentials are read and used only when, against the Proxy as read from the
    Kubernetes API:

    1. the Proxy ``record.namespace/record.name`` exists and its UID is ``record.uid``;
    2. the record's endpoint (``address``, ``port``) is the Proxy's own (``status.address`` /
       ``spec.endpoint.host``, ``status.port``): credentials never go to another address;
    3. the record's ``authSecret`` is the Proxy's credentials Secret, ``<proxy>-proxy-auth`` in
       the Proxy's namespace (:func:`app.kube.credentials.secret_name`);
    4. that Secret's ``ownerReferences`` name the Proxy's UID (:func:`app.kube.credentials.read`, the
       ownership policy every reader of the Secret follows).

    Anything else gives ``None`` (the probe then goes without credentials and reports
    ProxyAuthRequired, as a crawler without them would) and a warning naming the record's
    Proxy and the check that failed, never a value.

    Args:
        kube: the :class:`app.kube.gateway.KubeGateway` the Proxy and its Secret are read through.
        ttl: seconds a verdict (credentials or a refusal) is reused for the same record
            identity (namespace, name, uid, address, port, Secret), so a sweep of many proxies
            costs two API reads per proxy per ``ttl``.
        clock: monotonic clock, seconds.
    """

    def __init__(self, kube: KubeGateway, ttl: float = 60.0, clock: Callable[[], float] = time.monotonic):
        self.kube, self.ttl, self.clock = kube, ttl, clock
        self._cache: dict[tuple, tuple[float, tuple[str, str] | None]] = {}
        self._lock = threading.Lock()

    def fresh(self, record: ServingRecord | dict[str, str]) -> tuple[str, str] | None:
        """Like calling it, but read the Secret again whatever the cache holds (after a 407: the
        password may have been rotated since it was cached)."""
        return self(record, refresh=True)

    def __call__(self, record: ServingRecord | dict[str, str], refresh: bool = False) -> tuple[str, str] | None:
        rec = ServingRecord.of(record)
        if not rec.auth_secret:
            return None
        endpoint = rec.to_redis(("address", "port"))
        key = (rec.namespace, rec.name, rec.uid, endpoint["address"], endpoint["port"], rec.auth_secret)
        now = self.clock()
        with self._lock:
            hit = self._cache.get(key)
        if hit is not None and now - hit[0] < self.ttl and not refresh:
            return hit[1]
        value = None
        try:
            value = self._verified(*key)
        except Exception as exc:  # noqa: BLE001 - a probe without credentials reports it itself
            log.warning("health: cannot read the credentials of Proxy %s/%s: %s", key[0], key[1],
                        type(exc).__name__)
        with self._lock:
            if len(self._cache) > 100_000:
                self._cache.clear()
            self._cache[key] = (now, value)
        return value

    def _verified(self, namespace: str, name: str, uid: str, address: str, port: str,
                  secret: str) -> tuple[str, str] | None:
        def refuse(why: str) -> tuple[str, str] | None:
            log.warning("health: credentials withheld for the serving-view record of Proxy %s/%s: %s",
                        namespace, name, why)
            return None

        if not namespace or not name:
            return refuse("the record names no Proxy")
        proxy = self.kube.get_proxy(namespace, name)
        if proxy is None:
            return refuse("no such Proxy in the Kubernetes API")
        if not uid or proxy.uid != uid:
            return refuse("the record's uid is not the Proxy's")
        if (proxy.effective_host() or "") != address or str(proxy.effective_port()) != port:
            return refuse("the record's endpoint is not the Proxy's")
        if secret != credentials.secret_name(proxy):
            return refuse("the record names a Secret that is not the Proxy's credentials Secret")
        found = credentials.read(self.kube, proxy)  # owner check; raises on a foreign Secret
        if found is None:
            return refuse("the Proxy's credentials Secret is missing or incomplete")
        return found.username, found.password
