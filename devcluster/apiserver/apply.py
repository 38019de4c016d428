"""Server-side apply and ``metadata.managedFields``: the subset the fake implements.

kube-apiserver records, per field manager and operation, the fields each one set
(``managedFields``, ``fieldsType: FieldsV1``) and uses them for ``PATCH`` with
``application/apply-patch+yaml`` (Kubernetes docs, "Server-Side Apply":
https://kubernetes.io/docs/reference/using-api/server-side-apply/).  Here:

* fields are leaf paths; maps are walked into, lists are atomic (one field), as for
  ``x-kubernetes-list-type: atomic``; of ``metadata`` only ``labels``, ``annotations``,
  ``finalizers`` and ``ownerReferences`` are fields (name, namespace and system fields are not);
* an **apply** by manager M sets every field of its configuration; a field that another
  manager (any other manager/operation pair, in the same subresource) owns and whose value
  would change is a **conflict**: 409 ``Conflict`` with one ``FieldManagerConflict`` cause per
  field, worded like the server (``Apply failed with 2 conflicts: conflict with "other" using
  crawl.example.com/v1alpha1: .spec.maxLeases``), unless ``force=true``, which moves the fields
  to M.  Equal values are shared.  Fields M applied before and no longer applies are removed
  from the object unless another manager owns them too;
* an **update** (POST, PUT, merge/JSON patch) of an object that has ``managedFields`` gives the
  fields it changed to its manager (``fieldManager``, else the User-Agent's product name) with
  ``operation: Update`` and takes them from the others.  Objects never applied carry no
  ``managedFields`` (the fake's other tests compare objects exactly).
"""

from __future__ import annotations

import copy
from typing import Iterable

from devcluster.apiserver.errors import ApiError

Path = tuple[str, ...]
_META_FIELDS = ("labels", "annotations", "finalizers", "ownerReferences")
_MISSING = object()


def field_paths(obj: dict, subresource: str | None = None) -> set[Path]:
    """The fields (leaf paths) of an object or apply configuration, in one subresource's scope.

    ``subresource`` ``None`` is the main resource (everything but ``status``); ``"status"``
    is only ``status``.
    """
    out: set[Path] = set()
    for key, value in (obj or {}).items():
        if key in ("apiVersion", "kind"):
            continue
        if (key == "status") != (subresource == "status"):
            continue
        if key == "metadata":
            for mk in _META_FIELDS:
                if isinstance(value, dict) and mk in value and value[mk] is not None:
                    _walk(value[mk], ("metadata", mk), out)
            continue
        _walk(value, (key,), out)
    return out


def _walk(value, path: Path, out: set[Path]) -> None:
    if isinstance(value, dict) and value:
        for k, v in value.items():
            _walk(v, path + (k,), out)
    else:
        out.add(path)


def get_path(obj, path: Path):
    """The value at ``path`` or a sentinel when absent."""
    for key in path:
        if not isinstance(obj, dict) or key not in obj:
            return _MISSING
        obj = obj[key]
    return obj


def _set_path(obj: dict, path: Path, value) -> None:
    for key in path[:-1]:
        if not isinstance(obj.get(key), dict):
            obj[key] = {}
        obj = obj[key]
    obj[path[-1]] = copy.deepcopy(value)


def _del_path(obj: dict, path: Path) -> None:
    parents = []
    for key in path[:-1]:
        if not isinstance(obj, dict) or key not in obj:
            return
        parents.append((obj, key))
        obj = obj[key]
    if isinstance(obj, dict):
        obj.pop(path[-1], None)
    for parent, key in reversed(parents):  # drop maps left empty by the removal
        if parent[key] == {}:
            del parent[key]


def to_fields_v1(paths: Iterable[Path]) -> dict:
    """``{"f:spec": {"f:provider": {}}}`` for a set of paths."""
    root: dict = {}
    for path in sorted(paths):
        node = root
        for key in path:
            node = node.setdefault(f"f:{key}", {})
    return root


def from_fields_v1(doc: dict, prefix: Path = ()) -> set[Path]:
    """The paths of a ``fieldsV1`` document (its leaves)."""
    out: set[Path] = set()
    for key, child in (doc or {}).items():
        if not key.startswith("f:"):
            continue
        path = prefix + (key[2:],)
        if child and any(k.startswith("f:") for k in child):
            out |= from_fields_v1(child, path)
        else:
            out.add(path)
    return out


def _differs(current, applied) -> bool:
    """Whether applying ``applied`` changes ``current`` (an empty map changes no existing map)."""
    if applied == {} and isinstance(current, dict):
        return False
    return current != applied


def _overlaps(a: Path, b: Path) -> bool:
    n = min(len(a), len(b))
    return a[:n] == b[:n]


def _entries(obj: dict) -> list[dict]:
    return [dict(e) for e in (obj.get("metadata", {}).get("managedFields") or []) if isinstance(e, dict)]


def _scope(entry: dict) -> str | None:
    return entry.get("subresource") or None


def _entry(manager: str, operation: str, api_version: str, paths: set[Path], now: str,
           subresource: str | None) -> dict:
    e = {"manager": manager, "operation": operation, "apiVersion": api_version, "time": now,
         "fieldsType": "FieldsV1", "fieldsV1": to_fields_v1(paths)}
    if subresource:
        e["subresource"] = subresource
    return e


