"""The object store behind the fake API server: API semantics without HTTP.

What it reproduces from kube-apiserver (and where upstream defines it):

* ``metadata.resourceVersion``: one global, monotonic counter (etcd's revision); every
  write takes the next value and produces exactly one watch event with it.  A write that
  changes nothing is a no-op: no new resourceVersion, no event (upstream skips the etcd
  write when the object is unchanged).
* Optimistic concurrency: an update or patch whose object carries a resourceVersion other
  than the stored one fails with 409 Conflict.  A ``metadata.uid`` other than the stored one
  fails too: 409 for a PUT (a UID precondition), 422 for a patch (the field is immutable), as
  upstream's release of an ownerReference relies on.  PUT without one is allowed only for types
  that allow unconditional update (not custom resources: 422, as upstream).
* ``metadata.generation`` (custom resources): 1 on create, +1 when anything but
  ``metadata`` and ``status`` changes, +1 when deletion starts (``rest.BeforeDelete``).
* Status subresource: create drops ``status`` (custom resources); main-resource writes keep
  the stored status; ``/status`` writes change only status (``customresource`` strategies).
* Finalizers: DELETE of an object with finalizers sets ``deletionTimestamp`` and keeps it
  (MODIFIED); no new finalizer may be added afterwards (422); the write that removes the
  last finalizer is stored (MODIFIED) and then the object is removed (DELETED).
* Deletion propagation: ``propagationPolicy`` Orphan / Foreground add the ``orphan`` /
  ``foregroundDeletion`` finalizer the garbage collector (:mod:`devcluster.apiserver.gc`) acts on
  (see :meth:`Store.delete`).
* The ``scale`` subresource of types that have one (``autoscaling/v1`` ``Scale`` read from
  and written to the object's replicas paths, :meth:`Store.get_scale` / :meth:`Store.update_scale`
  / :meth:`Store.patch_scale`).
* Lists: ``limit``/``continue`` paging from one consistent snapshot, ``remainingItemCount``,
  410 Expired (with an inconsistent-continuation token) once the snapshot is compacted away,
  and metadata-only ``PartialObjectMetadataList`` answers (see :meth:`Store.list`).
* Watch: events after a given resourceVersion; 410 Expired when that version is older than
  the retained history (etcd compaction); label-selector watches turn "stopped matching"
  into DELETED and "started matching" into ADDED (upstream's filtered watch).
* ``metadata.ownerReferences`` are validated (every field set, one controller at most).
* Built-in defaulting/validation the operator could trip over: Pods get
  ``status.phase: Pending`` on create and may only change container images in place;
  Secret ``stringData`` is folded into ``data``; events.k8s.io/v1 Events need their
  required fields.

Objects are stored as immutable dicts with their JSON encoding; never mutate a stored dict.
"""

from __future__ import annotations

import base64
import bisect
import json
import random
import re
import threading
import uuid
from collections import OrderedDict
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Callable, Iterable

from devcluster.apiserver import apply as ssa
from devcluster.apiserver import resources as R
from devcluster.apiserver.errors import ApiError, Invalid
from devcluster.apiserver.patch import apply_patch
from devcluster.apiserver.resources import ResourceType
from app.serving.selectors import is_label_key, is_label_value
from devcluster.apiserver.selectors import field_matcher, label_matcher

Admit = Callable[[dict, "dict | None"], dict]

ADDED, MODIFIED, DELETED = "ADDED", "MODIFIED", "DELETED"

_DNS_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
_DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
_GENERATE_ALPHABET = "bcdfghjklmnpqrstvwxz2456789"  # k8s.io/apimachinery/pkg/util/rand
#: List snapshots kept for continued pages (older ones are rebuilt from the retained history).
_SNAPSHOTS_KEPT = 8
_EXPIRED_CONTINUE = ("The provided continue parameter is too old to display a consistent list result. You can "
                     "start a new list without the continue parameter, or use the continue token in this response "
                     "to retrieve the remainder of the results. Continuing with the provided token results in an "
                     "inconsistent list - objects that were created, modified, or deleted between the time the "
                     "first chunk was returned and now may show up in the list.")
_SYSTEM_META = ("uid", "creationTimestamp", "deletionTimestamp", "deletionGracePeriodSeconds",
                "generation", "name", "namespace")


def dumps(obj) -> bytes:
    """Compact JSON encoding used for every body and event."""
    return json.dumps(obj, separators=(",", ":")).encode()


def now_rfc3339() -> str:
    """Current UTC time as ``metav1.Time`` (RFC 3339, seconds)."""
    return datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


@dataclass(frozen=True)
class Entry:
    """A stored object and its JSON encoding."""

    obj: dict
    raw: bytes


@dataclass(frozen=True)
class Event:
    """One change, as kept in the watch history.

    Attributes:
        rv: the resourceVersion this write took.
        rtype / namespace / name: what changed.
        type: ``ADDED``, ``MODIFIED`` or ``DELETED``.
        obj / raw: the object after the change (for DELETED, its last state).
        old: the object before the change (``None`` for ADDED).
    """

    rv: int
    rtype: ResourceType
    namespace: str
    name: str
    type: str
    obj: dict
    raw: bytes
    old: dict | None


class Closed(Exception):
    """The store was closed while a subscriber waited."""


