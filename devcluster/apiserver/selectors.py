"""Label and field selectors, parsed and matched like the Kubernetes API server.

Label selectors (``k8s.io/apimachinery/pkg/labels``) are parsed and matched by the product's own
:mod:`app.serving.selectors` (the same grammar, without the discovery API's caps): ``!=`` and
``notin`` also match objects that do not carry the key at all (as upstream does).

Field selectors (``k8s.io/apimachinery/pkg/fields``): ``path=value``, ``path==value``,
``path!=value``; only the paths a resource declares are accepted (upstream answers
400 "field label not supported" for the rest).
"""

from __future__ import annotations

import re
from typing import Callable

from app.serving import selectors as labels
from app.serving.selectors import Requirement
from devcluster.apiserver.errors import ApiError


def parse_label_selector(selector: str | None) -> list[Requirement]:
    """Parse a label selector string as the API server does (no discovery-API caps).

    Returns:
        The requirements (all must hold); empty for ``None``/``""`` (matches everything).
    Raises:
        ApiError: 400 BadRequest naming the bad part, as the API server does.
    """
    try:
        return list(labels.parse(selector, capped=False))
    except labels.SelectorError as exc:
        raise ApiError.bad_request(f"unable to parse requirement: {exc} (selector {selector!r})") from None


def label_matcher(selector: str | None) -> Callable[[dict], bool] | None:
    """Return ``match(obj) -> bool`` for a label selector, or ``None`` when it selects everything."""
    reqs = parse_label_selector(selector)
    if not reqs:
        return None

    def match(obj: dict) -> bool:
        return labels.matches(reqs, (obj.get("metadata") or {}).get("labels") or {})

    return match


def _get_path(obj: dict, path: str) -> str:
    cur = obj
    for part in path.split("."):
        if not isinstance(cur, dict):
            return ""
        cur = cur.get(part)
        if cur is None:
            return ""
    return cur if isinstance(cur, str) else str(cur)


def field_matcher(selector: str | None, supported: frozenset[str]) -> Callable[[dict], bool] | None:
    """Return ``match(obj) -> bool`` for a field selector, or ``None`` when it selects everything.

    Args:
        selector: e.g. ``"metadata.name=foo,status.phase!=Running"``.
        supported: the field paths the resource accepts.
    Raises:
        ApiError: 400 for a malformed selector or an unsupported field.
    """
    if not selector or not selector.strip():
        return None
    terms: list[tuple[str, bool, str]] = []
    for raw in selector.split(","):
        part = raw.strip()
        m = re.match(r"^([^=!\s]+)\s*(==|=|!=)\s*(.*)$", part)
        if not m:
            raise ApiError.bad_request(f"invalid field selector: {part!r}")
        path, op, value = m.group(1), m.group(2), m.group(3).strip()
        if path not in supported:
            raise ApiError.bad_request(f'field label not supported: {path}')
        terms.append((path, op != "!=", value))

    def match(obj: dict) -> bool:
        return all((_get_path(obj, p) == v) == eq for p, eq, v in terms)

    return match
