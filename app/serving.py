"""The Redis serving view: what the discovery/lease API knows about each proxy.

The reconciler :func:`publish` es a Proxy when it has an endpoint (Running and later) and
:func:`withdraw` s it when it is deleted, fails or loses its instance; the health engine
(:mod:`app.health`) adds probe results to the same record on every probe.  The API reads only
this view (and the lease keys of :mod:`app.leases`), never the Kubernetes API.

Keys (``r`` is a ``redis.Redis`` with ``decode_responses=True``):

* ``po:proxy:<uid>`` — hash.  Identity, written by :func:`publish`: ``uid namespace name
  generation provider zone mode address port labels`` (JSON object) ``maxLeases phase
  healthCheck`` (JSON).  Health, written by the health engine (see :data:`HEALTH_DEFAULTS`):
  ``health`` (``unknown``/``healthy``/``unhealthy``), ``healthy`` (``"1"``/``"0"``: the flag the
  lease script reads), ``successes``/``failures`` (consecutive), ``everHealthy``,
  ``runningSince``/``lastProbe``/``egressAt`` (epoch seconds), ``lastProbeTime`` (RFC 3339),
  ``latencyMs``, ``lastReason``/``lastMessage``/``lastStatus`` (of the last probe),
  ``lastVerdictReason``/``lastVerdictMessage`` (of the current verdict), ``egressIP``,
  ``egressError``, ``failed``, ``statusKey`` (what the Proxy status last said, so status is
  written on change only).
* ``po:proxies`` — set of every published uid.
* ``po:health:due`` — sorted set uid → epoch second the next probe is due (the sweep reads
  only the due part, so it costs O(due), not O(fleet)).
* ``po:health:ok`` / ``po:health:failing`` — uids whose last probe succeeded / failed (the
  latter only for proxies that were healthy once); together they detect a probe-side outage.
* ``po:leases:<uid>`` — live leases of the proxy (owned by :mod:`app.leases`, as are
  ``po:lease-expiry``, ``po:lease:<id>`` and the clients' ``po:client-leases:<client>``).
* ``po:load`` — the lease index: sorted set of the uids a lease can go to (``healthy`` is
  ``"1"``, ``maxLeases`` > 0, fewer live leases than ``maxLeases``) scored by load,
  ``used + used / maxLeases / 2`` (live leases first, then the fill ratio), so a lease
  request reads the least-loaded proxies first instead of scanning the fleet.  Every writer
  of ``healthy`` or ``maxLeases`` keeps it in step in the same atomic step (:func:`publish`,
  :func:`refresh`, :func:`withdraw`, the health engine's record script, the lease scripts);
  anything else that writes those fields (a test, a benchmark) calls :func:`reindex`.
* ``po:full`` — set of the leasable uids at ``maxLeases`` (the other half of the index), so a
  lease request that finds no room can say why without reading the fleet.
* ``po:unhealthy`` / ``po:draining`` — the published uids a lease cannot go to: not healthy
  (unhealthy or not yet probed), or healthy with ``maxLeases`` 0 (draining).  Kept by the same
  ``reindex`` as ``po:load`` and ``po:full``; every published uid is in exactly one of the four,
  so the 503 of a lease request counts why each proxy was excluded from set sizes alone.
* ``po:auth:<uid>`` — hash ``username password``: the basic-auth credentials of a proxy that
  requires them (``authSecret`` names their Secret), copied from that Secret by the health
  engine, which reads it for its probes anyway (:mod:`app.health.engine`), in the same step that
  can make the proxy healthy.  Only the lease scripts read it, to hand the credentials to the
  client that got the lease.  Never part of ``po:proxy:<uid>`` (what ``GET /v1/proxies``
  reads) and gone with :func:`withdraw`.  Whoever can read Redis can read it: Redis must be
  reachable by the operator's processes only (docs/discovery-api.md, "Credentials").
"""

from __future__ import annotations

import hashlib
import json
import time

from redis.exceptions import NoScriptError

from app.resources import Proxy

