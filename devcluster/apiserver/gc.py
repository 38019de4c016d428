"""The fake cluster's garbage collector: dependents follow their owners, as on a real cluster.

On a real cluster kube-controller-manager's garbage collector deletes objects whose owners
are gone (Kubernetes docs, "Garbage Collection" and "Owners and Dependents":
https://kubernetes.io/docs/concepts/architecture/garbage-collection/).  The API server's part
is in :meth:`devcluster.apiserver.store.Store.delete`: a delete with ``propagationPolicy`` Orphan or
Foreground (or the deprecated ``orphanDependents``) only marks the owner (``deletionTimestamp``
and the ``orphan`` / ``foregroundDeletion`` finalizer); Background, the default for every type
the fake serves, removes it at once.  This module is the controller's part, the decisions of
upstream's ``pkg/controller/garbagecollector`` (``attemptToDeleteItem``,
``processDeletingDependentsItem``, ``attemptToOrphanWorker``):

* **A dependent whose owners are all gone** (no object of that kind and name, or one with
  another UID) is deleted, with Background propagation (or the propagation its own
  ``orphan`` / ``foregroundDeletion`` finalizer asks for).  A dependent with finalizers of its
  own only gets ``deletionTimestamp`` and stays until they are removed, as usual.  This covers
  Background deletion of an owner and owners deleted while the collector was paused.
* **A dependent with an owner left** (a *solid* owner) is kept; the references to owners that
  are gone or being deleted in the foreground are removed from it.
* **Foreground**: an owner being deleted with the ``foregroundDeletion`` finalizer has its
  dependents deleted (a dependent that has dependents itself is deleted in the foreground
  too); once no dependent with ``blockOwnerDeletion: true`` is left (dependents that carry
  finalizers count until they are really gone) the finalizer is removed, and the owner goes
  with it unless other finalizers hold it.
* **Orphan**: an owner being deleted with the ``orphan`` finalizer has its references
  removed from every dependent, then the finalizer is removed.
* An owner reference whose kind the fake does not serve, or a namespaced owner named by a
  cluster-scoped dependent, cannot be resolved: that dependent is left alone (upstream logs
  and retries it).

The collector runs in a thread (:meth:`GarbageCollector.start`), woken by the store's changes
that involve owner references, so it acts within milliseconds of a change, asynchronously, as
the real one does: tests wait for its effects.  It writes through the store (no HTTP, so it is
neither counted by :meth:`devcluster.apiserver.server.FakeKube.request_count` nor audited), as the
field manager ``kube-controller-manager``.  :meth:`GarbageCollector.pause` stops it (like a
cluster whose controller manager is down; the API server still marks owners) and
:meth:`GarbageCollector.resume` lets it catch up; :meth:`GarbageCollector.collect` runs it
synchronously.
"""

from __future__ import annotations

import contextlib
import json
import logging
import threading
from collections import defaultdict
from typing import Iterator

from devcluster.apiserver.errors import ApiError
from devcluster.apiserver.resources import ResourceType
from devcluster.apiserver.store import FOREGROUND_FINALIZER as FOREGROUND
from devcluster.apiserver.store import ORPHAN_FINALIZER as ORPHAN
from devcluster.apiserver.store import ADDED, DELETED, Closed, Event, Store

log = logging.getLogger("kubefake.gc")

MANAGER = "kube-controller-manager"
#: Passes one :meth:`GarbageCollector.collect` makes at most before it gives up converging.
_MAX_PASSES = 50

_SOLID, _DANGLING, _WAITING = "solid", "dangling", "waiting"


def _gc_finalizers(meta: dict) -> list[str]:
    return [f for f in meta.get("finalizers") or [] if f in (ORPHAN, FOREGROUND)]


