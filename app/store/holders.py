"""Holders: which operator process holds a lock or a broker message, and whether it still lives.

A worker killed with SIGKILL (an OOM kill, a lost node) runs no cleanup: its locks would stay
until their timeout (task hard time limit + 10 s) and the messages it had taken (running, or held
for their countdown) until the broker's visibility timeout (an hour).  Here each process that
takes them is a *holder* with a heartbeat, so the rest of the fleet sees at once when it is gone:

* **Heartbeat**: ``po:holder:<id>`` (:func:`app.store.keys.holder_heartbeat`), TTL
  ``HOLDER_TTL`` seconds (default 10), refreshed every third of it by a daemon thread; its value is
  the unix time since which the holder has beaten without a gap.  A worker's main process installs
  its holder before the pool forks (:func:`install`): its prefork children share it; any other
  process gets one at its first lock (:func:`current`).
* **Locks** (:class:`HolderLock`, :func:`lock`): the token names the holder
  (``<holder id>|<random>``); a taker that finds the lock held by a holder whose heartbeat is gone
  takes it over at once (``holder_takeover.lua``: compare-and-set on the token read).
* **Messages** (``workers/broker.py``): the delivery tag of every message a worker takes is added
  to ``po:holder:<id>:messages`` with kombu's unacked entry; :func:`reap`, run by every worker every
  couple of seconds, puts the messages of dead holders back on their queues.

A holder judges others only after its own heartbeat has run without a gap for ``HOLDER_TTL``
(:func:`may_judge`): after a Redis outage every heartbeat may have expired, and the live holders
need one period to beat again.  A holder cut off from Redis for longer than ``HOLDER_TTL`` while
it keeps working is taken for dead; its work runs again elsewhere (steps are safe to run twice).
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
import uuid
from typing import Callable

import redis as redis_lib
from redis.lock import Lock

from app.store import keys as redis_keys
from app.store.client import client_from_url
from app.store.lua import Lua
from app.config.settings import env_number

log = logging.getLogger(__name__)

#: Default seconds a holder's heartbeat lives (``HOLDER_TTL``).
DEFAULT_TTL = 10.0
#: Separates the holder id from the random part of a lock token.
SEP = "|"

_TAKEOVER = Lua("holder_takeover")


def holder_ttl() -> float:
    """Seconds a heartbeat lives (``HOLDER_TTL``, default 10, at least 1).

    Raises:
        ValueError: ``HOLDER_TTL`` is not a number >= 1 (the message names it).
    """
    return env_number("HOLDER_TTL", DEFAULT_TTL, minimum=1.0)


def _text(value) -> str | None:
    if value is None:
        return None
    return value.decode() if isinstance(value, bytes) else str(value)


class Holder:
    """One process's identity and heartbeat.

    Args:
        redis: ``redis.Redis`` the heartbeat is written with (its own client: it is used from a
            thread).
        ttl: seconds the heartbeat lives; it is refreshed every ``ttl / 3``.
        holder_id: the id (default ``<hostname>-<pid>-<random>``: unique per process start).
    """

    def __init__(self, redis, ttl: float, holder_id: str | None = None) -> None:
        self.redis, self.ttl = redis, float(ttl)
        self.id = holder_id or f"{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:8]}"
        self._since: float | None = None
        self._last_ok = 0.0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def beat(self) -> bool:
        """Write the heartbeat once; return whether Redis took it (errors are logged, not raised)."""
        now = time.time()
        if self._since is None or now - self._last_ok > self.ttl:
            self._since = now  # a gap (or the first beat): the heartbeat may have expired meanwhile
        key, px = redis_keys.holder_heartbeat(self.id), int(self.ttl * 1000)
        try:
            pipe = self.redis.pipeline()
            pipe.set(key, f"{self._since:.3f}", px=px, get=True)
            pipe.sadd(redis_keys.HOLDERS, self.id)
            before, _ = pipe.execute()
            if before is None and self._since != now:
                # a gap only Redis saw (restarted from a snapshot in which the heartbeats had
                # expired, a lagging replica promoted): the others may not have beaten back yet
                self._since = now
                self.redis.set(key, f"{self._since:.3f}", px=px)
        except redis_lib.RedisError as exc:
            log.debug("holder %s: heartbeat failed: %s", self.id, type(exc).__name__)
            return False
        self._last_ok = now
        return True

    def start(self) -> "Holder":
        """Beat once now, then every ``ttl / 3`` seconds in a daemon thread (idempotent)."""
        if self._thread is None:
            self.beat()
            self._thread = threading.Thread(target=self._run, name="holder-heartbeat", daemon=True)
            self._thread.start()
        return self

    def stop(self) -> None:
        """Stop beating (the heartbeat then expires within ``ttl``)."""
        self._stop.set()

    def _run(self) -> None:
        while not self._stop.wait(self.ttl / 3):
            self.beat()

    def token(self) -> str:
        """A new lock token naming this holder: ``<id>|<random hex>``."""
        return f"{self.id}{SEP}{uuid.uuid4().hex}"


_installed: Holder | None = None


def install(redis_url: str) -> Holder:
    """Make a holder with its heartbeat the holder of this process and of every process it forks
    afterwards (a worker's main process, before its pool forks); return it.

    Raises:
        ValueError: ``HOLDER_TTL`` is malformed.
    """
    global _installed
    if _installed is None:
        _installed = Holder(client_from_url(redis_url), holder_ttl()).start()
    return _installed


def installed() -> Holder | None:
    """The holder :func:`install` made in this process or the one it was forked from, else ``None``."""
    return _installed


_own: Holder | None = None
_own_pid: int | None = None
_own_lock = threading.Lock()


def _new_lock_in_child() -> None:
    global _own_lock
    _own_lock = threading.Lock()


os.register_at_fork(after_in_child=_new_lock_in_child)


def current(redis=None) -> Holder:
    """This process's holder: the installed one (:func:`install`), else one made on the first
    call in this process, beating with ``redis`` (the client of the first lock taken here).

    Raises:
        RuntimeError: no holder yet in this process and no ``redis`` to beat with.
    """
    global _own, _own_pid
    if _installed is not None:
        return _installed
    pid = os.getpid()
    if _own is not None and _own_pid == pid:
        return _own
    with _own_lock:
        if _own is None or _own_pid != pid:
            if redis is None:
                raise RuntimeError("no holder in this process yet and no Redis client to beat with")
            _own, _own_pid = Holder(redis, holder_ttl()).start(), pid
        return _own


def holder_of(token) -> str | None:
    """The holder id a lock token names (``None``: a token of another shape, e.g. a plain redis-py one)."""
    text = _text(token)
    if not text or SEP not in text:
        return None
    return text.split(SEP, 1)[0] or None


def alive(redis, holder_id: str) -> bool:
    """Whether holder ``holder_id``'s heartbeat exists."""
    return bool(redis.exists(redis_keys.holder_heartbeat(holder_id)))


def may_judge(redis, judge: Holder) -> bool:
    """Whether ``judge`` has beaten without a gap for at least its TTL, so a missing heartbeat of
    another holder means that holder is gone (not a Redis outage everyone is still beating back from)."""
    since = _text(redis.get(redis_keys.holder_heartbeat(judge.id)))
    try:
        return since is not None and float(since) <= time.time() - judge.ttl
    except ValueError:
        return False


def held_by_live(redis, name: str) -> bool:
    """Whether lock ``name`` is held by a live holder (or by one that names none: it counts as live
    until its timeout); ``False`` when free or held by a dead holder."""
    token = redis.get(name)
    if token is None:
        return False
    holder = holder_of(token)
    return holder is None or alive(redis, holder)


class HolderLock(Lock):
    """redis-py's ``Lock`` whose token names its holder, taken over from a dead holder (heartbeat
    gone, judged by :func:`may_judge`) instead of waiting for its timeout.

    Args:
        holder: the :class:`Holder` taking the lock (default :func:`current`); the rest as
            ``redis.lock.Lock`` (``acquire``, ``release``, ``blocking_timeout``).  Use :func:`lock`.
            A lock without a timeout is never taken over.
    """

    def __init__(self, *args, holder: Holder | None = None, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.holder = holder

    def _holder(self) -> Holder:
        return self.holder if self.holder is not None else current(self.redis)

    def acquire(self, sleep=None, blocking=None, blocking_timeout=None, token=None) -> bool:
        """redis-py's ``acquire`` with a token naming the holder (see the class)."""
        return super().acquire(sleep=sleep, blocking=blocking, blocking_timeout=blocking_timeout,
                               token=token if token is not None else self._holder().token())

    def do_acquire(self, token) -> bool:
        if super().do_acquire(token):
            return True
        held = self.redis.get(self.name)
        holder = holder_of(held)
        if holder is None or not self.timeout or not may_judge(self.redis, self._holder()):
            return False
        if not _TAKEOVER(self.redis, [self.name, redis_keys.holder_heartbeat(holder)],
                         [held, token, int(self.timeout * 1000)]):
            return False
        log.info("lock %s: its holder %s is gone (no heartbeat); taken over", self.name, holder)
        return True


def lock(redis, name: str, *, timeout: float, blocking_timeout: float | None = None,
         holder: Holder | None = None) -> HolderLock:
    """Return a :class:`HolderLock` on key ``name`` held at most ``timeout`` seconds; ``acquire``
    waits at most ``blocking_timeout`` seconds (``None``: forever); taken by ``holder`` (default
    :func:`current`)."""
    return HolderLock(redis, name, timeout=timeout, blocking_timeout=blocking_timeout, holder=holder)


def reap(redis, restore: Callable[[str], None], judge: Holder) -> int:
    """Put back the messages of every dead holder; return how many delivery tags were handed to ``restore``.

    Args:
        redis: ``redis.Redis`` (bytes or text replies).
        restore: ``restore(delivery_tag)`` puts one message back on its queue when it is still
            unacknowledged (kombu's ``QoS.restore_by_tag``: atomic, so two reapers restore it once).
        judge: the reaping process's holder; nothing is reaped until :func:`may_judge` says so.
    Raises:
        redis.RedisError: Redis unreachable.
    """
    if not may_judge(redis, judge):
        return 0
    restored = 0
    for member in redis.smembers(redis_keys.HOLDERS):
        holder = _text(member)
        if holder is None or holder == judge.id or alive(redis, holder):
            continue
        key = redis_keys.holder_messages(holder)
        tags = [tag for tag in map(_text, redis.smembers(key)) if tag is not None]
        for tag in tags:
            restore(tag)
        restored += len(tags)
        redis.delete(key)
        redis.srem(redis_keys.HOLDERS, holder)
        log.warning("holder %s is gone (no heartbeat for %.0f s): %d message(s) it held put back on their queues",
                    holder, judge.ttl, len(tags))
    return restored


__all__ = ["DEFAULT_TTL", "Holder", "HolderLock", "alive", "current", "held_by_live", "holder_of", "holder_ttl",
           "install", "installed", "lock", "may_judge", "reap"]