PROXIES_KEY = "po:proxies"
DUE_KEY = "po:health:due"
OK_KEY = "po:health:ok"
FAILING_KEY = "po:health:failing"
LOAD_KEY = "po:load"
FULL_KEY = "po:full"
UNHEALTHY_KEY = "po:unhealthy"
DRAINING_KEY = "po:draining"

#: Lua defining ``now`` (ms, the Redis server's clock) for scripts that prepend it.
NOW_LUA = """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
"""

#: Lua defining ``reindex(uid, now)``: drop the proxy's expired leases and put it in
#: ``po:load`` with its load as score, or in ``po:full`` when it is at ``maxLeases``, or in
#: ``po:unhealthy`` / ``po:draining`` when it is not leasable, or in none when it is gone.
#: Returns its live leases (0 when not leasable).  Prepended to every script that changes
#: ``healthy``, ``maxLeases`` or a proxy's leases.
REINDEX_LUA = """
local function reindex(uid, now)
  local h = redis.call('HMGET', 'po:proxy:' .. uid, 'healthy', 'maxLeases', 'uid')
  local max = tonumber(h[2]) or 0
  if h[1] ~= '1' or max ~= max or max <= 0 then
    redis.call('ZREM', 'po:load', uid)
    redis.call('SREM', 'po:full', uid)
    if not h[3] then
      redis.call('SREM', 'po:unhealthy', uid)
      redis.call('SREM', 'po:draining', uid)
    elseif h[1] ~= '1' then
      redis.call('SADD', 'po:unhealthy', uid)
      redis.call('SREM', 'po:draining', uid)
    else
      redis.call('SREM', 'po:unhealthy', uid)
      redis.call('SADD', 'po:draining', uid)
    end
    return 0
  end
  redis.call('SREM', 'po:unhealthy', uid)
  redis.call('SREM', 'po:draining', uid)
  local lk = 'po:leases:' .. uid
  redis.call('ZREMRANGEBYSCORE', lk, '-inf', now)
  local used = redis.call('ZCARD', lk)
  if used >= max then
    redis.call('ZREM', 'po:load', uid)
    redis.call('SADD', 'po:full', uid)
  else
    redis.call('ZADD', 'po:load', used + used / max / 2, uid)
    redis.call('SREM', 'po:full', uid)
  end
  return used
end
"""

#: Health fields a fresh (or re-addressed) record starts with.
HEALTH_DEFAULTS = {
    "health": "unknown", "healthy": "0", "successes": "0", "failures": "0", "everHealthy": "0",
    "lastReason": "", "lastMessage": "", "lastStatus": "", "latencyMs": "", "lastProbe": "",
    "lastProbeTime": "", "egressIP": "", "egressAt": "", "egressError": "", "statusKey": "",
    "failed": "0", "lastVerdictReason": "", "lastVerdictMessage": "",
}


class Lua:
    """A Lua script loaded once per process and run with any client.

    ``Lua(source)(r, keys, args)`` runs ``EVALSHA`` on ``r``, loading the script on
    ``NOSCRIPT``; on a pipeline, redis-py's ``Script`` (the pipeline loads its scripts before
    it executes).  A direct call goes straight to ``EVALSHA``: the lease scripts run on every
    API request.
    """

    def __init__(self, source: str) -> None:
        self.source = source
        self.sha = hashlib.sha1(source.encode("utf-8")).hexdigest()
        self._script = None

    def __call__(self, r, keys: list, args: list):
        if getattr(r, "scripts", None) is not None:  # a pipeline
            if self._script is None:
                self._script = r.register_script(self.source)
            return self._script(keys=keys, args=args, client=r)
        try:
            return r.evalsha(self.sha, len(keys), *keys, *args)
        except NoScriptError:
            r.script_load(self.source)
            return r.evalsha(self.sha, len(keys), *keys, *args)


def proxy_key(uid: str) -> str:
    """Return the hash key of the Proxy ``uid``."""
    return f"po:proxy:{uid}"


