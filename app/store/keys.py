"""Every Redis key the operator writes: the one table of their names.

Each key family is a constant (a fixed key) or a function (a key per Proxy, lease, client,
...) here, with its Redis type, what it holds, its TTL and who writes and reads it.  Python
code builds keys only through this module; the Lua scripts (:mod:`app.store.lua`) get the fixed keys
and the prefixes of the per-thing families as locals declared by :func:`lua_header`, which
the loader prepends to every script, so no script spells a key.  The same table, by key, is in
docs/redis.md.

Redis is a cache of what the Kubernetes API says plus short-lived coordination state: nothing
here is persisted on purpose, and everything is rebuilt after a flush (docs/architecture.md,
"Redis loss").  The scripts touch keys derived from their arguments (per proxy, per lease),
which is fine on the single Redis deployed here but not on Redis Cluster.

Keys that are not ``po:``: the Celery broker's (kombu: the queue lists ``proxies``, ``health``,
``gc``, ``kvm.<provider>.<host>``, ``_kombu.binding.*``, ``unacked*``), owned by kombu and
:mod:`workers.broker`.
"""

from __future__ import annotations

#: The prefix of every key below.
PREFIX = "po:"

# -- the serving view (app.serving.view, app.serving.records) ------------------------------------------

#: Prefix of :func:`proxy`.
PROXY_PREFIX = PREFIX + "proxy:"
#: set — the uid of every published Proxy.  No TTL.  Written by :func:`app.serving.view.publish` /
#: :func:`app.serving.view.withdraw`; read by :func:`app.serving.view.all_records` (the API's
#: ``GET /v1/proxies``), :func:`app.serving.leases.reindex_all`, the lease script's 503 count and the
#: serving-view gauge (:mod:`workers.metrics_server`).
PROXIES = PREFIX + "proxies"


def proxy(uid: str) -> str:
    """hash — the serving record of the Proxy ``uid``: a leasable proxy's identity, endpoint and
    health, fields as :class:`app.serving.records.ServingRecord` types them.  No TTL (removed by
    :func:`app.serving.view.withdraw`).  Identity written by :func:`app.serving.view.publish` /
    :func:`app.serving.view.refresh`, health by the health engine (:mod:`app.probes.engine`); read by
    the health engine, the lease scripts (``lease_*.lua``) and the API (:func:`app.serving.leases.discover`)."""
    return PROXY_PREFIX + uid


#: Prefix of :func:`auth`.
AUTH_PREFIX = PREFIX + "auth:"


def auth(uid: str) -> str:
    """hash ``username password`` — the basic-auth credentials of a proxy that requires them,
    copied from its Secret by the health engine (``health_auth.lua``) so the lease answer can
    carry them.  No TTL; deleted by :func:`app.serving.view.publish` (basic auth turned off) and
    :func:`app.serving.view.withdraw`.  Read by the lease scripts and the engine's rotation fallback
    (:mod:`app.probes.engine`).  Never part of :func:`proxy` (what ``GET /v1/proxies`` reads)."""
    return AUTH_PREFIX + uid


# -- the health engine (app.probes) ----------------------------------------------------------------

#: sorted set — uid → epoch second its next probe is due.  No TTL.  Written by
#: :func:`app.serving.view.publish` (due at once) / :func:`app.serving.view.withdraw`, the sweep
#: (:func:`app.probes.schedule.claim_due`, pushes claimed members ahead) and the engine (the next
#: due time, ``health_record.lua``); read by the sweep.
HEALTH_DUE = PREFIX + "health:due"
#: set — uids whose last probe succeeded.  No TTL.  Written by the engine (``health_note.lua``)
#: and :func:`app.serving.view.publish` / :func:`app.serving.view.withdraw`; read by the engine (outage
#: detection).
HEALTH_OK = PREFIX + "health:ok"
#: set — once-healthy uids whose last probe failed.  Same owners as :data:`HEALTH_OK`.
HEALTH_FAILING = PREFIX + "health:failing"
#: string — epoch seconds a probe-side outage began (``SET NX``), deleted when probes succeed
#: again.  No TTL.  Written and read by the engine only (it logs the start once).
HEALTH_OUTAGE = PREFIX + "health:outage"
#: sorted set — digest of a namespace → epoch second its slow-lane slot expires: the namespaces
#: whose slow-lane batch is queued or running (at most ``HEALTH_SLOW_LANE_BATCHES``).  No TTL
#: (members expire by score).  Written by the sweep (``health_slow_slots.lua``) and the
#: ``health.probe_batch`` task (``ZREM`` when its batch ends); read by the sweep.
HEALTH_SLOW_SLOTS = PREFIX + "health:slow:slots"
#: hash — digest of a namespace → epoch second it was last given a slow-lane slot (the
#: rotation order).  No TTL.  Written and read by the sweep (``health_slow_slots.lua``).
HEALTH_SLOW_TURNS = PREFIX + "health:slow:turns"
#: Prefix of :func:`health_origin`.
HEALTH_ORIGIN_PREFIX = PREFIX + "health:origin:"


