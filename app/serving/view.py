"""The Redis serving view: what the discovery/lease API knows about each proxy.

The reconciler :func:`publish` es a Proxy when it has an endpoint (Running and later) and
:func:`withdraw` s it when it is deleted, fails or loses its instance; the health engine
(:mod:`app.probes`) adds probe results to the same record on every probe.  The API reads only
this view (and the lease keys of :mod:`app.serving.leases`), never the Kubernetes API.

Keys (their names, types and owners: :mod:`app.store.keys`, docs/redis.md):

* the serving record of each proxy (:func:`app.store.keys.proxy`), a hash whose fields
  :class:`app.serving.records.ServingRecord` defines: identity written here, health by the
  health engine;
* the set of every published uid (:data:`app.store.keys.PROXIES`);
* the probe schedule (:data:`app.store.keys.HEALTH_DUE`: the sweep reads only the due part, so
  it costs O(due), not O(fleet)) and the OK / failing sets of the last probes
  (:data:`app.store.keys.HEALTH_OK`, :data:`app.store.keys.HEALTH_FAILING`), which together
  detect a probe-side outage;
* the basic-auth credentials of a proxy that requires them (:func:`app.store.keys.auth`;
  ``authSecret`` names their Secret), copied from that Secret by the health engine, which reads
  it for its probes anyway (:mod:`app.probes.engine`), in the same step that can make the proxy
  healthy.  Only the lease scripts read them, to hand them to the client that got the lease.
  Never part of the serving record (what ``GET /v1/proxies`` reads) and gone with
  :func:`withdraw`.  Whoever can read Redis can read them: Redis must be reachable by the
  operator's processes only (docs/discovery-api.md, "Credentials").

The lease index (which proxies a lease can go to, least loaded first) and the leases are
:mod:`app.serving.leases`'.  Every writer of ``healthy`` or ``maxLeases`` keeps the index in step in the
same atomic step (:func:`publish`, :func:`refresh`, :func:`withdraw`, the health engine's
record script, the lease scripts); anything else that writes those fields (a test, a
benchmark) calls :func:`app.serving.leases.reindex`.
"""

from __future__ import annotations

import time

from app.serving import leases

from app.store import keys as redis_keys
from app.store.lua import Lua
from app.resources import Proxy
from app.serving.records import HEALTH_DEFAULTS, IDENTITY, ServingRecord, fields_of, read


def _drain_ms(proxy: Proxy) -> int | None:
    """The Proxy's draining mark as the serving record holds it (epoch ms), ``None`` for none."""
    until = proxy.draining_until
    return None if until is None else int(until * 1000)


def _health_check(hc) -> dict:
    """``spec.healthCheck`` (defaults applied) as the serving record holds it."""
    return {
        "url": hc.url, "expectedStatus": hc.expected_status, "intervalSeconds": hc.interval_seconds,
        "timeoutSeconds": hc.timeout_seconds, "failureThreshold": hc.failure_threshold,
        "successThreshold": hc.success_threshold, "rateLimited": hc.rate_limited,
    }


def publish(r, proxy: Proxy, *, address: str, port: int, phase: str, auth_secret: str | None = None) -> None:
    """Record (or refresh) ``proxy``'s identity and endpoint in the serving view.

    Health fields already present are kept, so a resync never resets a probe history; when
    the endpoint (address or port) changed — a replaced instance — the health fields are
    reset and the proxy must pass its probes again before it is leased.  A newly published
    proxy is due for a probe at once.

    Args:
        r: ``redis.Redis`` (``decode_responses=True``).
        proxy: the Proxy as just read from the API.
        address / port: its endpoint.
        phase: the phase written to its status.
        auth_secret: name of the Proxy's basic-auth Secret when the proxy requires credentials
            (the probes read them from it), else ``None``.
    """
    s = proxy.spec
    key = redis_keys.proxy(proxy.uid)
    now = time.time()
    fields = ServingRecord(
        uid=proxy.uid, namespace=proxy.namespace, name=proxy.name, generation=proxy.generation,
        provider=s.provider or "", zone=s.zone or "", mode=s.mode, address=address, port=port,
        labels=proxy.labels, max_leases=s.max_leases, phase=phase, auth_secret=auth_secret or "",
        health_check=_health_check(s.health), pool=proxy.pool, drain_until=_drain_ms(proxy),
    ).to_redis(IDENTITY)
    running_since = fields_of(running_since=now)
    old_address, old_port = r.hmget(key, "address", "port")
    moved = old_address is not None and (old_address != fields["address"] or old_port != fields["port"])
    pipe = r.pipeline(transaction=True)
    pipe.hset(key, mapping=fields)
    if not auth_secret:
        pipe.delete(redis_keys.auth(proxy.uid))  # basic auth turned off: no stale credentials
    if moved:
        pipe.hset(key, mapping={**HEALTH_DEFAULTS, **running_since})
        pipe.srem(redis_keys.HEALTH_OK, proxy.uid)
        pipe.srem(redis_keys.HEALTH_FAILING, proxy.uid)
        pipe.zadd(redis_keys.HEALTH_DUE, {proxy.uid: now})
    else:
        for name, value in {**HEALTH_DEFAULTS, **running_since}.items():
            pipe.hsetnx(key, name, value)
        pipe.zadd(redis_keys.HEALTH_DUE, {proxy.uid: now}, nx=True)
    pipe.sadd(redis_keys.PROXIES, proxy.uid)
    leases.queue_reindex(pipe, proxy.uid)
    pipe.execute()