def leases_key(uid: str) -> str:
    """Return the key of the sorted set of live leases of ``uid`` (lease id → expiry, ms)."""
    return f"po:leases:{uid}"


def auth_key(uid: str) -> str:
    """Return the key of the hash holding ``uid``'s basic-auth credentials (``username password``)."""
    return f"po:auth:{uid}"


def _health_json(hc) -> str:
    """``spec.healthCheck`` (defaults applied) as the JSON stored in the serving view."""
    return json.dumps({
        "url": hc.url, "expectedStatus": hc.expected_status, "intervalSeconds": hc.interval_seconds,
        "timeoutSeconds": hc.timeout_seconds, "failureThreshold": hc.failure_threshold,
        "successThreshold": hc.success_threshold, "rateLimited": hc.rate_limited,
    }, sort_keys=True)


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
    key = proxy_key(proxy.uid)
    now = time.time()
    fields = {
        "uid": proxy.uid, "namespace": proxy.namespace, "name": proxy.name,
        "generation": str(proxy.generation),
        "provider": s.provider or "", "zone": s.zone or "", "mode": s.mode,
        "address": address, "port": str(port), "labels": json.dumps(proxy.labels, sort_keys=True),
        "maxLeases": str(s.max_leases), "phase": phase, "authSecret": auth_secret or "",
        "healthCheck": _health_json(s.health),
    }
    old_address, old_port = r.hmget(key, "address", "port")
    moved = old_address is not None and (old_address != address or old_port != str(port))
    pipe = r.pipeline(transaction=True)
    pipe.hset(key, mapping=fields)
    if not auth_secret:
        pipe.delete(auth_key(proxy.uid))  # basic auth turned off: no stale credentials
    if moved:
        pipe.hset(key, mapping={**HEALTH_DEFAULTS, "runningSince": repr(now)})
        pipe.srem(OK_KEY, proxy.uid)
        pipe.srem(FAILING_KEY, proxy.uid)
        pipe.zadd(DUE_KEY, {proxy.uid: now})
    else:
        for name, value in HEALTH_DEFAULTS.items():
            pipe.hsetnx(key, name, value)
        pipe.hsetnx(key, "runningSince", repr(now))
        pipe.zadd(DUE_KEY, {proxy.uid: now}, nx=True)
    pipe.sadd(PROXIES_KEY, proxy.uid)
    _REINDEX(pipe, [], [proxy.uid])
    pipe.execute()


_REINDEX = Lua(NOW_LUA + REINDEX_LUA + "return reindex(ARGV[1], now)")

_REFRESH = Lua(NOW_LUA + REINDEX_LUA + """
if redis.call('EXISTS', KEYS[1]) == 0 then return 0 end
redis.call('HSET', KEYS[1], 'labels', ARGV[1], 'maxLeases', ARGV[2], 'healthCheck', ARGV[3], 'generation', ARGV[4])
reindex(ARGV[5], now)
return 1
""")


def reindex_all(r) -> int:
    """Rebuild the lease index entry of every published proxy (idempotent, atomic per proxy).

    The API runs it when it starts, so an index that predates a proxy's record (an upgrade,
    a restored Redis) is whole before the first lease.

    Returns:
        how many proxies the index holds (leasable, with free capacity).
    Raises:
        redis.RedisError: Redis unreachable.
    """
    # Members of the index whose record is gone (written by an older version that did not
    # know one of its sets) are taken out as well.
    uids = sorted(r.smembers(PROXIES_KEY) | r.smembers(FULL_KEY) | set(r.zrange(LOAD_KEY, 0, -1))
                  | r.smembers(UNHEALTHY_KEY) | r.smembers(DRAINING_KEY))
    pipe = r.pipeline(transaction=False)
    for uid in uids:
        _REINDEX(pipe, [], [uid])
    pipe.execute()
    return int(r.zcard(LOAD_KEY))


def reindex(r, uid: str) -> int:
    """Bring ``uid``'s place in the lease index (``po:load`` or ``po:full``) in step with its record.

    Only for code that writes ``healthy`` or ``maxLeases`` itself (the product's writers do it
    atomically).  Atomic; a missing record takes the uid out of the index.

    Returns:
        the proxy's live leases, 0 when it is not leasable.
    """
    return int(_REINDEX(r, [], [uid]))