def health_origin(digest: str) -> str:
    """hash ``started state reason message okAt`` — the last direct control request to a health
    URL's origin (``digest``: a hash of the URL and expected status).  TTL 7 days, renewed by
    every write.  Written and read by :class:`app.probes.origin.OriginControl` (every worker)."""
    return HEALTH_ORIGIN_PREFIX + digest


def health_origin_refresh(digest: str) -> str:
    """string ``1`` — held (``SET NX``, TTL 60 s) by the one batch re-asking the origin of
    :func:`health_origin` ``(digest)``, so batches running together ask once.
    :class:`app.probes.origin.OriginControl` only."""
    return health_origin(digest) + ":refresh"


# -- the lease index and the leases (app.serving.leases, lease_*.lua) -------------------------------------
#
# Every published uid is in exactly one of LOAD, FULL, UNHEALTHY and DRAINING; ``lease_index.lua``
# (``reindex``) is the one piece of code that moves it between them, run by every writer of a
# record's ``healthy`` or ``maxLeases`` or of a proxy's leases in the same atomic step.

#: sorted set — uid → load (``used + used / maxLeases / 2``): the uids a lease can go to
#: (healthy, ``maxLeases`` > 0, room left), least loaded first.  No TTL.  Written by
#: ``lease_index.lua`` (through :func:`app.serving.leases.reindex` and every script that includes it) and
#: ``lease_acquire.lua``; read by ``lease_acquire.lua``, :func:`app.serving.leases.reindex_all` and the
#: serving-view gauge.
LOAD = PREFIX + "load"
#: set — leasable uids at ``maxLeases``.  Same owners as :data:`LOAD`.
FULL = PREFIX + "full"
#: set — published uids not healthy (unhealthy or not yet probed).  Written by
#: ``lease_index.lua``; read by the lease script's 503 message and the gauge.
UNHEALTHY = PREFIX + "unhealthy"
#: set — published uids healthy with ``maxLeases`` 0 (draining).  Same owners as :data:`UNHEALTHY`.
DRAINING = PREFIX + "draining"
#: sorted set — ``<uid>/<lease id>`` → expiry (ms, Redis clock): every live lease, so expired
#: ones leave the index without a scan.  No TTL.  Written by the lease scripts and
#: :func:`app.serving.view.withdraw` (``lease_forget.lua``); read by ``lease_acquire.lua`` (the expiry
#: sweep) and :func:`app.serving.leases.live_leases` (the ``/metrics`` gauge).
LEASE_EXPIRY = PREFIX + "lease-expiry"
#: Prefix of :func:`proxy_leases`.
PROXY_LEASES_PREFIX = PREFIX + "leases:"


def proxy_leases(uid: str) -> str:
    """sorted set — lease id → expiry (ms since the epoch, Redis clock): the live leases of the
    proxy ``uid``.  No TTL (expired members are dropped by every script that counts them;
    deleted by :func:`app.serving.view.withdraw`).  Written by the lease scripts and
    ``lease_index.lua``; read by them and :func:`app.serving.leases.discover` (``leases.used``)."""
    return PROXY_LEASES_PREFIX + uid


