"""The Redis ACL users of deploy/: one per component, each allowed the keys, channels and commands
it uses and nothing else.

The rules are built here from the key table (:mod:`app.store.keys`) and the broker's queue names
(:mod:`app.dispatch.proxies`), and rendered into ``deploy/base/redis-users.acl`` (``python -m
app.store.acl > deploy/base/redis-users.acl``): regenerate the file whenever a rule here
changes, the two must not differ.

Rule syntax: Redis ACL (https://redis.io/docs/latest/operate/oss_and_stack/management/security/acl/):
``~pattern`` read and write, ``%R~pattern`` read only, ``%W~pattern`` write only (Redis 7.0+;
``DEL`` needs write only), ``&pattern`` a Pub/Sub channel (publish and subscribe alike;
``PSUBSCRIBE`` patterns must be listed literally), ``+@category`` / ``-@category`` / ``+command``
in order.  Scripts (``EVALSHA``) run with their caller's permissions, so every key a Lua script
of :mod:`app.store.lua` touches is in the pattern list of each user that runs it.

The file holds no password: the Redis container appends ``>password`` to each line from the
user's Secret (deploy/base/redis.yaml), and turns the ``default`` user off.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass

from app.store import keys as k
from app.store.queues import GC, HEALTH, HOST_QUEUE_PREFIX, PROXIES

#: The Redis database deploy/ and docker-compose.yml use (``REDIS_URL`` ``.../0``); kombu
#: prefixes its Pub/Sub channels with it (``/0.``).
DB = 0

# -- key families, as patterns -----------------------------------------------------------------

#: Celery's queue lists (kombu keeps a list per queue and one per priority, ``<queue>\x06\x16<n>``).
QUEUES = (PROXIES + "*", HEALTH + "*", GC + "*", HOST_QUEUE_PREFIX + "*")
#: kombu's exchange bindings (``_kombu.binding.<exchange>``, ``_kombu.binding_permanent.<exchange>``),
#: read at every publish and re-created by :mod:`workers.broker` when Redis lost them.
BINDINGS = ("_kombu.binding*",)
#: The bindings Flower declares: its event queues' and its remote-control replies'
#: (``_kombu.binding_deadlines``: kombu's expiry of bindings, shared by every exchange).
FLOWER_BINDINGS = tuple(f"_kombu.binding{kind}.{exchange}" for kind in ("", "_permanent")
                        for exchange in ("celeryev", "reply.celery.pidbox")) + ("_kombu.binding_deadlines",)
#: The event receivers' queues (``celeryev.<uuid>``, one list per priority): kombu checks their
#: length while the events themselves arrive on the channel :data:`EVENTS`.
EVENT_QUEUES = ("celeryev.*",)
#: kombu's unacknowledged-message bookkeeping (``acks_late``): ``unacked``, ``unacked_index``,
#: ``unacked_mutex``.
UNACKED = ("unacked*",)
#: Remote control queues (``<worker>.celery.pidbox``, replies ``<uuid>.reply.celery.pidbox``), for
#: workers with remote control on.
PIDBOX_QUEUES = ("*.celery.pidbox*",)
#: Remote control replies only (Flower's, when it asks).
PIDBOX_REPLIES = ("*.reply.celery.pidbox*",)

SERVING = (k.PROXIES, k.proxy("*"))
AUTH = (k.auth("*"),)
INDEX = (k.LOAD, k.FULL, k.UNHEALTHY, k.DRAINING)
PROXY_LEASES = (k.proxy_leases("*"), k.client_leases("*"))
LEASES = (k.LEASE_EXPIRY, k.lease("*"), k.released("*"))
CLIENT_STATE = (k.cooldown("*"), k.sticky("*", "*"))
#: Bans, per-target concurrency and refusing targets (:mod:`app.serving.bans`).
BAN_KEYS = (k.ban("*"), k.ban_strikes("*", "", "*"), k.target_leases("*", "*"), k.target_ident("*"),
            k.refusals("*"), k.refusing("*"), k.ip_bans("*"), k.ip_ban_times("*"), k.ip_outcomes("*"), k.BANS)
HEALTH_KEYS = (k.HEALTH_DUE, k.HEALTH_OK, k.HEALTH_FAILING, k.HEALTH_OUTAGE, k.health_origin("*"),
               k.HEALTH_SLOW_SLOTS, k.HEALTH_SLOW_TURNS)
#: Every worker's heartbeat and the messages it holds (:mod:`app.store.holders`); ``po:holder:*``
#: covers both the heartbeat and the message set.
HOLDER_KEYS = (k.HOLDERS, k.holder_heartbeat("*"))
DISPATCH = (k.queued("*", "*"), k.own_writes("*"), k.busy("*"), k.parked("*"))
LOCKS = (k.proxy_lock("*"),)  # also the pool locks (po:lock:pool:<uid>)
GC_KEYS = (k.ABANDONED, k.gc_sweep("*"))
POOL_DEMAND = (k.POOLS, k.pool_demand("*", "*"), k.POOL_WAKE)  # also pool_demand_read
POOL_STATE = (k.POOL_STATS, k.pool_scale("*"), k.pool_zone_events("*"), k.pool_budget("*"))
PROVIDER_HEALTH = (k.provider_health("*"),)
PROVIDER_HEALTH_SINCE = (k.provider_health_since("*"),)
REDBEAT = (k.REDBEAT_PREFIX + "*",)  # redbeat appends the entry name without a separator

# -- channels ----------------------------------------------------------------------------------

#: Celery's event channel (``-E`` workers publish task and heartbeat events; Flower subscribes).
EVENTS = f"/{DB}.celeryev/*"
#: Celery's remote-control broadcast channel (workers with remote control subscribe; whoever
#: may publish here can stop their consumers).
PIDBOX = f"/{DB}.celery.pidbox"

# -- commands ----------------------------------------------------------------------------------

#: What every user may run on the keys it is given: no administration (``CONFIG``, ``ACL``,
#: ``FLUSHALL``, ``KEYS``, ``CLIENT KILL``, ``DEBUG``, ``MONITOR``: ``@dangerous``; ``TIME`` is the
#: scripts' clock) and no scripts
#: of its own making (``EVAL``, ``FUNCTION``).
DATA = ("-@all", "+@connection", "+@read", "+@write", "+@keyspace", "+@transaction", "+time", "-@dangerous")
#: The Lua scripts of :mod:`app.store.lua`: ``EVALSHA``, and ``SCRIPT LOAD`` / ``EXISTS`` for the first call.
SCRIPTS = ("+evalsha", "+script|load", "+script|exists")
#: Pub/Sub (only on the channels the user lists).
PUBSUB = ("+@pubsub",)


@dataclass(frozen=True)
class User:
    """One Redis ACL user.

    Attributes:
        name: the user name (``REDIS_USERNAME`` of the component).
        purpose: one line saying who uses it (a comment in the ACL file).
        keys: key patterns read and written.
        read: key patterns only read.
        write: key patterns only written (deleted, overwritten).
        channels: Pub/Sub channels (patterns).
        commands: command rules, in order.
    """

    name: str
    purpose: str
    keys: tuple[str, ...] = ()
    read: tuple[str, ...] = ()
    write: tuple[str, ...] = ()
    channels: tuple[str, ...] = ()
    commands: tuple[str, ...] = DATA

    def rules(self) -> str:
        """The user's ACL rules (without a password), as one ``user`` line of an ACL file:
        ``user <name> reset on ~... %R~... %W~... resetchannels &... -@all +...``."""
        parts = ["user", self.name, "reset", "on"]
        parts += [f"~{p}" for p in self.keys] + [f"%R~{p}" for p in self.read] + [f"%W~{p}" for p in self.write]
        parts += ["resetchannels"] + [f"&{c}" for c in self.channels]
        parts += list(self.commands)
        return " ".join(parts)


#: Every component's user.  The worker user also serves the per-host KVM workers.
USERS: tuple[User, ...] = (
    User("api", "the lease API: the lease scripts and GET /v1/proxies; reads the credentials it hands out",
         keys=INDEX + PROXY_LEASES + LEASES + CLIENT_STATE + BAN_KEYS + (k.pool_demand("*", "*"), k.POOL_WAKE),
         read=SERVING + AUTH + (k.POOLS,),
         commands=DATA + SCRIPTS),
    User("worker",
         "the workers of the proxies and gc queues and the per-host KVM workers: reconcile, GC, pools, provider checks",
         keys=QUEUES + BINDINGS + UNACKED + PIDBOX_QUEUES + SERVING + INDEX + PROXY_LEASES + LEASES + HEALTH_KEYS[:3]
         + DISPATCH + LOCKS + GC_KEYS + POOL_DEMAND + POOL_STATE + PROVIDER_HEALTH + PROVIDER_HEALTH_SINCE
         + HOLDER_KEYS
         # a withdrawal takes the proxy's targeted leases out of their egress IP's concurrency; a
         # reindex that finds the egress IP changed moves them (and counts them in its ban ratio)
         + (k.target_leases("*", "*"), k.target_ident("*"), k.ip_outcomes("*")),
         write=AUTH,
         # the pool controller's recycle policy reads which targets banned a member's egress IP
         read=(k.ip_ban_times("*"),),
         channels=(EVENTS, PIDBOX),
         commands=DATA + SCRIPTS + PUBSUB),
    User("health-worker", "the health worker (health queue): probes, health records, credentials copies",
         keys=QUEUES + BINDINGS + UNACKED + PIDBOX_QUEUES + SERVING + AUTH + INDEX + PROXY_LEASES + HEALTH_KEYS
         + HOLDER_KEYS
         # a new egress IP moves the proxy's live targeted leases (lease_index.lua's follow_ident),
         # counted in the new IP's ban ratio; a withdrawal (a proxy found Failed) takes its live
         # leases out of the expiry index too
         + (k.lease("*"), k.target_leases("*", "*"), k.target_ident("*"), k.LEASE_EXPIRY, k.ip_outcomes("*")),
         # status.bannedTargets: the targets that banned a proxy's egress IP
         read=(k.ip_bans("*"),),
         channels=(EVENTS, PIDBOX),
         commands=DATA + SCRIPTS + PUBSUB),
    User("beat", "beat: the schedule (redbeat), publishing its tasks, the serving, pool and provider gauges",
         keys=QUEUES + BINDINGS + REDBEAT + PROVIDER_HEALTH_SINCE,
         read=SERVING[:1] + INDEX + (k.POOL_STATS,) + PROVIDER_HEALTH,
         commands=DATA + SCRIPTS + PUBSUB),
    User("watcher", "the watcher: de-duplication marks, publishing tasks, refreshing published records "
         "(labels, maxLeases, healthCheck), withdrawing Proxies being deleted, provider-health staleness",
         keys=QUEUES + BINDINGS + DISPATCH + SERVING + INDEX + PROXY_LEASES + PROVIDER_HEALTH_SINCE
         + (k.LEASE_EXPIRY,) + HEALTH_KEYS[:3]
         # a withdrawal takes the proxy's targeted leases out of their egress IP's concurrency
         + (k.target_leases("*", "*"), k.target_ident("*")),
         # a withdrawal reads the owner of each lease it ends and deletes the credentials copy
         write=AUTH,
         read=LOCKS + PROVIDER_HEALTH + HOLDER_KEYS + (k.lease("*"),),
         commands=DATA + SCRIPTS + PUBSUB),
    User("flower", "Flower: reads the queues and the event stream; its control needs the workers' remote control",
         # unacked_mutex: a kombu consumer (Flower's replies) takes it to restore unacknowledged
         # messages, which it then may read but not put back (the workers do)
         keys=EVENT_QUEUES + PIDBOX_REPLIES + FLOWER_BINDINGS + ("unacked_mutex",),
         read=QUEUES + BINDINGS + UNACKED,
         # kombu subscribes to the events and the remote-control channel in one PSUBSCRIBE, and a
         # Redis ACL cannot grant subscribing without publishing: Flower holds the pidbox channel;
         # the workers stop listening to it with remote control off.
         channels=(EVENTS, PIDBOX),
         commands=DATA + SCRIPTS + PUBSUB),
    User("keda", "KEDA's redis scaler (deploy/autoscaling): the queue lengths",
         read=QUEUES,
         commands=("-@all", "+@connection", "+llen", "-@dangerous")),
)


def user(name: str) -> User:
    """Return the user ``name`` of :data:`USERS`.

    Raises:
        KeyError: no such user (the message names the users there are).
    """
    for u in USERS:
        if u.name == name:
            return u
    raise KeyError(f"no Redis ACL user {name!r}; the users are {', '.join(u.name for u in USERS)}")


def render() -> str:
    """Return the text of ``deploy/base/redis-users.acl``: a comment per user, then its rules line."""
    out = ["# Redis ACL users of proxy-operator, one per component (generated from app/store/acl.py:",
           "#   python -m app.store.acl > deploy/base/redis-users.acl). No passwords: the Redis",
           "#   container appends each user's from its Secret (deploy/base/redis.yaml)."]
    for u in USERS:
        out += [f"# {u.name}: {u.purpose}", u.rules()]
    return "\n".join(out) + "\n"


def config(passwords: dict[str, str], text: str | None = None, admin: str | None = None) -> str:
    """Return redis.conf lines defining the users of ``text`` (default :func:`render`) with their
    passwords, and the ``default`` user turned off: what deploy/base/redis.yaml gives redis-server.

    Args:
        passwords: user name → password; a user without one is left out.
        text: an ACL file as :func:`render` writes it.
        admin: when given, the ``default`` user stays on with this password and every right
            (a test's own client) instead of being turned off.
    Raises:
        ValueError: a password has a character outside letters, digits, ``.``, ``_``, ``~``,
            ``-`` (the set deploy/ accepts: no quoting in the config or the URL).
    """
    lines = []
    for line in (render() if text is None else text).splitlines():
        if not line.startswith("user "):
            continue
        name = line.split()[1]
        password = passwords.get(name)
        if not password:
            continue
        if not all(c.isascii() and (c.isalnum() or c in "._~-") for c in password):
            raise ValueError(f"the Redis password of user {name!r} must be letters, digits, '.', '_', '~' or '-' only")
        lines.append(f"{line} >{password}")
    lines.append(f"user default reset on >{admin} ~* &* +@all" if admin else "user default reset off")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    sys.stdout.write(render())