class Store:
    """In-memory API objects with kube-apiserver semantics (see the module docstring).

    Args:
        types: the resource types served.
        history_limit: watch events retained; a watch from a resourceVersion older than the
            retained window gets 410 Expired.  At least 90% of the limit is kept after a trim.
        require_namespaces: reject creates in a namespace that does not exist (404), as a
            real server does.  Off by default; ``default`` and ``kube-system`` exist anyway.
    Thread-safe: one condition variable guards all state.
    """

    def __init__(self, types: Iterable[ResourceType] = R.DEFAULT_TYPES, *, history_limit: int = 10000,
                 require_namespaces: bool = False) -> None:
        if history_limit < 10:
            raise ValueError("history_limit must be at least 10")
        self.types: dict[tuple[str, str, str], ResourceType] = {(t.group, t.version, t.plural): t for t in types}
        self.history_limit = history_limit
        self.require_namespaces = require_namespaces
        self.cond = threading.Condition()
        self._rv = 1000                 # last resourceVersion issued
        self._compacted = 1000          # events with rv <= this are no longer retained
        self._history: list[Event] = []  # _history[i].rv == _compacted + 1 + i
        self._objects: dict[ResourceType, dict[tuple[str, str], Entry]] = {t: {} for t in self.types.values()}
        self._admission: dict[ResourceType, Admit] = {}
        self._snapshots: OrderedDict = OrderedDict()  # (type, rv) -> (sorted keys, their entries)
        self._closed = False
        for ns in ("default", "kube-system"):
            if R.NAMESPACES in self._objects:
                self.create(R.NAMESPACES, "", {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}})

    # -- lookup ----------------------------------------------------------------------------
    def resource(self, group: str, version: str, plural: str) -> ResourceType | None:
        """Return the served type for ``group/version/plural`` or ``None``."""
        return self.types.get((group, version, plural))

    def type_named(self, name: str | ResourceType) -> ResourceType:
        """Return a type by plural (``"proxies"``), ``plural.group`` or the type itself.

        Raises:
            KeyError: unknown or ambiguous name.
        """
        if isinstance(name, ResourceType):
            return name
        found = [t for t in self.types.values() if name in (t.plural, t.qualified)]
        if len(found) != 1:
            raise KeyError(f"resource {name!r} is {'ambiguous' if found else 'not served'}")
        return found[0]

    @property
    def resource_version(self) -> int:
        """The last resourceVersion issued."""
        with self.cond:
            return self._rv

    @property
    def compacted_rv(self) -> int:
        """Watches from a resourceVersion below this get 410 Expired."""
        with self.cond:
            return self._compacted

    # -- test hooks ------------------------------------------------------------------------
    def set_admission(self, rtype: str | ResourceType, admit: Admit | None) -> None:
        """Install (or remove with ``None``) the admission hook of a type.

        ``admit(obj, old) -> obj`` runs on every create (``old`` is ``None``), update, patch
        and status write, after the fake's own checks and before the write.  It may return a
        defaulted copy, and raises :class:`devcluster.apiserver.errors.Invalid` to reject (422).
        """
        rt = self.type_named(rtype)
        with self.cond:
            if admit is None:
                self._admission.pop(rt, None)
            else:
                self._admission[rt] = admit

    def compact(self, keep: int = 0) -> int:
        """Drop retained watch history (like an etcd compaction), keeping the newest ``keep`` events.

        Returns the new compacted resourceVersion: watches from below it get 410.
        """
        with self.cond:
            drop = max(0, len(self._history) - keep)
            del self._history[:drop]
            self._compacted += drop
            self.cond.notify_all()
            return self._compacted

    def close(self) -> None:
        """Wake every subscriber with :class:`Closed`."""
        with self.cond:
            self._closed = True
            self.cond.notify_all()

    # -- reads -----------------------------------------------------------------------------
    def get(self, rt: ResourceType, namespace: str, name: str) -> Entry:
        """Return the stored entry.

        Raises:
            ApiError: 404.
        """
        entry = self._objects[rt].get((namespace if rt.namespaced else "", name))
        if entry is None:
            raise ApiError.not_found(rt.group, rt.plural, name)
        return entry

    def find(self, rt: str | ResourceType, namespace: str, name: str) -> dict | None:
        """Return a copy of an object, or ``None`` (a convenience for tests)."""
        rt = self.type_named(rt)
        entry = self._objects[rt].get((namespace if rt.namespaced else "", name))
        return json.loads(entry.raw) if entry else None

    def items(self, rt: str | ResourceType, namespace: str | None = None) -> list[dict]:
        """Return copies of all objects of a type (optionally one namespace), by namespace/name."""
        rt = self.type_named(rt)
        with self.cond:
            entries = sorted(self._objects[rt].items())
        return [json.loads(e.raw) for (ns, _), e in entries if namespace is None or ns == namespace]

    def list(self, rt: ResourceType, namespace: str | None, *, label_selector: str | None = None,
             field_selector: str | None = None, limit: int | None = None,
             continue_token: str | None = None, metadata_only: bool = False) -> bytes:
        """Return a ``<Kind>List`` body, or a ``PartialObjectMetadataList`` with ``metadata_only``.

        Paging as kube-apiserver does it (API concepts, "Retrieving large results sets in
        chunks"): a page holds at most ``limit`` items, in namespace/name order; when more
        match, ``metadata.continue`` says where the next page starts and, for a list without
        selectors, ``metadata.remainingItemCount`` how many items follow.  Continued pages are
        served from the snapshot of the first page: the same ``resourceVersion``, and objects
        written meanwhile as they were then.  A token whose snapshot is older than the retained
        history (compacted, like etcd's revisions) gets 410 Expired; that Status carries in
        ``metadata.continue`` a token that goes on from the current state instead (an
        inconsistent list), as upstream's does.

        Args:
            namespace: ``None`` for all namespaces (or a cluster-scoped type).
            limit / continue_token: pagination.
            metadata_only: answer ``meta.k8s.io/v1`` ``PartialObjectMetadataList`` whose items are
                ``PartialObjectMetadata`` (``kind``, ``apiVersion`` and the whole ``metadata``
                only), what a client asking for ``as=PartialObjectMetadataList`` gets.
        Raises:
            ApiError: 400 for a bad selector or continue token; 410 for an expired token.
        """
        labels = label_matcher(label_selector)
        fields = field_matcher(field_selector, rt.field_selectors)
        start_after: tuple[str, str] | None = None
        token_rv: int | None = None
        if continue_token:
            try:
                tok = json.loads(base64.urlsafe_b64decode(continue_token.encode()))
                start_after, token_rv = tuple(tok["start"]), int(tok["rv"])
                if len(start_after) != 2 or not all(isinstance(p, str) for p in start_after):
                    raise ValueError(continue_token)
            except (ValueError, KeyError, TypeError):
                raise ApiError.bad_request(f"invalid continue token {continue_token!r}") from None
        with self.cond:
            if token_rv is not None and token_rv > self._rv:
                raise ApiError.bad_request(f"invalid continue token {continue_token!r}")
            if token_rv is not None and 0 <= token_rv < self._compacted:
                raise ApiError(410, "Expired", _EXPIRED_CONTINUE,
                               metadata={"continue": _continue_token(-1, start_after)})
            rv = self._rv if token_rv is None or token_rv < 0 else token_rv  # -1: from the current state
            keys, entries = self._snapshot(rt, rv)
        start = bisect.bisect_right(keys, start_after) if start_after is not None else 0
        end = len(keys)
        if namespace is not None:  # keys sort by (namespace, name): one namespace is one run
            start = max(start, bisect.bisect_left(keys, (namespace, "")))
            end = bisect.bisect_left(keys, (namespace + "\0",))
        out: list[bytes] = []
        last = more = -1
        for i in range(start, end):
            entry = entries[i]
            if labels and not labels(entry.obj):
                continue
            if fields and not fields(entry.obj):
                continue
            if limit and len(out) >= limit:
                more = last
                break
            out.append(dumps({"kind": "PartialObjectMetadata", "apiVersion": "meta.k8s.io/v1",
                              "metadata": entry.obj.get("metadata", {})}) if metadata_only else entry.raw)
            last = i
        meta: dict = {"resourceVersion": str(rv)}
        if more >= 0:
            meta["continue"] = _continue_token(rv, keys[more])
            if not labels and not fields:
                meta["remainingItemCount"] = end - more - 1
        if metadata_only:
            head = dumps({"kind": "PartialObjectMetadataList", "apiVersion": "meta.k8s.io/v1", "metadata": meta})
        else:
            head = dumps({"apiVersion": rt.api_version, "kind": rt.list_kind, "metadata": meta})
        return head[:-1] + b',"items":[' + b",".join(out) + b"]}"

    def _snapshot(self, rt: ResourceType, rv: int) -> tuple[list, list]:
        """The sorted keys of ``rt`` and their entries as they were at ``rv``.

        The caller holds the lock and has checked ``compacted <= rv <= current``: the retained
        history then holds every write after ``rv``, and undoing them gives the state at ``rv``.
        """
        cached = self._snapshots.get((rt, rv))
        if cached is not None:
            self._snapshots.move_to_end((rt, rv))
            return cached
        objects = self._objects[rt]
        if rv < self._rv:
            objects = dict(objects)
            for ev in reversed(self._history[rv - self._compacted:]):
                if ev.rtype is not rt:
                    continue
                if ev.old is None:  # ADDED
                    objects.pop((ev.namespace, ev.name), None)
                else:
                    objects[(ev.namespace, ev.name)] = Entry(ev.old, dumps(ev.old))
        items = sorted(objects.items(), key=lambda kv: kv[0])
        snapshot = ([k for k, _ in items], [e for _, e in items])
        self._snapshots[(rt, rv)] = snapshot
        while len(self._snapshots) > _SNAPSHOTS_KEPT:
            self._snapshots.popitem(last=False)
        return snapshot

    def seed(self, rt: str | ResourceType, objects: Iterable[dict]) -> int:
        """Store many objects at once, as given (benchmark setup); return how many.

        Each object keeps everything it carries (``status`` included) and gets what the server
        would have set when missing: ``apiVersion``/``kind``, ``metadata.namespace``
        (``default``), ``uid``, ``creationTimestamp``, ``generation`` 1 (types that track it),
        and the next resourceVersion.  No admission, defaulting or validation runs and no watch
        event is kept: the retained history is compacted past the seeded objects (as after an
        etcd compaction), so a watch from an earlier resourceVersion gets 410 Expired.  The
        dicts become the store's: do not touch them afterwards.

        Raises:
            ApiError: 409 when an object of that name exists already (objects before it are stored).
        """
        rt = self.type_named(rt)
        now = now_rfc3339()
        count = 0
        with self.cond:
            stored = self._objects[rt]
            try:
                for obj in objects:
                    meta = obj.setdefault("metadata", {})
                    if rt.namespaced:
                        namespace = meta.setdefault("namespace", "default")
                    else:
                        namespace = ""
                        meta.pop("namespace", None)
                    key = (namespace, meta["name"])
                    if key in stored:
                        raise ApiError.already_exists(rt.group, rt.plural, meta["name"])
                    obj.setdefault("apiVersion", rt.api_version)
                    obj.setdefault("kind", rt.kind)
                    meta.setdefault("uid", str(uuid.uuid4()))
                    meta.setdefault("creationTimestamp", now)
                    if rt.track_generation:
                        meta.setdefault("generation", 1)
                    self._rv += 1
                    meta["resourceVersion"] = str(self._rv)
                    stored[key] = Entry(obj, dumps(obj))
                    count += 1
            finally:
                self._history.clear()
                self._compacted = self._rv
                self.cond.notify_all()
        return count

    # -- writes ----------------------------------------------------------------------------
    def create(self, rt: ResourceType, namespace: str, body, *, dry_run: bool = False,
               field_validation: str | None = None, manager: str | None = None) -> bytes:
        """Create an object (POST) and return its JSON.

        ``field_validation`` is the request's ``fieldValidation`` (passed to admission hooks
        that take it); ``manager`` its field manager (``managedFields`` are kept only for an
        object created by a server-side apply, see :mod:`devcluster.apiserver.apply`).

        Raises:
            ApiError: 400 (kind/namespace mismatch, resourceVersion set), 404 (namespace
                missing when required), 409 AlreadyExists, 422 Invalid.
        """
        obj = self._check_body(rt, body)
        meta = obj["metadata"]
        if rt.namespaced:
            if meta.get("namespace") and meta["namespace"] != namespace:
                raise ApiError.bad_request("the namespace of the provided object does not match the "
                                           "namespace sent on the request")
            meta["namespace"] = namespace
        else:
            meta.pop("namespace", None)
            namespace = ""
        if meta.get("resourceVersion"):
            raise ApiError.bad_request("resourceVersion should not be set on objects to be created")
        applied = meta.pop("managedFields", None) if manager == "\0apply" else None
        for key in ("uid", "creationTimestamp", "deletionTimestamp", "deletionGracePeriodSeconds",
                    "generation", "managedFields"):
            meta.pop(key, None)
        with self.cond:
            if not meta.get("name"):
                prefix = meta.get("generateName")
                if not prefix:
                    raise self._invalid(rt, "", [("metadata.name", "Required value: name or generateName is required")])
                for _ in range(10):
                    name = prefix + "".join(random.choice(_GENERATE_ALPHABET) for _ in range(5))
                    if (namespace, name) not in self._objects[rt]:
                        break
                meta["name"] = name
            name = meta["name"]
            self._check_name(rt, name)
            if (namespace, name) in self._objects[rt]:
                raise ApiError.already_exists(rt.group, rt.plural, name)
            if rt.namespaced and self.require_namespaces and ("", namespace) not in self._objects.get(R.NAMESPACES, {}):
                raise ApiError.not_found("", "namespaces", namespace)
            meta["uid"] = str(uuid.uuid4())
            meta["creationTimestamp"] = now_rfc3339()
            if rt.track_generation:
                meta["generation"] = 1
            if rt.status_subresource and not rt.builtin:
                obj.pop("status", None)
            _prepare_create_builtin(rt, obj)
            obj = self._admit(rt, obj, None, field_validation)
            if applied:
                obj["metadata"]["managedFields"] = applied
            if dry_run:
                return dumps(obj)
            return self._commit(rt, namespace, name, ADDED, obj, None).raw

    def update(self, rt: ResourceType, namespace: str, name: str, body, *, subresource: str | None = None,
               dry_run: bool = False, field_validation: str | None = None, manager: str | None = None) -> bytes:
        """Replace an object (PUT) or its status (PUT ``/status``) and return its JSON.

        Raises:
            ApiError: 400 (name mismatch), 404, 409 Conflict (stale resourceVersion),
                422 Invalid (missing resourceVersion for a type that needs one, new finalizer
                on a deleting object, admission).
        """
        new = self._check_body(rt, body)
        if new["metadata"].get("name") and new["metadata"]["name"] != name:
            raise ApiError.bad_request(f"the name of the object ({new['metadata']['name']}) does not match "
                                       f"the name on the URL ({name})")
        with self.cond:
            old = self.get(rt, namespace, name)
            if not new["metadata"].get("resourceVersion") and not rt.unconditional_update:
                raise self._invalid(rt, name, [("metadata.resourceVersion",
                                                "Invalid value: 0: must be specified for an update")])
            uid = new["metadata"].get("uid")
            if uid and uid != old.obj["metadata"].get("uid"):  # the body's UID is a precondition of a PUT
                raise ApiError.conflict(rt.group, rt.plural, name,
                                        f"Precondition failed: UID in precondition: {uid}, "
                                        f"UID in object meta: {old.obj['metadata'].get('uid')}")
            return self._update_locked(rt, namespace, name, old, new, subresource, dry_run,
                                       field_validation, manager)

    def patch(self, rt: ResourceType, namespace: str, name: str, content_type: str, patch, *,
              subresource: str | None = None, dry_run: bool = False, field_validation: str | None = None,
              manager: str | None = None) -> bytes:
        """Patch an object or its status and return its JSON (server-side apply: :meth:`apply`).

        A ``metadata.resourceVersion`` in the patch is a precondition (409 when stale); a
        ``metadata.uid`` other than the object's is refused (422: the field is immutable).  A
        merge patch of a list (``metadata.ownerReferences``) replaces it; ``null`` removes it.
        Raises:
            ApiError: 404, 409, 415 (patch type), 422.
        """
        with self.cond:
            old = self.get(rt, namespace, name)
            base = json.loads(old.raw)
            new = apply_patch(content_type, base, patch, builtin=rt.builtin)
            new = self._check_body(rt, new)
            return self._update_locked(rt, namespace, name, old, new, subresource, dry_run,
                                       field_validation, manager)

    def apply(self, rt: ResourceType, namespace: str, name: str, config, *, manager: str | None,
              force: bool = False, subresource: str | None = None, dry_run: bool = False,
              field_validation: str | None = None) -> tuple[int, bytes]:
        """Server-side apply (PATCH ``application/apply-patch+yaml``); return ``(HTTP status, JSON)``.

        ``config`` is the decoded apply configuration, ``manager`` the ``fieldManager``
        (required), ``force`` takes fields from other managers (see :mod:`devcluster.apiserver.apply`).
        A missing object is created (201).
        Raises:
            ApiError: 400 (no fieldManager, not an object), 404 (status of a missing object),
                409 (stale resourceVersion, conflicts), 422.
        """
        if not manager:
            raise ApiError.bad_request("PATCH, application/apply-patch+yaml requests must include a "
                                       "fieldManager query parameter")
        if not isinstance(config, dict):
            raise ApiError.bad_request("an apply patch must be a YAML or JSON object")
        with self.cond:
            return self._apply_locked(rt, namespace, name, config, manager, force, subresource, dry_run,
                                      field_validation)

    def _apply_locked(self, rt: ResourceType, namespace: str, name: str, config: dict, manager: str, force: bool,
                      subresource: str | None, dry_run: bool, field_validation: str | None) -> tuple[int, bytes]:
        config = json.loads(json.dumps(config))
        self._check_body(rt, config)
        meta = config["metadata"]
        if meta.get("name") and meta["name"] != name:
            raise ApiError.bad_request(f"the name of the object ({meta['name']}) does not match the name on the "
                                       f"URL ({name})")
        meta["name"] = name
        key = (namespace if rt.namespaced else "", name)
        entry = self._objects[rt].get(key)
        if entry is None:
            if subresource:
                raise ApiError.not_found(rt.group, rt.plural, name)
            obj = ssa.apply(None, config, manager=manager, force=force, subresource=None,
                            api_version=rt.api_version, plural=rt.plural, group=rt.group, name=name,
                            now=now_rfc3339())
            return 201, self.create(rt, namespace, obj, dry_run=dry_run, field_validation=field_validation,
                                    manager="\0apply")
        want_rv = meta.pop("resourceVersion", None)
        if want_rv and want_rv != entry.obj["metadata"]["resourceVersion"]:
            raise ApiError.conflict(rt.group, rt.plural, name, "the object has been modified; please apply your "
                                    "changes to the latest version and try again")
        new = ssa.apply(json.loads(entry.raw), config, manager=manager, force=force, subresource=subresource,
                        api_version=rt.api_version, plural=rt.plural, group=rt.group, name=name, now=now_rfc3339())
        return 200, self._update_locked(rt, namespace, name, entry, new, subresource, dry_run, field_validation,
                                        "\0apply")

    # -- scale subresource --------------------------------------------------------------------
    def get_scale(self, rt: ResourceType, namespace: str, name: str) -> bytes:
        """GET ``.../<name>/scale``: the object's ``autoscaling/v1`` ``Scale``.

        Raises:
            ApiError: 404 (no such object, or the type has no scale subresource).
        """
        scale_of = _scale_paths(rt)
        with self.cond:
            return dumps(_scale(rt, scale_of, self.get(rt, namespace, name).obj)[0])

    def update_scale(self, rt: ResourceType, namespace: str, name: str, body, *, dry_run: bool = False,
                     manager: str | None = None) -> bytes:
        """PUT ``.../<name>/scale``: write ``spec.replicas`` of the Scale into the object.

        A ``metadata.resourceVersion`` in the Scale is a precondition on the object (409 when
        stale); without one the write is unconditional.  The object is written like a main
        resource update (admission, a new ``generation`` when the replicas change, no event
        when they do not); the answer is the new Scale.

        Raises:
            ApiError: 400 (not a Scale, name mismatch), 404, 409, 422 (negative replicas,
                admission).
        """
        if not isinstance(body, dict):
            raise ApiError.bad_request("the request body must be a JSON object")
        return self._write_scale(rt, namespace, name, lambda scale: body, dry_run, manager)

    def patch_scale(self, rt: ResourceType, namespace: str, name: str, content_type: str, patch, *,
                    dry_run: bool = False, manager: str | None = None) -> bytes:
        """PATCH ``.../<name>/scale`` (merge, JSON or strategic merge patch of the Scale), as
        ``kubectl scale`` sends it; then as :meth:`update_scale`.

        Raises:
            ApiError: as :meth:`update_scale`; 415 for server-side apply.
        """
        return self._write_scale(rt, namespace, name,
                                 lambda scale: apply_patch(content_type, scale, patch, builtin=True),
                                 dry_run, manager)

    def _write_scale(self, rt: ResourceType, namespace: str, name: str, change, dry_run: bool,
                     manager: str | None) -> bytes:
        scale_of = _scale_paths(rt)
        with self.cond:
            old = self.get(rt, namespace, name)
            current, found = _scale(rt, scale_of, old.obj)
            if not found:
                current["spec"]["replicas"] = _NO_REPLICAS
            new = change(json.loads(json.dumps(current)))
            if not isinstance(new, dict):
                raise ApiError.bad_request("the request body must be a JSON object")
            if new.get("kind") not in (None, "Scale") or new.get("apiVersion") not in (None, "autoscaling/v1"):
                raise ApiError.bad_request(f"the kind in the data ({new.get('kind')}, {new.get('apiVersion')}) does "
                                           "not match the expected kind (Scale, autoscaling/v1)")
            meta = new.get("metadata") or {}
            if meta.get("name") not in (None, "", name):
                raise ApiError.bad_request(f"the name of the object ({meta['name']}) does not match the name on "
                                           f"the URL ({name})")
            replicas = (new.get("spec") or {}).get("replicas", 0)
            if isinstance(replicas, bool) or not isinstance(replicas, int) or not -2**31 <= replicas < 2**31:
                raise ApiError.bad_request(f"Scale in version \"v1\" cannot be handled as a Scale: "
                                           f"spec.replicas: {json.dumps(replicas)} is not an int32")
            if replicas == _NO_REPLICAS:
                raise ApiError.bad_request(f'the spec replicas field "{scale_of.spec_replicas_path}" cannot be empty')
            if replicas < 0:
                raise ApiError.invalid("autoscaling", "Scale", name, [{
                    "reason": "FieldValueInvalid", "field": "spec.replicas",
                    "message": f"Invalid value: {replicas}: must be greater than or equal to 0"}])
            obj = json.loads(old.raw)
            _set_path(obj, scale_of.spec_replicas_path, replicas)
            if meta.get("resourceVersion"):
                obj["metadata"]["resourceVersion"] = meta["resourceVersion"]
            else:
                obj["metadata"].pop("resourceVersion", None)
            raw = self._update_locked(rt, namespace, name, old, obj, None, dry_run, None, manager)
            return dumps(_scale(rt, scale_of, json.loads(raw))[0])

    def delete(self, rt: ResourceType, namespace: str, name: str, options: dict | None = None, *,
               dry_run: bool = False) -> bytes:
        """Delete an object; with finalizers, only start its deletion.

        The garbage collector's part of the API server (``deletionFinalizersForGarbageCollection``
        in k8s.io/apiserver's generic registry): ``propagationPolicy: Orphan`` (or the deprecated
        ``orphanDependents: true``) adds the ``orphan`` finalizer, ``Foreground`` the
        ``foregroundDeletion`` finalizer (removing the other one); ``Background``, or no policy on
        an object without either finalizer (the default for every type served), adds none.  An
        object left with finalizers gets ``deletionTimestamp`` and stays; a repeated delete may
        change the policy.  The rest is :mod:`devcluster.apiserver.gc`'s.

        Args:
            options: ``DeleteOptions`` (``preconditions.uid`` / ``preconditions.resourceVersion``
                are checked; ``propagationPolicy`` / ``orphanDependents`` as above; the grace
                period is accepted and ignored).
        Returns:
            The object's JSON when it stays (finalizers) or when the type returns deleted
            objects (Pods), else a ``Status`` with ``status: Success``.
        Raises:
            ApiError: 404, 409 on a failed precondition, 422 for bad propagation options.
        """
        options = options or {}
        orphan_finalizer = _deletion_policy(options)
        with self.cond:
            entry = self.get(rt, namespace, name)
            meta = entry.obj["metadata"]
            pre = options.get("preconditions") or {}
            if pre.get("uid") and pre["uid"] != meta.get("uid"):
                raise ApiError.conflict(rt.group, rt.plural, name,
                                        f"Precondition failed: UID in precondition: {pre['uid']}, "
                                        f"UID in object meta: {meta.get('uid')}")
            if pre.get("resourceVersion") and pre["resourceVersion"] != meta.get("resourceVersion"):
                raise ApiError.conflict(rt.group, rt.plural, name,
                                        f"Precondition failed: ResourceVersion in precondition: "
                                        f"{pre['resourceVersion']}, ResourceVersion in object meta: "
                                        f"{meta.get('resourceVersion')}")
            current = list(meta.get("finalizers") or [])
            finalizers = _deletion_finalizers(current, orphan_finalizer)
            if finalizers:
                if meta.get("deletionTimestamp") and set(finalizers) == set(current):
                    return entry.raw
                obj = json.loads(entry.raw)
                if not meta.get("deletionTimestamp"):
                    obj["metadata"]["deletionTimestamp"] = now_rfc3339()
                    obj["metadata"]["deletionGracePeriodSeconds"] = 0
                    if obj["metadata"].get("generation"):
                        obj["metadata"]["generation"] += 1
                obj["metadata"]["finalizers"] = finalizers
                if dry_run:
                    return dumps(obj)
                return self._commit(rt, namespace, name, MODIFIED, obj, entry.obj).raw
            if dry_run:
                return entry.raw
            gone = self._commit(rt, namespace, name, DELETED, json.loads(entry.raw), entry.obj)
            if rt.return_deleted_object:
                return gone.raw
            return dumps({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success",
                          "details": {"name": name, "group": rt.group, "kind": rt.plural,
                                      "uid": meta.get("uid")}})

    # -- watch -----------------------------------------------------------------------------
    def subscribe(self, rt: ResourceType | None, namespace: str | None = None, *,
                  label_selector: str | None = None, field_selector: str | None = None,
                  resource_version: str | None = None) -> "Subscription":
        """Start a watch (see :class:`Subscription`).

        Args:
            rt: the type watched, or ``None`` for every type (in-process observers).
            resource_version: ``None``/``""``/``"0"``: synthetic ADDED events for the current
                objects, then changes; else changes after that version.
        Raises:
            ApiError: 400 for bad selectors or resourceVersion; 410 Expired when the version
                is older than the retained history.
        """
        labels = label_matcher(label_selector)
        fields = field_matcher(field_selector, rt.field_selectors if rt else frozenset())
        with self.cond:
            initial: list[Event] = []
            if resource_version in (None, "", "0"):
                start = self._rv
                for t in ([rt] if rt else list(self._objects)):
                    for (ns, name), e in sorted(self._objects[t].items()):
                        initial.append(Event(int(e.obj["metadata"]["resourceVersion"]), t, ns, name, ADDED,
                                             e.obj, e.raw, None))
            else:
                try:
                    start = int(resource_version)
                except ValueError:
                    raise ApiError.bad_request(f"invalid resource version: {resource_version!r}") from None
                if start < self._compacted:
                    raise ApiError.gone(f"too old resource version: {start} ({self._compacted + 1})")
        sub = Subscription(self, rt, namespace, labels, fields, start)
        sub.pending = [e for e in (sub.filter(ev) for ev in initial) if e is not None]
        return sub

    # -- internals -------------------------------------------------------------------------
    def _check_body(self, rt: ResourceType, body) -> dict:
        if not isinstance(body, dict):
            raise ApiError.bad_request("the request body must be a JSON object")
        kind, api_version = body.get("kind"), body.get("apiVersion")
        if not rt.builtin and not kind:
            raise ApiError.bad_request("Object 'Kind' is missing in '" + json.dumps(body)[:200] + "'")
        if not rt.builtin and not api_version:
            raise ApiError.bad_request("Object 'apiVersion' is missing in '" + json.dumps(body)[:200] + "'")
        if kind and kind != rt.kind:
            raise ApiError.bad_request(f"the kind in the data ({kind}) does not match the expected kind ({rt.kind})")
        if api_version and api_version != rt.api_version:
            raise ApiError.bad_request(f"the API version in the data ({api_version}) does not match the "
                                       f"expected API version ({rt.api_version})")
        meta = body.get("metadata")
        if meta is None:
            body["metadata"] = meta = {}
        if not isinstance(meta, dict):
            raise ApiError.bad_request("metadata must be an object")
        for key in ("labels", "annotations"):
            value = meta.get(key)
            if value is not None and (not isinstance(value, dict)
                                      or not all(isinstance(v, str) for v in value.values())):
                raise self._invalid(rt, meta.get("name", ""), [(f"metadata.{key}",
                                                                "Invalid value: values must be strings")])
        causes = label_errors(meta.get("labels"))
        if causes:
            raise self._invalid(rt, meta.get("name", ""), causes)
        if meta.get("finalizers") is not None and not (isinstance(meta["finalizers"], list)
                                                       and all(isinstance(f, str) for f in meta["finalizers"])):
            raise self._invalid(rt, meta.get("name", ""),
                                [("metadata.finalizers", "Invalid value: must be a list of strings")])
        causes = _owner_reference_errors(meta.get("ownerReferences"))
        if causes:
            raise self._invalid(rt, meta.get("name", ""), causes)
        body["kind"], body["apiVersion"] = rt.kind, rt.api_version
        return body

    def _check_name(self, rt: ResourceType, name: str) -> None:
        pattern, limit = (_DNS_LABEL, 63) if rt is R.NAMESPACES else (_DNS_SUBDOMAIN, 253)
        if len(name) > limit or not pattern.match(name):
            raise self._invalid(rt, name, [("metadata.name", f'Invalid value: "{name}": a lowercase RFC 1123 '
                                            f"{'label' if limit == 63 else 'subdomain'} must consist of lower "
                                            "case alphanumeric characters, '-' or '.', and must start and end "
                                            "with an alphanumeric character")])

    def _invalid(self, rt: ResourceType, name: str, causes) -> ApiError:
        return ApiError.invalid(rt.group, rt.kind, name, Invalid(causes).causes)

    def _admit(self, rt: ResourceType, obj: dict, old: dict | None, field_validation: str | None = None) -> dict:
        _validate_builtin(self, rt, obj, old)
        hook = self._admission.get(rt)
        if hook is None:
            return obj
        name = obj["metadata"].get("name", "")
        try:
            if getattr(hook, "takes_field_validation", False):
                out = hook(obj, old, field_validation=field_validation)
            else:
                out = hook(obj, old)
        except Invalid as exc:
            raise ApiError.invalid(rt.group, rt.kind, name, exc.causes) from None
        except ValueError as exc:
            # devcluster.crd_validation: Invalid carries its own Status (422);
            # StrictDecodingError (unknown fields under fieldValidation=Strict) is a 400.
            if callable(getattr(exc, "status", None)):
                body = exc.status(rt.kind, rt.group, name)
                raise ApiError(422, "Invalid", body["message"], body.get("details")) from None
            if hasattr(exc, "fields"):  # worded like the server's strict decoding error
                raise ApiError.bad_request(f'{rt.kind} in version "{rt.version}" cannot be handled as a '
                                           f"{rt.kind}: {exc}") from None
            raise
        return obj if out is None else out

    def _update_locked(self, rt: ResourceType, namespace: str, name: str, old: Entry, new: dict,
                       subresource: str | None, dry_run: bool, field_validation: str | None = None,
                       manager: str | None = None) -> bytes:
        if subresource not in (None, "status"):
            raise ApiError(404, "NotFound", f"the server could not find the requested resource ({subresource})")
        if subresource == "status" and not rt.status_subresource:
            raise ApiError(404, "NotFound", "the server could not find the requested resource")
        old_meta = old.obj["metadata"]
        want_rv = new["metadata"].get("resourceVersion")
        if want_rv and want_rv != old_meta["resourceVersion"]:
            raise ApiError.conflict(rt.group, rt.plural, name, "the object has been modified; please apply your "
                                    "changes to the latest version and try again")
        want_uid = new["metadata"].get("uid")
        if want_uid and want_uid != old_meta.get("uid"):  # a PATCH naming another UID (ValidateObjectMetaUpdate)
            raise self._invalid(rt, name, [("metadata.uid", f'Invalid value: "{want_uid}": field is immutable')])
        managed = new["metadata"].get("managedFields") if manager == "\0apply" else None
        if subresource == "status":
            result = json.loads(old.raw)
            if "status" in new:
                result["status"] = new["status"]
            else:
                result.pop("status", None)
        else:
            result = new
            meta = result["metadata"]
            for key in _SYSTEM_META:
                if key in old_meta:
                    meta[key] = old_meta[key]
                else:
                    meta.pop(key, None)
            if rt.status_subresource:
                if "status" in old.obj:
                    result["status"] = old.obj["status"]
                else:
                    result.pop("status", None)
        result["metadata"]["resourceVersion"] = old_meta["resourceVersion"]
        deleting = bool(old_meta.get("deletionTimestamp"))
        if deleting:
            before = old_meta.get("finalizers") or []
            added = [f for f in result["metadata"].get("finalizers") or [] if f not in before]
            if added:
                raise self._invalid(rt, name, [("metadata.finalizers", "Forbidden: no new finalizers can be added "
                                                f"if the object is being deleted, found new finalizers {added}")])
        if not result["metadata"].get("finalizers"):
            result["metadata"].pop("finalizers", None)
        _prepare_update_builtin(self, rt, result, old.obj)
        result = self._admit(rt, result, old.obj, field_validation)
        if managed is not None:
            result["metadata"]["managedFields"] = managed
        else:
            ssa.record_update(old.obj, result, manager=manager or "unknown", subresource=subresource,
                              api_version=rt.api_version, now=now_rfc3339())
        if rt.track_generation and _spec_part(result) != _spec_part(old.obj):
            result["metadata"]["generation"] = int(old_meta.get("generation") or 0) + 1
        if result == old.obj:
            return old.raw  # no-op: no new resourceVersion, no event
        if dry_run:
            return dumps(result)
        entry = self._commit(rt, namespace, name, MODIFIED, result, old.obj)
        if deleting and not result["metadata"].get("finalizers"):
            entry = self._commit(rt, namespace, name, DELETED, json.loads(entry.raw), entry.obj)
        return entry.raw

    def _commit(self, rt: ResourceType, namespace: str, name: str, etype: str, obj: dict,
                old: dict | None) -> Entry:
        """Store ``obj`` (or remove it for DELETED) under the next resourceVersion; caller holds the lock."""
        key = (namespace if rt.namespaced else "", name)
        self._rv += 1
        obj["metadata"]["resourceVersion"] = str(self._rv)
        entry = Entry(obj, dumps(obj))
        if etype == DELETED:
            self._objects[rt].pop(key, None)
        else:
            self._objects[rt][key] = entry
        self._history.append(Event(self._rv, rt, key[0], name, etype, obj, entry.raw, old))
        if len(self._history) > self.history_limit:
            drop = len(self._history) - (self.history_limit * 9) // 10
            del self._history[:drop]
            self._compacted += drop
        self.cond.notify_all()
        return entry