#: Prefix of :func:`lease`.
LEASE_PREFIX = PREFIX + "lease:"


def lease(lease_id: str) -> str:
    """hash ``uid client ttl expiresAt createdAt sessionKey sticky`` — one lease.  Expires
    ``LEASE_RECORD_GRACE`` seconds after the lease (``PEXPIREAT``), so a late renew says
    "expired" and a late release still reports its outcome.  Written by ``lease_acquire.lua`` /
    ``lease_renew.lua``, deleted by ``lease_renew.lua`` (proxy gone) and ``lease_release.lua``;
    read by those and by the expiry sweep and ``lease_forget.lua`` (its ``client``)."""
    return LEASE_PREFIX + lease_id


#: Prefix of :func:`released`.
RELEASED_PREFIX = PREFIX + "released:"


def released(lease_id: str) -> str:
    """hash ``request answer`` — the answer of the release of lease ``lease_id`` and the id of
    the request that made it, for 60 s: the same request run again (``app/store/retry.py``,
    after its first answer was lost with its connection) gets that answer, not
    ``lease_not_found``.  Written and read by ``lease_release.lua``."""
    return RELEASED_PREFIX + lease_id


#: Prefix of :func:`client_leases`.
CLIENT_LEASES_PREFIX = PREFIX + "client-leases:"


def client_leases(client: str) -> str:
    """sorted set — lease id → expiry (ms): the live leases of API client ``client`` (its
    ``maxLeases`` of the tokens file).  Expires with its last lease (``PEXPIRE``, extended by
    every grant and renewal).  Written by the lease scripts (entries past expiry dropped before
    every count) and ``lease_forget.lua``; read by ``lease_acquire.lua`` / ``lease_renew.lua``."""
    return CLIENT_LEASES_PREFIX + client


#: Prefix of :func:`cooldown`.
COOLDOWN_PREFIX = PREFIX + "cooldown:"


def cooldown(client: str) -> str:
    """sorted set — uid → end of the cooldown (ms): proxies released ``blocked``/``failed`` by
    ``client``, not leased to it again until then.  TTL: the cooldown (``PEXPIRE``, extended by
    every release that starts one).  Written by ``lease_release.lua``; read (and pruned) by
    ``lease_acquire.lua``."""
    return COOLDOWN_PREFIX + client


#: Prefix of :func:`sticky`; the Lua scripts append ``<client>:<sessionKey>`` the same way.
STICKY_PREFIX = PREFIX + "sticky:"


def sticky(client: str, session_key: str) -> str:
    """string — the uid the session ``session_key`` of ``client`` is bound to.  TTL
    ``LEASE_STICKY_TTL`` seconds, renewed by every use.  Written by ``lease_acquire.lua``,
    extended by ``lease_renew.lua``, deleted by ``lease_release.lua`` (a blocked/failed outcome)."""
    return f"{STICKY_PREFIX}{client}:{session_key}"


# -- bans, per-target concurrency, refusing targets (app.serving.bans, lease_*.lua) ---------------
#
# ``<target>`` is a registrable domain (app.serving.targets); ``<ident>`` an egress identity: the
# proxy's egress IP, or ``uid:<uid>`` when it is not known.

#: Prefix of :func:`ban`.
BAN_PREFIX = PREFIX + "ban:"


def ban(target: str, owner: str = "") -> str:
    """sorted set — egress identity → end of its cooldown for ``target`` (ms, Redis clock): the
    (egress IP, target) pairs in cooldown.  ``owner``: ``""`` for fleet-wide bans, ``#<client>``
    with ``BAN_SCOPE=client``.  TTL: the longest cooldown in it (``PEXPIRE``, extended by every
    ban).  Written by ``lease_release.lua`` (a ``blocked``/``failed`` release of a targeted
    lease; members removed when the target turns out to refuse everyone); read by
    ``lease_acquire.lua``."""
    return BAN_PREFIX + target + owner


#: Prefix of :func:`ban_strikes`.
BAN_STRIKES_PREFIX = PREFIX + "ban-strikes:"