def refresh(r, proxy: Proxy) -> bool:
    """Update the fields of a published Proxy that change without a new instance.

    Labels (no generation bump), ``maxLeases`` and ``healthCheck`` are copied from ``proxy``;
    nothing happens when the Proxy is not published (atomic: a concurrent :func:`withdraw`
    is never undone).

    Returns:
        whether the Proxy was published and updated.
    """
    health = _health_json(proxy.spec.health)
    return bool(_REFRESH(r, [proxy_key(proxy.uid)],
                         [json.dumps(proxy.labels, sort_keys=True), str(proxy.spec.max_leases), health,
                          str(proxy.generation), proxy.uid]))


def auth_secret_of(record: dict[str, str]) -> tuple[str, str] | None:
    """Return ``(namespace, secret_name)`` of a record whose proxy requires basic auth, else ``None``."""
    if record.get("authSecret"):
        return record.get("namespace", ""), record["authSecret"]
    return None


_FORGET_LEASES = Lua("""
for _, id in ipairs(redis.call('ZRANGE', KEYS[1], 0, -1)) do
  redis.call('ZREM', 'po:lease-expiry', ARGV[1] .. '/' .. id)
  local owner = redis.call('HGET', 'po:lease:' .. id, 'client')
  if owner then redis.call('ZREM', 'po:client-leases:' .. owner, id) end
end
return 1
""")


def withdraw(r, uid: str) -> None:
    """Remove the Proxy ``uid`` from the serving view, its probe schedule, the lease index,
    its live leases (from the expiry index and their clients' counts too) and its credentials.

    No error when absent.  Lease records (``po:lease:<id>``) are left to expire; renewing one
    answers ``proxy_unavailable`` and ends it, releasing one still reports its outcome.
    """
    pipe = r.pipeline(transaction=True)
    _FORGET_LEASES(pipe, [leases_key(uid)], [uid])
    pipe.delete(proxy_key(uid))
    pipe.srem(PROXIES_KEY, uid)
    pipe.zrem(DUE_KEY, uid)
    pipe.srem(OK_KEY, uid)
    pipe.srem(FAILING_KEY, uid)
    pipe.delete(leases_key(uid))
    pipe.zrem(LOAD_KEY, uid)
    pipe.srem(FULL_KEY, uid)
    pipe.srem(UNHEALTHY_KEY, uid)
    pipe.srem(DRAINING_KEY, uid)
    pipe.delete(auth_key(uid))
    pipe.execute()


def get(r, uid: str) -> dict[str, str] | None:
    """Return the raw hash of ``uid`` or ``None`` when not published."""
    data = r.hgetall(proxy_key(uid))
    return data or None


def records(r, uids: list[str]) -> dict[str, dict[str, str]]:
    """Return ``{uid: hash}`` for those of ``uids`` that are published (one round trip)."""
    pipe = r.pipeline(transaction=False)
    for uid in uids:
        pipe.hgetall(proxy_key(uid))
    return {uid: data for uid, data in zip(uids, pipe.execute()) if data}


def all_records(r) -> dict[str, dict[str, str]]:
    """Return ``{uid: hash}`` for every published proxy (two round trips)."""
    return records(r, sorted(r.smembers(PROXIES_KEY)))


def labels_of(record: dict[str, str]) -> dict[str, str]:
    """Return the labels of a record (``{}`` when missing or malformed)."""
    try:
        labels = json.loads(record.get("labels") or "{}")
    except ValueError:
        return {}
    return labels if isinstance(labels, dict) else {}


def health_check_of(record: dict[str, str]) -> dict:
    """Return the ``healthCheck`` dict of a record (``{}`` when missing or malformed)."""
    try:
        hc = json.loads(record.get("healthCheck") or "{}")
    except ValueError:
        return {}
    return hc if isinstance(hc, dict) else {}