def label_errors(labels) -> list[tuple[str, str]]:
    """What the API server refuses in ``metadata.labels`` (k8s.io/apimachinery
    ``ValidateLabels``): a key that is no qualified name (an optional DNS-subdomain prefix of at
    most 253 characters and ``/``, then at most 63 alphanumerics, ``-``, ``_``, ``.``), a value
    longer than 63 characters or not of that alphabet; ``[(field, message)]``, ``[]`` when fine."""
    causes = []
    for key, value in (labels or {}).items():
        if not is_label_key(key):
            causes.append(("metadata.labels", f'Invalid value: "{key}": name part must consist of alphanumeric '
                                              "characters, '-', '_' or '.', and must start and end with an "
                                              "alphanumeric character, at most 63 characters"))
        if len(value) > 63:
            causes.append(("metadata.labels", f'Invalid value: "{value}": must be no more than 63 characters'))
        elif not is_label_value(value):
            causes.append(("metadata.labels", f'Invalid value: "{value}": a valid label must be an empty string '
                                              "or consist of alphanumeric characters, '-', '_' or '.', and must "
                                              "start and end with an alphanumeric character"))
    return causes


def _owner_reference_errors(refs) -> list[tuple[str, str]]:
    """``metadata.ownerReferences`` problems, as ``ValidateOwnerReferences`` (k8s.io/apimachinery)
    words them: every field set, at most one ``controller: true``."""
    if refs is None:
        return []
    where = "metadata.ownerReferences"
    if not isinstance(refs, list) or not all(isinstance(r, dict) for r in refs):
        return [(where, "Invalid value: must be a list of objects")]
    causes: list[tuple[str, str]] = []
    controller = ""
    for ref in refs:
        api_version = str(ref.get("apiVersion") or "")
        if not api_version.rpartition("/")[2]:
            causes.append((f"{where}.apiVersion", f'Invalid value: "{api_version}": version must not be empty'))
        for key in ("kind", "name", "uid"):
            if not ref.get(key):
                causes.append((f"{where}.{key}", f'Invalid value: "{ref.get(key) or ""}": must not be empty'))
        if ref.get("controller") is True:
            name = f"{ref.get('kind')}/{ref.get('name')}"
            if controller:
                causes.append((where, f"Invalid value: {json.dumps(refs)}: Only one reference can have Controller "
                                      f'set to true. Found "true" in references for {controller} and {name}'))
            else:
                controller = name
    return causes