def ban_strikes(target: str, owner: str, ident: str) -> str:
    """string (integer) — how many times ``ident`` was banned for ``target`` (by ``owner``, as in
    :func:`ban`) since the count last decayed: the cooldown doubles with each.  TTL
    ``BAN_DECAY_SECONDS`` (renewed by every ban).  ``lease_release.lua`` only."""
    return f"{BAN_STRIKES_PREFIX}{target}{owner}|{ident}"


#: Prefix of :func:`target_leases`.
TARGET_LEASES_PREFIX = PREFIX + "target-leases:"


def target_leases(target: str, ident: str) -> str:
    """sorted set — lease id → expiry (ms): the live leases for ``target`` through egress identity
    ``ident`` (its per-target concurrency).  TTL: its latest lease's expiry (``PEXPIRE``).
    Written by the lease scripts (grant, renew, release, end); read by ``lease_acquire.lua``."""
    return f"{TARGET_LEASES_PREFIX}{target}|{ident}"


#: Prefix of :func:`target_ident`.
TARGET_IDENT_PREFIX = PREFIX + "target-ident:"


def target_ident(uid: str) -> str:
    """string — the egress identity the live targeted leases of proxy ``uid`` are counted under
    (:func:`target_leases`): set by ``lease_acquire.lua`` at a targeted grant, changed by
    ``lease_index.lua``'s ``follow_ident`` when the proxy's ``egressIP`` changed (its leases move
    to the new identity).  Its own key, not a field of the serving record, so the API's user,
    which may not write serving records, can keep it.  No TTL; deleted by
    :func:`app.serving.view.withdraw`."""
    return TARGET_IDENT_PREFIX + uid


#: Prefix of :func:`refusals`.
REFUSALS_PREFIX = PREFIX + "refusals:"


def refusals(target: str, realm: str = "") -> str:
    """sorted set — egress identity → time (ms) of its last ``blocked`` report for ``target``
    within ``TARGET_REFUSAL_WINDOW_SECONDS``, by the clients of ``realm``
    (:func:`app.serving.bans.realm`: ``""`` for clients of every proxy under fleet-wide bans).
    TTL: the window.  ``lease_release.lua`` only."""
    return REFUSALS_PREFIX + target + realm


#: Prefix of :func:`refusing`.
REFUSING_PREFIX = PREFIX + "refusing:"


def refusing(target: str, realm: str = "") -> str:
    """string — end (ms) of ``target``'s cool-off as a target refusing everyone: leases for it
    by the clients of ``realm`` (:func:`app.serving.bans.realm`) are refused
    (``429 target_refusing``) until then.  TTL: the cool-off
    (``TARGET_REFUSAL_COOLOFF_SECONDS``).  Written by ``lease_release.lua``; read by
    ``lease_acquire.lua`` and ``lease_release.lua``."""
    return REFUSING_PREFIX + target + realm


#: Prefix of :func:`ip_bans`.
IP_BANS_PREFIX = PREFIX + "ip-bans:"


def ip_bans(ident: str) -> str:
    """sorted set — target → end of the cooldown (ms) of egress identity ``ident`` for it: live
    bans and those ended less than ``BAN_HISTORY_SECONDS`` ago (older entries dropped at every
    ban).  TTL: the longest of its cooldowns + the history window.  Written by
    ``lease_release.lua``; read by :func:`app.serving.bans.proxy_bans` (``GET /v1/proxies``)."""
    return IP_BANS_PREFIX + ident


#: Prefix of :func:`ip_ban_times`.
IP_BAN_TIMES_PREFIX = PREFIX + "ip-ban-times:"


def ip_ban_times(ident: str) -> str:
    """sorted set — target → time (ms) of its last ban of egress identity ``ident``, for the
    last ``BAN_HISTORY_SECONDS`` (older entries dropped at every ban).  TTL: that history.
    Written by ``lease_release.lua``; read by :mod:`app.pools.recycle` (a pool's recycle policy:
    members whose egress IP many targets banned)."""
    return IP_BAN_TIMES_PREFIX + ident


#: Prefix of :func:`ip_outcomes`.
IP_OUTCOMES_PREFIX = PREFIX + "ip-outcomes:"

