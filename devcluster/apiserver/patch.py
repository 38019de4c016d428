"""PATCH bodies: JSON merge patch (RFC 7386) and JSON patch (RFC 6902, via ``jsonpatch``).

Strategic merge patch is accepted for built-in types, with the list merge keys of the fields
the operator touches (containers, env, ports, conditions, ...; see :data:`MERGE_KEYS`); the
API server rejects it for custom resources with 415, and so does the fake.
"""

from __future__ import annotations

import jsonpatch

from devcluster.apiserver.errors import ApiError

MERGE = "application/merge-patch+json"
STRATEGIC = "application/strategic-merge-patch+json"
JSON_PATCH = "application/json-patch+json"
APPLY = "application/apply-patch+yaml"


def merge_patch(target, patch):
    """Return ``target`` with the RFC 7386 merge ``patch`` applied (inputs are not modified)."""
    if not isinstance(patch, dict):
        return patch
    out = dict(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            out.pop(key, None)
        else:
            out[key] = merge_patch(out.get(key), value)
    return out


#: patchMergeKey of the list fields a strategic merge patch merges (k8s.io/api struct tags);
#: other lists are replaced.
MERGE_KEYS = {"containers": "name", "initContainers": "name", "ephemeralContainers": "name", "env": "name",
              "ports": "containerPort", "volumes": "name", "volumeMounts": "mountPath",
              "volumeDevices": "devicePath", "conditions": "type", "imagePullSecrets": "name",
              "hostAliases": "ip", "ownerReferences": "uid", "topologySpreadConstraints": "topologyKey"}
#: primitive lists with ``patchStrategy: merge`` (union).
SET_LISTS = {"finalizers"}


def strategic_merge_patch(target, patch):
    """Return ``target`` with a strategic merge ``patch`` applied (a subset of upstream's rules).

    Maps merge like a JSON merge patch; lists named in :data:`MERGE_KEYS` merge item by item
    on their key (an item with ``"$patch": "delete"`` removes the match); lists in
    :data:`SET_LISTS` are unioned; other lists are replaced.  ``"$patch": "replace"`` in a map
    replaces it whole.
    """
    if not isinstance(patch, dict):
        return patch
    if patch.get("$patch") == "replace":
        return {k: v for k, v in patch.items() if k != "$patch"}
    if patch.get("$patch") == "delete":
        return None
    out = dict(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if key.startswith("$"):
            continue
        if value is None:
            out.pop(key, None)
        elif isinstance(value, list) and key in MERGE_KEYS and isinstance(out.get(key), list):
            out[key] = _merge_list(out[key], value, MERGE_KEYS[key])
        elif isinstance(value, list) and key in SET_LISTS and isinstance(out.get(key), list):
            out[key] = out[key] + [v for v in value if v not in out[key]]
        else:
            merged = strategic_merge_patch(out.get(key), value)
            if merged is None:
                out.pop(key, None)
            else:
                out[key] = merged
    return out


def _merge_list(current: list, patch: list, key: str) -> list:
    out = [dict(item) if isinstance(item, dict) else item for item in current]
    for item in patch:
        if not isinstance(item, dict) or key not in item:
            raise ApiError.bad_request(f"strategic merge patch: list item without merge key {key!r}")
        idx = next((i for i, cur in enumerate(out) if isinstance(cur, dict) and cur.get(key) == item[key]), None)
        if item.get("$patch") == "delete":
            if idx is not None:
                out.pop(idx)
        elif idx is None:
            out.append({k: v for k, v in item.items() if k != "$patch"})
        else:
            out[idx] = strategic_merge_patch(out[idx], item)
    return out


def apply_patch(content_type: str, target: dict, patch, *, builtin: bool) -> dict:
    """Apply a PATCH body of ``content_type`` to ``target`` and return the new object.

    Args:
        content_type: the request's Content-Type (parameters ignored).
        target: the current object (not modified).
        patch: the decoded body.
        builtin: whether the resource is a built-in type (strategic merge allowed).
    Raises:
        ApiError: 415 for an unsupported patch type, 422/400 for a patch that does not apply.
    """
    ctype = (content_type or "").split(";")[0].strip().lower()
    if ctype == MERGE or (ctype == STRATEGIC and builtin):
        if not isinstance(patch, dict):
            raise ApiError.bad_request("a merge patch must be a JSON object")
        return merge_patch(target, patch) if ctype == MERGE else strategic_merge_patch(target, patch)
    if ctype == JSON_PATCH:
        if not isinstance(patch, list):
            raise ApiError.bad_request("a JSON patch must be a JSON array of operations")
        try:
            return jsonpatch.apply_patch(target, patch)
        except (jsonpatch.JsonPatchException, jsonpatch.JsonPointerException) as exc:  # incl. a failed "test"
            raise ApiError(422, "Invalid",
                           f"the server rejected our request due to an error in our request: {exc}") from None
    raise ApiError.unsupported_media_type(ctype)