_REFRESH = Lua("now", "lease_index", "serving_refresh")


def _write_if_published(r, uid: str, fields: dict[str, str]) -> bool:
    """Write encoded ``fields`` (:func:`fields_of`) into ``uid``'s serving record and move it in
    the lease index, atomically and only while the record exists; whether it did."""
    args = [uid]
    for name, value in fields.items():
        args += [name, value]
    return bool(_REFRESH(r, [redis_keys.proxy(uid)], args))


def refresh(r, proxy: Proxy) -> bool:
    """Update the fields of a published Proxy that change without a new instance.

    Labels (no generation bump), ``maxLeases``, ``healthCheck``, its pool and its draining mark
    (:data:`app.resources.DRAINING_ANNOTATION`) are copied from ``proxy``; nothing happens when
    the Proxy is not published (atomic: a concurrent :func:`withdraw` is never undone).

    Returns:
        whether the Proxy was published and updated.
    """
    fields = fields_of(labels=proxy.labels, max_leases=proxy.spec.max_leases,
                       health_check=_health_check(proxy.spec.health), generation=proxy.generation,
                       pool=proxy.pool, drain_until=_drain_ms(proxy))
    return _write_if_published(r, proxy.uid, fields)


def set_draining(r, uid: str, until: float | None) -> bool:
    """Mark the published proxy ``uid`` draining until ``until`` (epoch seconds), or take the mark
    off (``None``), and move it in the lease index at once (atomic, like :func:`refresh`).

    A draining proxy takes no new lease (the lease script skips it and counts it as
    ``draining`` in a 503), keeps its live leases until they are released or expire, and
    renews them only up to ``until``.  The pool controller calls this right after writing the
    mark on the Proxy (:data:`app.resources.DRAINING_ANNOTATION`), which :func:`publish` and
    :func:`refresh` copy as well, so the mark survives a flushed Redis.

    Returns:
        whether the proxy was published (and marked).
    """
    fields = fields_of(drain_until=None if until is None else int(until * 1000))
    return _write_if_published(r, uid, fields)


def leave_pool(r, uid: str) -> bool:
    """Take the published proxy ``uid`` out of its pool in the serving view: its ``pool`` field
    emptied (the API's ``pool`` filter no longer matches it) and its pool's draining mark, if
    any, taken off, with the lease index moved at once (atomic, like :func:`refresh`).

    The pool controller calls this right after releasing a member from its pool (the
    ownerReference removed: :meth:`app.kube.gateway.KubeGateway.release_proxy`), so pool-filtered
    leases stop going to it at once rather than at the next refresh; :func:`publish` and
    :func:`refresh` copy the same from the (now ownerless) Proxy afterwards.

    Returns:
        whether the proxy was published (and updated).
    """
    fields = fields_of(pool="", drain_until=None)
    return _write_if_published(r, uid, fields)


def withdraw(r, uid: str) -> None:
    """Remove the Proxy ``uid`` from the serving view, its probe schedule, the lease index,
    its live leases (from the expiry index and their clients' counts too) and its credentials.

    No error when absent.  Lease records (:func:`app.store.keys.lease`) are left to expire;
    renewing one answers ``proxy_unavailable`` and ends it, releasing one still reports its
    outcome.
    """
    pipe = r.pipeline(transaction=True)
    leases.queue_withdraw(pipe, uid)
    pipe.delete(redis_keys.proxy(uid))
    pipe.srem(redis_keys.PROXIES, uid)
    pipe.zrem(redis_keys.HEALTH_DUE, uid)
    pipe.srem(redis_keys.HEALTH_OK, uid)
    pipe.srem(redis_keys.HEALTH_FAILING, uid)
    pipe.delete(redis_keys.auth(uid))
    pipe.execute()


def get(r, uid: str) -> dict[str, str] | None:
    """Return the raw hash of ``uid`` or ``None`` when not published
    (:meth:`app.serving.records.ServingRecord.from_redis` types it)."""
    data = r.hgetall(redis_keys.proxy(uid))
    return data or None


def records(r, uids: list[str]) -> dict[str, dict[str, str]]:
    """Return ``{uid: raw hash}`` for those of ``uids`` that are published (one round trip)."""
    return read(r, uids)


def all_records(r) -> dict[str, dict[str, str]]:
    """Return ``{uid: raw hash}`` for every published proxy (two round trips)."""
    return read(r, sorted(r.smembers(redis_keys.PROXIES)))