#: Width of one bucket of :func:`ip_outcomes`, ms (a minute).
OUTCOME_BUCKET_MS = 60_000


def ip_outcomes(ident: str) -> str:
    """hash — per minute (bucket ``floor(ms / OUTCOME_BUCKET_MS)``) of the last
    ``BAN_HISTORY_SECONDS``: ``l<bucket>`` → targeted leases granted through egress identity
    ``ident``, ``b<bucket>`` → bans of it (``blocked``/``failed`` releases of targeted leases;
    taken back when the target turns out to refuse everyone).  Buckets older than the history are
    dropped when a new one starts and the hash holds more than two histories' worth (readers skip
    them).  TTL: ``BAN_HISTORY_SECONDS`` + a bucket (renewed by every new bucket).
    Written by ``lease_acquire.lua`` (leases), ``lease_release.lua`` (bans) and ``lease_index.lua``'s
    ``follow_ident`` (a live targeted lease moved to its proxy's new egress IP; a key it makes gets
    an hour and a bucket); read by :mod:`app.pools.recycle` (``spec.recycle.maxBanPercent``)."""
    return IP_OUTCOMES_PREFIX + ident


#: sorted set — ``<ident>|<target>`` → end of the cooldown (ms): every (egress IP, target) ban,
#: live ones and those ended since the last ban (dropped at every ban), for the live-cooldowns
#: gauge.  No TTL (bounded by the live cooldowns).  Written by ``lease_release.lua``; read by
#: :func:`app.serving.bans.live_cooldowns`.
BANS = PREFIX + "bans"


# -- reconciling (app.proxy.reconcile, app.proxy.gc, workers) --------------------------------------------------

#: set — uids released with skip-cleanup: a hint for GC (the instance itself carries the
#: ``abandoned`` mark, which is what GC trusts).  No TTL.  Written by :mod:`app.proxy.delete`
#: (a skip-cleanup release); read by the GC tasks (:mod:`workers.tasks`).
ABANDONED = PREFIX + "abandoned"
#: Prefix of :func:`proxy_lock`.
LOCK_PREFIX = PREFIX + "lock:"


def proxy_lock(uid: str) -> str:
    """string — the per-Proxy lock (a redis-py ``Lock`` token naming its holder,
    :class:`app.store.holders.HolderLock`) every step of a Proxy holds.  TTL: the lock timeout (task hard
    time limit + 10 s); taken over earlier once its holder's heartbeat is gone.  Taken by the reconcile steps
    (:mod:`app.dispatch.proxies`, :mod:`workers.tasks`) and by GC before deleting a superseded instance
    (:mod:`app.proxy.gc`); the resync reads whether it exists."""
    return LOCK_PREFIX + uid


#: Prefix of :func:`holder_heartbeat`.
HOLDER_PREFIX = PREFIX + "holder:"
#: set — the ids of every holder that has beaten (:mod:`app.store.holders`).  No TTL; a holder is
#: removed once its messages were put back (:func:`app.store.holders.reap`).  Written by each holder's
#: heartbeat; read and pruned by the workers' reaper (``workers/broker.py``).
HOLDERS = PREFIX + "holders"


def holder_heartbeat(holder: str) -> str:
    """string — the heartbeat of holder ``holder`` (one operator process, :mod:`app.store.holders`): the
    unix time since which it has beaten without a gap.  TTL: ``HOLDER_TTL`` (10 s), refreshed every
    third of it by the holder itself; gone = the holder is dead.  Read by lock takers
    (:class:`app.store.holders.HolderLock`), the resync and the reaper."""
    return HOLDER_PREFIX + holder


def holder_messages(holder: str) -> str:
    """set — delivery tags of the broker messages holder ``holder`` took and has not acknowledged
    (a superset: tags acked by a restore elsewhere stay until the reaper drops the set).  No TTL;
    written by ``workers/broker.py`` (``QoS``: added with the unacked entry, removed at ack); read and
    deleted by :func:`app.store.holders.reap` once the holder is dead."""
    return HOLDER_PREFIX + holder + ":messages"


#: Prefix of :func:`gc_sweep`.
GC_PREFIX = PREFIX + "gc:"


