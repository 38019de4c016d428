"""The Redis serving view: what the discovery/lease API knows about each proxy (SPEC §6-7).

The reconciler :func:`publish` es a Proxy when it has an endpoint (Running and later) and
:func:`withdraw` s it when it is deleted, fails or loses its instance; the health engine adds
probe results to the same record.  The API reads only this view, never the Kubernetes API.

Keys (``r`` is a ``redis.Redis`` with ``decode_responses=True``):

* ``po:proxy:<uid>`` — hash: ``uid namespace name provider zone address port labels``
  (JSON object) ``maxLeases phase healthCheck`` (JSON) plus the health engine's fields.
* ``po:proxies`` — set of every published uid.
"""

from __future__ import annotations

import json

from app.resources import Proxy

PROXIES_KEY = "po:proxies"


def proxy_key(uid: str) -> str:
    """Return the hash key of the Proxy ``uid``."""
    return f"po:proxy:{uid}"


def publish(r, proxy: Proxy, *, address: str, port: int, phase: str) -> None:
    """Record (or refresh) ``proxy``'s identity and endpoint in the serving view.

    Health fields already present are kept, so a resync never resets a probe history.

    Args:
        r: ``redis.Redis``.
        proxy: the Proxy as just read from the API.
        address / port: its endpoint.
        phase: the phase written to its status.
    """
    s = proxy.spec
    hc = s.health
    fields = {
        "uid": proxy.uid, "namespace": proxy.namespace, "name": proxy.name,
        "provider": s.provider or "", "zone": s.zone or "", "mode": s.mode,
        "address": address, "port": str(port), "labels": json.dumps(proxy.labels, sort_keys=True),
        "maxLeases": str(s.max_leases), "phase": phase,
        "healthCheck": json.dumps({
            "url": hc.url, "expectedStatus": hc.expected_status, "intervalSeconds": hc.interval_seconds,
            "timeoutSeconds": hc.timeout_seconds, "failureThreshold": hc.failure_threshold,
            "successThreshold": hc.success_threshold,
        }, sort_keys=True),
    }
    pipe = r.pipeline(transaction=True)
    pipe.hset(proxy_key(proxy.uid), mapping=fields)
    pipe.sadd(PROXIES_KEY, proxy.uid)
    pipe.execute()


def withdraw(r, uid: str) -> None:
    """Remove the Proxy ``uid`` from the serving view (no error when absent)."""
    pipe = r.pipeline(transaction=True)
    pipe.delete(proxy_key(uid))
    pipe.srem(PROXIES_KEY, uid)
    pipe.execute()


def get(r, uid: str) -> dict[str, str] | None:
    """Return the raw hash of ``uid`` or ``None`` when not published."""
    data = r.hgetall(proxy_key(uid))
    return data or None