#: ``Scale.spec.replicas`` of an object without a value at its specReplicasPath (upstream's
#: "smallest int32" marker: a write that leaves it is refused).
_NO_REPLICAS = -2**31


def _scale_paths(rt: ResourceType):
    if rt.scale is None:
        raise ApiError(404, "NotFound", "the server could not find the requested resource")
    return rt.scale


def _get_path(obj: dict, path: str):
    node = obj
    for key in path.lstrip(".").split("."):
        if not isinstance(node, dict) or key not in node:
            return None
        node = node[key]
    return node


def _set_path(obj: dict, path: str, value) -> None:
    keys = path.lstrip(".").split(".")
    node = obj
    for key in keys[:-1]:
        if not isinstance(node.get(key), dict):
            node[key] = {}
        node = node[key]
    node[keys[-1]] = value


def _scale(rt: ResourceType, paths, obj: dict) -> tuple[dict, bool]:
    """The ``autoscaling/v1`` ``Scale`` of ``obj`` and whether it has a value at specReplicasPath
    (apiextensions-apiserver's ``scaleFromCustomResource``: missing numbers read as 0; Go's
    ``omitempty`` drops a zero ``spec.replicas`` and an empty ``status.selector``)."""
    meta = obj.get("metadata") or {}
    spec_replicas = _get_path(obj, paths.spec_replicas_path)
    found = isinstance(spec_replicas, int) and not isinstance(spec_replicas, bool)
    status_replicas = _get_path(obj, paths.status_replicas_path)
    selector = _get_path(obj, paths.label_selector_path) if paths.label_selector_path else None
    out_meta = {k: meta[k] for k in ("name", "namespace", "uid", "resourceVersion", "creationTimestamp") if k in meta}
    spec = {"replicas": spec_replicas} if found and spec_replicas else {}
    status: dict = {"replicas": status_replicas if isinstance(status_replicas, int)
                    and not isinstance(status_replicas, bool) else 0}
    if isinstance(selector, str) and selector:
        status["selector"] = selector
    return {"kind": "Scale", "apiVersion": "autoscaling/v1", "metadata": out_meta, "spec": spec,
            "status": status}, found