def gc_sweep(sweep_id: str) -> str:
    """hash — shard (a KVM host) → its listing (JSON) for one sharded GC sweep of a provider;
    the shard that completes it takes and deletes the hash (``gc_shard_done.lua``).  TTL one hour
    (``PEXPIRE`` by every shard).  :func:`app.proxy.gc.record_shard` only."""
    return GC_PREFIX + sweep_id


#: Prefix of :func:`queued`.
QUEUED_PREFIX = PREFIX + "queued:"


def queued(action: str, uid: str) -> str:
    """string — the ETA (epoch seconds) of the ``action`` (create/poll/delete) message queued for
    Proxy ``uid`` (``pool``: the ``pool.reconcile`` of ProxyPool ``uid``): the de-duplication mark.
    TTL: the delay + the staleness limit (300 s).  Set by :class:`app.dispatch.proxies.Enqueuer`
    (``dispatch_claim.lua``), cleared by the task when it starts or by a send that failed."""
    return f"{QUEUED_PREFIX}{action}:{uid}"


#: Prefixes of :func:`own_writes`, :func:`busy` and :func:`parked`.
OWN_PREFIX = PREFIX + "own:"
BUSY_PREFIX = PREFIX + "busy:"
PARKED_PREFIX = PREFIX + "parked:"


def own_writes(uid: str) -> str:
    """set — resourceVersions the operator's own writes to Proxy ``uid`` produced, so the watcher
    drops the events they cause.  TTL 300 s (``PEXPIRE`` at every write).  Written by
    ``dispatch_finish.lua`` when a task ends; read by ``dispatch_observe.lua`` (the watcher).
    :class:`app.dispatch.proxies.OwnWrites`."""
    return OWN_PREFIX + uid


def busy(uid: str) -> str:
    """string ``1`` — a task is working on Proxy ``uid``.  TTL: the task's lock timeout.  Set by
    :meth:`app.dispatch.proxies.OwnWrites.begin`, deleted by ``dispatch_finish.lua``; read by
    ``dispatch_observe.lua``."""
    return BUSY_PREFIX + uid


def parked(uid: str) -> str:
    """set — events (resourceVersions) and requests for Proxy ``uid`` that arrived while a task
    held it, re-checked when it ends.  TTL 300 s.  Written by ``dispatch_observe.lua`` and
    :meth:`app.dispatch.proxies.OwnWrites.park`; taken and deleted by ``dispatch_finish.lua``."""
    return PARKED_PREFIX + uid


# -- proxy pools (app.pools) ----------------------------------------------------------------------

#: hash — the ProxyPools the lease script may count refused requests for: field
#: ``<namespace>/<name>`` -> ``1`` for every pool, and field ``<name>`` -> ``<namespace>`` (the
#: first pool of that name registered), for requests that name a pool without a namespace.  No
#: TTL.  Written by :func:`app.pools.demand.register` / :func:`app.pools.demand.forget` (the pool
#: controller); read by ``lease_acquire.lua``.
POOLS = PREFIX + "pools"
#: Prefix of :func:`pool_demand`.
POOL_DEMAND_PREFIX = PREFIX + "pool-demand:"
#: set — ``<namespace>/<name>`` of ProxyPools a draining member of which has just lost its last
#: live lease (a release: only Redis changes, no watch event follows), so the pass that deletes
#: it runs now instead of at the drain deadline; also of pools a member of which a site has
#: just banned (a targeted release: the pool's recycle policy, :mod:`app.pools.recycle`).  No TTL
#: (emptied every few seconds).  Written by ``lease_release.lua``; taken by
#: :func:`app.pools.wake.take` (task ``pool.wake``, beat).
POOL_WAKE = PREFIX + "pool-wake"


def pool_demand(namespace: str, name: str) -> str:
    """string (integer) — lease requests for the pool ``namespace/name`` refused for lack of a
    proxy (``503 no_proxy_available``) since the autoscaler last read it: one ``INCR`` by
    ``lease_acquire.lua`` per refused request of a registered pool (:data:`POOLS`), nothing else
    written.  No TTL (bounded by the registered pools).  Taken (read and reset) by
    :func:`app.pools.demand.take`; deleted by :func:`app.pools.demand.forget`."""
    return f"{POOL_DEMAND_PREFIX}{namespace}/{name}"