def _rebuild(owned: list[tuple[dict, set[Path]]], old: list[dict], now: str) -> list[dict]:
    """Entries from (entry, paths): empty ones dropped, time kept where nothing changed."""
    before = {(e.get("manager"), e.get("operation"), _scope(e)): from_fields_v1(e.get("fieldsV1") or {})
              for e in old}
    out = []
    for entry, paths in owned:
        if not paths:
            continue
        key = (entry.get("manager"), entry.get("operation"), _scope(entry))
        entry = {**entry, "fieldsV1": to_fields_v1(paths)}
        if before.get(key) != paths or not entry.get("time"):
            entry["time"] = now
        out.append(entry)
    return out


def apply(current: dict | None, config: dict, *, manager: str, force: bool, subresource: str | None,
          api_version: str, plural: str, group: str, name: str, now: str) -> dict:
    """Return the object after a server-side apply of ``config`` by ``manager``.

    Args:
        current: the stored object (``None``: the apply creates it).
        config: the apply configuration (decoded YAML/JSON).
        force: take fields owned by other managers instead of failing.
        subresource: ``None`` or ``"status"``.
    Raises:
        ApiError: 409 Conflict with ``FieldManagerConflict`` causes.
    """
    base = copy.deepcopy(current) if current is not None else {
        k: copy.deepcopy(v) for k, v in config.items() if k in ("apiVersion", "kind", "metadata")}
    if current is not None and isinstance(config.get("metadata"), dict):
        for key in ("name", "namespace"):
            config["metadata"].pop(key, None)
    entries = _entries(base)
    want = field_paths(config, subresource)
    mine_key = (manager, "Apply", subresource)
    owned: list[tuple[dict, set[Path]]] = []
    previous: set[Path] = set()
    for e in entries:
        paths = from_fields_v1(e.get("fieldsV1") or {})
        if (e.get("manager"), e.get("operation"), _scope(e)) == mine_key:
            previous = paths
            continue
        owned.append((e, paths))
    conflicts: list[tuple[str, Path]] = []
    taken: dict[int, set[Path]] = {}
    for index, (entry, paths) in enumerate(owned):
        if _scope(entry) != subresource:
            continue
        for p in sorted(paths):
            hits = [w for w in want if _overlaps(p, w)]
            if not hits:
                continue
            changed = any(_differs(get_path(base, w), get_path(config, w)) for w in hits) or \
                (len(p) > max(len(w) for w in hits) and get_path(base, p) is not _MISSING
                 and get_path(config, p) is _MISSING)
            if changed:
                conflicts.append((entry.get("manager", ""), p))
                taken.setdefault(index, set()).add(p)
    if conflicts and not force:
        causes = [{"reason": "FieldManagerConflict", "message": f'conflict with "{m}" using {api_version}',
                   "field": "." + ".".join(p)} for m, p in conflicts]
        count = len(conflicts)
        if count == 1:
            head = "Apply failed with 1 conflict"
        else:
            head = f"Apply failed with {count} conflicts"
        message = head + ": " + "\n".join(f'{c["message"]}: {c["field"]}' for c in causes)
        raise ApiError(409, "Conflict", message, {"name": name, "group": group, "kind": plural, "causes": causes})
    if force:  # the conflicting fields move to the applier; equal values stay shared
        owned = [(e, paths - taken.get(i, set())) for i, (e, paths) in enumerate(owned)]
    others = set().union(*(paths for e, paths in owned if _scope(e) == subresource)) if owned else set()
    result = base
    for p in previous - want:
        if not any(_overlaps(p, o) for o in others):
            _del_path(result, p)
    for p in sorted(want, key=len):
        value = get_path(config, p)
        if value == {} and isinstance(get_path(result, p), dict):
            continue  # an empty map owns the map; it does not clear it
        _set_path(result, p, value)
    owned.append((_entry(manager, "Apply", api_version, set(), now, subresource), want))
    result.setdefault("metadata", {})["managedFields"] = _rebuild(owned, entries, now)
    return result


def record_update(old: dict | None, new: dict, *, manager: str, subresource: str | None, api_version: str,
                  now: str) -> None:
    """Give the fields an update changed to ``manager`` (``operation: Update``), in place on ``new``.

    Only objects that already have ``managedFields`` (or a create by an apply) are tracked.
    """
    entries = _entries(old or {})
    if not entries:
        new.get("metadata", {}).pop("managedFields", None)
        return
    before, after = field_paths(old or {}, subresource), field_paths(new, subresource)
    changed = {p for p in before | after if get_path(old or {}, p) != get_path(new, p)}
    owned: list[tuple[dict, set[Path]]] = []
    mine = None
    for e in entries:
        paths = from_fields_v1(e.get("fieldsV1") or {})
        if _scope(e) == subresource:  # what the update changed or removed is no longer theirs
            paths = {p for p in paths if p in after and not any(_overlaps(p, c) for c in changed)}
        if (e.get("manager"), e.get("operation"), _scope(e)) == (manager, "Update", subresource):
            mine = (e, paths)
            continue
        owned.append((e, paths))
    gained = {p for p in changed if p in after}
    if mine is None:
        mine = (_entry(manager, "Update", api_version, set(), now, subresource), set())
    owned.append((mine[0], mine[1] | gained))
    new.setdefault("metadata", {})["managedFields"] = _rebuild(owned, entries, now)