#: The garbage collector's finalizers (metav1.FinalizerOrphanDependents / FinalizerDeleteDependents).
ORPHAN_FINALIZER = "orphan"
FOREGROUND_FINALIZER = "foregroundDeletion"
_POLICIES = {"Orphan": ORPHAN_FINALIZER, "Foreground": FOREGROUND_FINALIZER, "Background": ""}


def _deletion_policy(options: dict) -> str | None:
    """The garbage-collection finalizer a delete asks for: ``orphan``, ``foregroundDeletion``,
    ``""`` (Background: neither) or ``None`` (no policy given: keep the object's own).

    Raises:
        ApiError: 422 for an unknown policy, or both ``propagationPolicy`` and ``orphanDependents``
            (``ValidateDeleteOptions``).
    """
    policy, orphan = options.get("propagationPolicy"), options.get("orphanDependents")
    if isinstance(orphan, str):
        orphan = orphan.lower() in ("1", "t", "true")
    causes = []
    if policy is not None and orphan is not None:
        causes.append({"reason": "FieldValueInvalid", "field": "propagationPolicy",
                       "message": f'Invalid value: "{policy}": orphanDependents and deletionPropagation cannot '
                                  "be both set"})
    if policy is not None and policy not in _POLICIES:
        causes.append({"reason": "FieldValueNotSupported", "field": "propagationPolicy",
                       "message": f'Unsupported value: "{policy}": supported values: "Foreground", "Background", '
                                  '"Orphan", "nil"'})
    if causes:
        raise ApiError.invalid("meta.k8s.io", "DeleteOptions", "", causes)
    if orphan is not None:
        return ORPHAN_FINALIZER if orphan else ""
    return None if policy is None else _POLICIES[policy]


