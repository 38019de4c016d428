"""PATCH bodies: JSON merge patch (RFC 7386) and JSON patch (RFC 6902, via ``jsonpatch``).

Strategic merge patch is accepted for built-in types and applied as a merge patch (lists are
replaced rather than merged by key); the API server rejects it for custom resources with 415,
and so does the fake.
"""

from __future__ import annotations

import jsonpatch

from tests.kubefake.errors import ApiError

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
        return merge_patch(target, patch)
    if ctype == JSON_PATCH:
        if not isinstance(patch, list):
            raise ApiError.bad_request("a JSON patch must be a JSON array of operations")
        try:
            return jsonpatch.apply_patch(target, patch)
        except jsonpatch.JsonPatchTestFailed as exc:
            raise ApiError(422, "Invalid", f"the server rejected our request due to an error in our request: {exc}")
        except (jsonpatch.JsonPatchException, jsonpatch.JsonPointerException) as exc:
            raise ApiError(422, "Invalid", f"the server rejected our request due to an error in our request: {exc}")
    raise ApiError.unsupported_media_type(ctype)