def pool_demand_read(namespace: str, name: str) -> str:
    """string — epoch seconds (Redis clock) :func:`pool_demand` was last taken, so the autoscaler
    knows the window the count covers.  No TTL.  :func:`app.pools.demand.take` / ``forget`` only."""
    return pool_demand(namespace, name) + ":read"


def pool_scale(uid: str) -> str:
    """string (JSON ``{"history": [{"time", "replicas"}], "replicas", "warnedAt"}``; a bare
    ``[{"time", "replicas"}]`` from earlier releases is read as the history) — the autoscaler's
    recent recommendations for the pool ``uid`` (its scale-down window,
    :func:`app.pools.autoscale.stabilize`), the count it last settled on (a different
    ``spec.replicas`` at the next pass means another writer: a ``ReplicasOverridden`` Event) and
    when that Event was last recorded.  TTL: the pool's ``scaleDownDelaySeconds`` + 1 hour,
    renewed by every write; deleted by a pass of a pool without ``spec.autoscale``.  Written and
    read by :mod:`app.pools.controller`; a lost value only restarts the window (delays a
    scale-down) and misses one override."""
    return PREFIX + "pool-scale:" + uid


def pool_zone_events(uid: str) -> str:
    """string (JSON ``{zone: {"down": bool, "times": [epoch s]}}``) — for the pool ``uid``, the
    state last told of each zone by a ``ZoneNotReady`` / ``ZoneReady`` Event and when its Events
    of the last ``ZONE_EVENT_WINDOW`` were recorded (their rate bound,
    :func:`app.pools.controller._zone_events`).  TTL: the window + 1 day, renewed by every
    write; deleted when no zone needs it and by the pass that finds the pool gone.  Written and
    read by :mod:`app.pools.controller`; a lost value: the pool's ``status.skippedZones`` stands
    for what was told."""
    return PREFIX + "pool-zone-events:" + uid


def pool_budget(uid: str) -> str:
    """string (JSON ``{"day", "hours", "at", "live"}``) — the instance-hours the pool ``uid``'s members
    ran on UTC day ``day`` (``hours``), counted at each pass from the members with an instance
    (``live``) since the last pass (``at``, epoch seconds), for ``spec.maxInstanceHoursPerDay``
    (:mod:`app.pools.budget`).  TTL: 2 days, renewed by every write; deleted by the pass that finds
    the pool gone.  Written and read by :mod:`app.pools.controller`; lost: today's count restarts
    from 0 (the budget lets more through that day)."""
    return PREFIX + "pool-budget:" + uid


#: hash — the last pass's counts of every pool, for the pool gauges (:class:`app.pools.stats.PoolCollector`,
#: read by beat's ``/metrics`` at scrape time): field ``<namespace>/<name>`` -> JSON ``{"uid", "desired",
#: "replicas", "ready", "leasable", "updated", "draining", "skippedZones", "leases", "leaseCapacity", "at"}``.
#: No TTL (bounded by the pools).  Written by :func:`app.pools.stats.record` (every pass that acted); fields removed by
#: :func:`app.pools.stats.forget` (a deleted pool, or one whose spec the controller cannot act on) and
#: :func:`app.pools.stats.prune` (``pool.resync``: pools no longer listed).
POOL_STATS = PREFIX + "pool-stats"


def pool_lock(uid: str) -> str:
    """string — the per-pool lock (a redis-py ``Lock`` token naming its holder,
    :class:`app.store.holders.HolderLock`) held by one ``pool.reconcile`` at a time.  TTL: the task hard
    time limit + 10 s; taken over earlier once its holder's heartbeat is gone.  :mod:`app.pools.controller` only."""
    return LOCK_PREFIX + "pool:" + uid


# -- provider health (app.providers.checks) --------------------------------------------------------