def _deletion_finalizers(current: list[str], wanted: str | None) -> list[str]:
    """The finalizers an object has after a delete asking for ``wanted`` (see :func:`_deletion_policy`)."""
    if wanted is None:  # no policy: an orphan / foregroundDeletion finalizer already there decides
        return current
    out = [f for f in current if f not in (ORPHAN_FINALIZER, FOREGROUND_FINALIZER)]
    return out + [wanted] if wanted else out


def _continue_token(rv: int, start_after: tuple[str, str]) -> str:
    """An opaque ``continue`` token: the snapshot's resourceVersion (-1: the current state) and
    the key after which the next page starts."""
    return base64.urlsafe_b64encode(dumps({"v": "meta.k8s.io/v1", "rv": rv, "start": list(start_after)})).decode()


def _spec_part(obj: dict) -> dict:
    return {k: v for k, v in obj.items() if k not in ("metadata", "status", "kind", "apiVersion")}


class Subscription:
    """One watcher's position in the event history.

    Use :meth:`next` to get the events after the position (blocking up to a timeout);
    ``rv`` is the last resourceVersion examined (what a BOOKMARK may report).
    """

    def __init__(self, store: Store, rt: ResourceType | None, namespace: str | None,
                 labels, fields, start_rv: int) -> None:
        self.store, self.rt, self.namespace = store, rt, namespace
        self.labels, self.fields = labels, fields
        self.rv = start_rv
        self.pending: list[Event] = []

    def _matches(self, obj: dict | None) -> bool:
        if obj is None:
            return False
        return (not self.labels or self.labels(obj)) and (not self.fields or self.fields(obj))

    def filter(self, ev: Event) -> Event | None:
        """Return the event as this watcher sees it (type adjusted for selectors) or ``None``."""
        if self.rt is not None and ev.rtype is not self.rt:
            return None
        if self.namespace is not None and ev.namespace != self.namespace:
            return None
        if not self.labels and not self.fields:
            return ev
        now, before = self._matches(ev.obj), self._matches(ev.old)
        if ev.type == DELETED:
            return ev if now or before else None
        if ev.type == ADDED:
            return ev if now else None
        if now and before:
            return ev
        if now:
            return Event(ev.rv, ev.rtype, ev.namespace, ev.name, ADDED, ev.obj, ev.raw, ev.old)
        if before:
            return Event(ev.rv, ev.rtype, ev.namespace, ev.name, DELETED, ev.obj, ev.raw, ev.old)
        return None

    def next(self, timeout: float | None) -> list[Event]:
        """Return the next events (possibly none after ``timeout`` seconds).

        Raises:
            ApiError: 410 Expired when history this watcher had not read yet was compacted.
            Closed: the store was closed.
        """
        if self.pending:
            out, self.pending = self.pending, []
            return out
        store = self.store
        with store.cond:
            if not store._closed and store._rv <= self.rv and self.rv >= store._compacted:
                store.cond.wait(timeout)
            if store._closed:
                raise Closed()
            if self.rv < store._compacted:
                raise ApiError.gone(f"too old resource version: {self.rv} ({store._compacted + 1})")
            if store._rv <= self.rv:
                return []
            batch = store._history[self.rv - store._compacted:]
            self.rv = store._rv
        out = []
        for ev in batch:
            seen = self.filter(ev)
            if seen is not None:
                out.append(seen)
        return out