class GarbageCollector:
    """Deletes dependents by ``metadata.ownerReferences`` (see the module docstring).

    Args:
        store: the fake's store.
        retry_interval: seconds between passes while a write of the collector keeps failing
            (an admission hook refusing it, say).
    """

    def __init__(self, store: Store, *, retry_interval: float = 0.5) -> None:
        self.store = store
        self.retry_interval = retry_interval
        self._stop = threading.Event()
        self._paused = threading.Event()
        self._wake = threading.Event()
        self._thread: threading.Thread | None = None
        self._owner_uids: set[str] = set()
        self._failing = False
        self._passes = 0

    # -- lifecycle -------------------------------------------------------------------------
    def start(self) -> "GarbageCollector":
        """Run in a daemon thread; return self."""
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="kubefake-gc", daemon=True)
            self._thread.start()
        return self

    def close(self) -> None:
        """Stop the thread (the store's :meth:`Store.close` stops it too)."""
        self._stop.set()
        self._poke()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout=5)

    def pause(self) -> None:
        """Stop collecting until :meth:`resume` (writes to the API go on; nothing is collected)."""
        self._paused.set()

    def resume(self) -> None:
        """Collect again, everything that became garbage while paused included."""
        self._paused.clear()
        self._poke()

    @contextlib.contextmanager
    def paused(self) -> Iterator["GarbageCollector"]:
        """``with gc.paused(): ...``: :meth:`pause`, then :meth:`resume` on the way out."""
        self.pause()
        try:
            yield self
        finally:
            self.resume()

    @property
    def is_paused(self) -> bool:
        """Whether :meth:`pause` is in effect."""
        return self._paused.is_set()

    @property
    def passes(self) -> int:
        """Passes made so far (a test can wait for one more after a change)."""
        return self._passes

    # -- the loop ----------------------------------------------------------------------------
    def _run(self) -> None:
        store = self.store
        sub = None
        full = True  # look at everything: at start, after a 410, on resume
        while not self._stop.is_set():
            try:
                if sub is None:
                    sub = store.subscribe(None, resource_version=str(store.resource_version))
                    full = True
                events = [] if full and not self._paused.is_set() else sub.next(
                    self.retry_interval if self._failing else 1.0)
            except ApiError:  # history compacted under us (410): start over from the current state
                sub = None
                continue
            except Closed:
                return
            if self._wake.is_set():
                self._wake.clear()
                full = True
            if self._stop.is_set() or self._paused.is_set():
                continue
            if full or self._failing or any(self._matters(ev) for ev in events):
                try:
                    self.collect()
                except Exception:  # a bug in the collector must not kill it silently
                    log.exception("kubefake gc: pass failed")
                    self._failing = True
                full = False

    def _poke(self) -> None:
        """Wake the thread out of its wait for store events."""
        self._wake.set()
        with self.store.cond:
            self.store.cond.notify_all()

    def _matters(self, ev: Event) -> bool:
        """Whether a change can give the collector work: a dependent added, removed or with
        other owners; an owner removed or marked for deletion.  A status write (most writes)
        does not, so a busy fleet does not make the collector look at every object each time."""
        new = (ev.obj or {}).get("metadata") or {}
        involved = bool(new.get("ownerReferences")) or new.get("uid") in self._owner_uids
        if ev.type == ADDED:
            return bool(new.get("ownerReferences")) or bool(_gc_finalizers(new))
        if ev.type == DELETED:
            return involved
        old = (ev.old or {}).get("metadata") or {}
        if all(new.get(k) == old.get(k) for k in ("ownerReferences", "deletionTimestamp", "finalizers")):
            return False
        return involved or bool(old.get("ownerReferences")) or bool(_gc_finalizers(new) or _gc_finalizers(old))

    # -- one collection ----------------------------------------------------------------------
    def collect(self) -> int:
        """Collect now, synchronously, until nothing more changes; return the writes made."""
        total = 0
        with self.store.cond:
            self._failing = False
            for _ in range(_MAX_PASSES):
                writes = self._pass()
                total += writes
                if not writes:
                    break
            self._passes += 1
        return total

    def _pass(self) -> int:
        """One look at every object; return the writes made (the caller holds the store's lock)."""
        store = self.store
        dependents: dict[str, list[tuple[ResourceType, str, str, dict]]] = defaultdict(list)
        items: list[tuple[ResourceType, str, str, str]] = []
        deleting_owners: list[tuple[ResourceType, str, str, str]] = []
        for rt, objects in store._objects.items():
            for (ns, name), entry in objects.items():
                meta = entry.obj.get("metadata") or {}
                refs = meta.get("ownerReferences") or []
                for ref in refs:
                    if isinstance(ref, dict) and ref.get("uid"):
                        dependents[ref["uid"]].append((rt, ns, name, ref))
                if refs:
                    items.append((rt, ns, name, meta.get("uid")))
                if meta.get("deletionTimestamp") and _gc_finalizers(meta):
                    deleting_owners.append((rt, ns, name, meta.get("uid")))
        self._owner_uids = set(dependents)
        writes = 0
        for rt, ns, name, uid in deleting_owners:
            writes += self._process_deleting_owner(rt, ns, name, uid, dependents.get(uid, []))
        for rt, ns, name, uid in items:
            writes += self._attempt_to_delete(rt, ns, name, uid, dependents)
        return writes

    def _current(self, rt: ResourceType, ns: str, name: str, uid: str | None) -> dict | None:
        entry = self.store._objects[rt].get((ns, name))
        if entry is None or (uid is not None and entry.obj["metadata"].get("uid") != uid):
            return None
        return json.loads(entry.raw)

    def _process_deleting_owner(self, rt, ns, name, uid, deps) -> int:
        obj = self._current(rt, ns, name, uid)
        if obj is None:
            return 0
        first = _gc_finalizers(obj["metadata"])[0]
        if first == ORPHAN:  # attemptToOrphanWorker: drop the references, then the finalizer
            writes = 0
            for dep_rt, dep_ns, dep_name, _ in deps:
                if self._edit_refs(dep_rt, dep_ns, dep_name, remove={uid}):
                    writes += 1
            return writes + self._remove_finalizer(rt, ns, name, uid, ORPHAN)
        # processDeletingDependentsItem: wait for every blocking dependent to be gone
        blocking = [d for d in deps if d[3].get("blockOwnerDeletion") is True]
        if not blocking:
            return self._remove_finalizer(rt, ns, name, uid, FOREGROUND)
        return 0

    def _classify(self, dep_rt: ResourceType, dep_ns: str, ref: dict) -> str | None:
        """``solid``, ``dangling`` or ``waiting`` (owner deleting in the foreground); ``None``
        when the reference cannot be resolved."""
        api_version = str(ref.get("apiVersion") or "")
        group = api_version.rpartition("/")[0] if "/" in api_version else ""
        owners = [t for t in self.store.types.values() if t.group == group and t.kind == ref.get("kind")]
        if not owners or not ref.get("name") or not ref.get("uid"):
            return None
        owner_rt = owners[0]
        if owner_rt.namespaced and not dep_rt.namespaced:
            return None  # a cluster-scoped dependent cannot name a namespaced owner
        entry = self.store._objects[owner_rt].get((dep_ns if owner_rt.namespaced else "", ref["name"]))
        if entry is None or entry.obj["metadata"].get("uid") != ref["uid"]:
            return _DANGLING
        meta = entry.obj["metadata"]
        if meta.get("deletionTimestamp") and FOREGROUND in (meta.get("finalizers") or []):
            return _WAITING
        return _SOLID

    def _attempt_to_delete(self, rt, ns, name, uid, dependents) -> int:
        obj = self._current(rt, ns, name, uid)
        if obj is None:
            return 0
        meta = obj["metadata"]
        if meta.get("deletionTimestamp"):
            return 0  # being deleted already (one deleting its dependents is handled as an owner)
        refs = [r for r in meta.get("ownerReferences") or [] if isinstance(r, dict)]
        if not refs:
            return 0
        found: dict[str, list[dict]] = {_SOLID: [], _DANGLING: [], _WAITING: []}
        for ref in refs:
            verdict = self._classify(rt, ns, ref)
            if verdict is None:
                return 0
            found[verdict].append(ref)
        if found[_SOLID]:
            gone = {r["uid"] for r in found[_DANGLING] + found[_WAITING]}
            return 1 if gone and self._edit_refs(rt, ns, name, remove=gone) else 0
        if found[_WAITING] and dependents.get(uid):
            writes = 0
            if any(self._deleting_dependents(d) for d in dependents[uid]):
                # its own dependent waits for it while it waits for that one: let go
                writes += self._edit_refs(rt, ns, name, unblock=True)
            return writes + self._delete(rt, ns, name, uid, "Foreground")
        finalizers = meta.get("finalizers") or []
        policy = "Orphan" if ORPHAN in finalizers else "Foreground" if FOREGROUND in finalizers else "Background"
        return self._delete(rt, ns, name, uid, policy)

    def _deleting_dependents(self, dep: tuple) -> bool:
        entry = self.store._objects[dep[0]].get((dep[1], dep[2]))
        meta = entry.obj["metadata"] if entry else {}
        return bool(meta.get("deletionTimestamp")) and FOREGROUND in (meta.get("finalizers") or [])

    # -- writes ------------------------------------------------------------------------------
    def _write(self, what: str, fn, *args, **kwargs) -> int:
        try:
            fn(*args, **kwargs)
            return 1
        except ApiError as exc:
            if exc.code in (404, 409):  # gone or changed meanwhile: the next pass sees the news
                return 0
            log.warning("kubefake gc: %s failed: %s", what, exc.message)
            self._failing = True
            return 0

    def _edit_refs(self, rt: ResourceType, ns: str, name: str, *, remove: set[str] = frozenset(),
                   unblock: bool = False) -> int:
        obj = self._current(rt, ns, name, None)
        if obj is None:
            return 0
        refs = [r for r in obj["metadata"].get("ownerReferences") or [] if not (
            isinstance(r, dict) and r.get("uid") in remove)]
        if unblock:
            refs = [dict(r, blockOwnerDeletion=False) if isinstance(r, dict) and r.get("blockOwnerDeletion") else r
                    for r in refs]
        if refs == (obj["metadata"].get("ownerReferences") or []):
            return 0
        if refs:
            obj["metadata"]["ownerReferences"] = refs
        else:
            obj["metadata"].pop("ownerReferences", None)
        return self._write(f"updating the owner references of {rt.plural} {ns}/{name}", self.store.update,
                           rt, ns, name, obj, manager=MANAGER)

    def _remove_finalizer(self, rt: ResourceType, ns: str, name: str, uid: str, finalizer: str) -> int:
        obj = self._current(rt, ns, name, uid)
        if obj is None or finalizer not in (obj["metadata"].get("finalizers") or []):
            return 0
        obj["metadata"]["finalizers"] = [f for f in obj["metadata"]["finalizers"] if f != finalizer]
        return self._write(f"removing {finalizer} from {rt.plural} {ns}/{name}", self.store.update,
                           rt, ns, name, obj, manager=MANAGER)

    def _delete(self, rt: ResourceType, ns: str, name: str, uid: str, policy: str) -> int:
        return self._write(f"deleting {rt.plural} {ns}/{name}", self.store.delete, rt, ns, name,
                           {"propagationPolicy": policy, "preconditions": {"uid": uid}})