#: Prefix of :func:`provider_health`.
PROVIDER_HEALTH_PREFIX = PREFIX + "phealth:"
#: Prefix of :func:`provider_health_since`.
PROVIDER_HEALTH_SINCE_PREFIX = PREFIX + "phealth-since:"


def provider_health(provider: str) -> str:
    """hash — target name → JSON ``{at, ready, reason, message, details, duration}``: the latest
    check verdicts of ``provider``, the one snapshot the ProviderHealth objects and the
    ``proxy_operator_provider_*`` gauges are read from.  No TTL.  Written by the check tasks
    (:func:`app.providers.checks.record_round` / ``record_target``); read by
    :func:`app.providers.checks.read_snapshot` (beat's scrape, the watcher's stale sweep, the
    writers)."""
    return PROVIDER_HEALTH_PREFIX + provider


def provider_health_since(provider: str) -> str:
    """string — epoch seconds ``provider``'s snapshot was first read (``SET NX``), so every reader
    agrees when a target that never reported turns ``CheckStale``.  No TTL.
    :func:`app.providers.checks.read_snapshot` only."""
    return PROVIDER_HEALTH_SINCE_PREFIX + provider


# -- beat (workers.celery_app) --------------------------------------------------------------------

#: redbeat's key prefix (``redbeat_key_prefix``): redbeat owns ``po:redbeat:schedule`` (sorted
#: set of entry keys by due time), ``po:redbeat:lock`` (beat's leader lock, TTL 60 s) and one
#: hash per schedule entry; :mod:`workers.beat_scheduler` re-seeds them after a flush.
REDBEAT_PREFIX = PREFIX + "redbeat"


# -- for the Lua scripts --------------------------------------------------------------------------

#: The locals :func:`lua_header` declares: fixed keys (``K_*``) and per-thing prefixes (``P_*``;
#: a script appends the uid, lease id or client, as the functions above do).
LUA_NAMES = {
    "K_PROXIES": PROXIES,
    "K_LOAD": LOAD,
    "K_FULL": FULL,
    "K_UNHEALTHY": UNHEALTHY,
    "K_DRAINING": DRAINING,
    "K_LEASE_EXPIRY": LEASE_EXPIRY,
    "P_PROXY": PROXY_PREFIX,
    "P_AUTH": AUTH_PREFIX,
    "P_LEASES": PROXY_LEASES_PREFIX,
    "P_LEASE": LEASE_PREFIX,
    "P_RELEASED": RELEASED_PREFIX,
    "P_CLIENT_LEASES": CLIENT_LEASES_PREFIX,
    "P_COOLDOWN": COOLDOWN_PREFIX,
    "P_STICKY": STICKY_PREFIX,
    "K_POOLS": POOLS,
    "P_POOL_DEMAND": POOL_DEMAND_PREFIX,
    "K_POOL_WAKE": POOL_WAKE,
    "P_BAN": BAN_PREFIX,
    "P_BAN_STRIKES": BAN_STRIKES_PREFIX,
    "P_TARGET_LEASES": TARGET_LEASES_PREFIX,
    "P_TARGET_IDENT": TARGET_IDENT_PREFIX,
    "P_REFUSALS": REFUSALS_PREFIX,
    "P_REFUSING": REFUSING_PREFIX,
    "P_IP_BANS": IP_BANS_PREFIX,
    "P_IP_BAN_TIMES": IP_BAN_TIMES_PREFIX,
    "P_IP_OUTCOMES": IP_OUTCOMES_PREFIX,
    "K_BANS": BANS,
}


def lua_header() -> str:
    """Return the Lua that declares :data:`LUA_NAMES` as locals (prepended to every script, so
    the key names reach the scripts from this table and cost nothing per call), and
    :data:`OUTCOME_BUCKET_MS` as ``OUTCOME_BUCKET_MS``."""
    lines = []
    for name, value in LUA_NAMES.items():
        if "'" in value or "\\" in value:
            raise ValueError(f"key name {value!r} cannot be quoted for Lua")
        lines.append(f"local {name} = '{value}'\n")
    lines.append(f"local OUTCOME_BUCKET_MS = {OUTCOME_BUCKET_MS}\n")
    return "".join(lines)