# -- built-in type behaviour ---------------------------------------------------------------
def _prepare_create_builtin(rt: ResourceType, obj: dict) -> None:
    if rt is R.PODS:
        _default_pod_spec(obj)
        obj["status"] = {"phase": "Pending", "qosClass": "BestEffort"}
    elif rt is R.NAMESPACES:
        obj["status"] = {"phase": "Active"}
        obj.setdefault("spec", {"finalizers": ["kubernetes"]})
    elif rt is R.SECRETS:
        _fold_string_data(obj)
        obj.setdefault("type", "Opaque")


def _default_pod_spec(obj: dict) -> None:
    """Apply the Pod defaults upstream sets on every decode (pkg/apis/core/v1/defaults.go)."""
    spec = obj.get("spec")
    if not isinstance(spec, dict):
        spec = obj["spec"] = {}
    spec.setdefault("restartPolicy", "Always")
    spec.setdefault("dnsPolicy", "ClusterFirst")
    spec.setdefault("schedulerName", "default-scheduler")
    spec.setdefault("terminationGracePeriodSeconds", 30)
    for c in spec.get("containers") or []:
        if isinstance(c, dict) and isinstance(c.get("image"), str):
            tag = c["image"].rsplit("/", 1)[-1]
            c.setdefault("imagePullPolicy", "Always" if ":" not in tag or tag.endswith(":latest")
                         else "IfNotPresent")
            for port in c.get("ports") or []:
                if isinstance(port, dict):
                    port.setdefault("protocol", "TCP")


def _prepare_update_builtin(store: Store, rt: ResourceType, obj: dict, old: dict) -> None:
    if rt is R.SECRETS:
        _fold_string_data(obj)
    elif rt is R.PODS:
        _default_pod_spec(obj)
        def mutable_removed(spec):
            spec = json.loads(json.dumps(spec or {}))
            for c in spec.get("containers") or []:
                if isinstance(c, dict):
                    c.pop("image", None)
            spec.pop("activeDeadlineSeconds", None)
            spec.pop("tolerations", None)
            return spec
        if mutable_removed(obj.get("spec")) != mutable_removed(old.get("spec")):
            raise store._invalid(rt, obj["metadata"]["name"], [(
                "spec", "Forbidden: pod updates may not change fields other than `spec.containers[*].image`, "
                "`spec.activeDeadlineSeconds` or `spec.tolerations` (only additions to existing tolerations)")])


def _fold_string_data(obj: dict) -> None:
    string_data = obj.pop("stringData", None)
    if string_data:
        data = dict(obj.get("data") or {})
        for k, v in string_data.items():
            data[k] = base64.b64encode(str(v).encode()).decode()
        obj["data"] = data


def _validate_builtin(store: Store, rt: ResourceType, obj: dict, old: dict | None) -> None:
    name = obj["metadata"].get("name", "")
    causes: list[tuple[str, str]] = []
    if rt is R.PODS:
        containers = (obj.get("spec") or {}).get("containers")
        if not isinstance(containers, list) or not containers:
            causes.append(("spec.containers", "Required value"))
        else:
            for i, c in enumerate(containers):
                if not isinstance(c, dict):
                    causes.append((f"spec.containers[{i}]", "Invalid value: must be an object"))
                    continue
                if not c.get("name") or not _DNS_LABEL.match(str(c["name"])):
                    causes.append((f"spec.containers[{i}].name", "Required value" if not c.get("name")
                                   else f'Invalid value: "{c["name"]}": must be a DNS label'))
                if not c.get("image"):
                    causes.append((f"spec.containers[{i}].image", "Required value"))
                for j, port in enumerate(c.get("ports") or []):
                    cp = port.get("containerPort") if isinstance(port, dict) else None
                    if not isinstance(cp, int) or not 1 <= cp <= 65535:
                        causes.append((f"spec.containers[{i}].ports[{j}].containerPort",
                                       f"Invalid value: {cp!r}: must be between 1 and 65535, inclusive"))
                for j, env in enumerate(c.get("env") or []):
                    if not isinstance(env, dict) or not env.get("name"):
                        causes.append((f"spec.containers[{i}].env[{j}].name", "Required value"))
    elif rt is R.EVENTS and old is None:
        for key in ("eventTime", "reportingController", "reportingInstance", "action", "reason"):
            if not obj.get(key):
                causes.append((key, "Required value"))
        if obj.get("type") not in ("Normal", "Warning"):
            causes.append(("type", f'Unsupported value: "{obj.get("type")}": supported values: "Normal", "Warning"'))
        if len(obj.get("note") or "") > 1024:
            causes.append(("note", "Too long: may not be longer than 1024"))
    elif rt is R.CORE_EVENTS:
        inv_ns = (obj.get("involvedObject") or {}).get("namespace")
        if inv_ns and inv_ns != obj["metadata"].get("namespace"):
            causes.append(("involvedObject.namespace", f'Invalid value: "{inv_ns}": does not match event.namespace'))
    elif rt is R.LEASES:
        dur = (obj.get("spec") or {}).get("leaseDurationSeconds")
        if dur is not None and (not isinstance(dur, int) or dur <= 0):
            causes.append(("spec.leaseDurationSeconds", f"Invalid value: {dur!r}: must be greater than 0"))
    if causes:
        raise store._invalid(rt, name, causes)
