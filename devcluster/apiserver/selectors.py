"""Label and field selectors, parsed and matched like the Kubernetes API server.

Label selector grammar (``k8s.io/apimachinery/pkg/labels``): comma-separated requirements,
each one of ``key``, ``!key``, ``key=value``, ``key==value``, ``key!=value``,
``key in (v1,v2)``, ``key notin (v1,v2)``.  ``!=`` and ``notin`` also match objects that do
not carry the key at all (as upstream does).

Field selectors (``k8s.io/apimachinery/pkg/fields``): ``path=value``, ``path==value``,
``path!=value``; only the paths a resource declares are accepted (upstream answers
400 "field label not supported" for the rest).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Callable

from devcluster.apiserver.errors import ApiError

_KEY = re.compile(r"^([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?"
                  r"[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$")
_VALUE = re.compile(r"^([A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?)?$")


@dataclass(frozen=True)
class Requirement:
    """One label requirement: ``op`` is one of ``exists``, ``!``, ``=``, ``!=``, ``in``, ``notin``."""

    key: str
    op: str
    values: frozenset[str] = frozenset()

    def matches(self, labels: dict) -> bool:
        """Whether a label map satisfies this requirement."""
        has = self.key in labels
        if self.op == "exists":
            return has
        if self.op == "!":
            return not has
        if self.op in ("=", "in"):
            return has and labels[self.key] in self.values
        # "!=" and "notin" match a missing key too (upstream semantics)
        return not has or labels[self.key] not in self.values


def _split_top(text: str) -> list[str]:
    """Split on commas that are not inside parentheses."""
    parts, depth, cur = [], 0, []
    for ch in text:
        if ch == "(":
            depth += 1
        elif ch == ")":
            depth -= 1
        if ch == "," and depth == 0:
            parts.append("".join(cur))
            cur = []
        else:
            cur.append(ch)
    parts.append("".join(cur))
    return parts


def _bad(selector: str, why: str) -> ApiError:
    return ApiError.bad_request(f"unable to parse requirement: {why} (selector {selector!r})")


def _check_key(selector: str, key: str) -> str:
    if not _KEY.match(key) or len(key.rsplit("/", 1)[-1]) > 63:
        raise _bad(selector, f"invalid label key {key!r}")
    return key


def _check_value(selector: str, value: str) -> str:
    if not _VALUE.match(value) or len(value) > 63:
        raise _bad(selector, f"invalid label value {value!r}")
    return value


def parse_label_selector(selector: str | None) -> list[Requirement]:
    """Parse a label selector string.

    Returns:
        The requirements (all must hold); empty for ``None``/``""`` (matches everything).
    Raises:
        ApiError: 400 BadRequest naming the bad part, as the API server does.
    """
    if not selector or not selector.strip():
        return []
    reqs: list[Requirement] = []
    for raw in _split_top(selector):
        part = raw.strip()
        if not part:
            raise _bad(selector, "empty requirement")
        m = re.match(r"^(\S+)\s+(in|notin)\s*\((.*)\)$", part)
        if m:
            key = _check_key(selector, m.group(1))
            values = [v.strip() for v in m.group(3).split(",")]
            reqs.append(Requirement(key, m.group(2), frozenset(_check_value(selector, v) for v in values)))
            continue
        m = re.match(r"^([^=!\s]+)\s*(==|=|!=)\s*(\S*)$", part)
        if m:
            key = _check_key(selector, m.group(1))
            op = "=" if m.group(2) in ("=", "==") else "!="
            reqs.append(Requirement(key, op, frozenset([_check_value(selector, m.group(3))])))
            continue
        if part.startswith("!"):
            reqs.append(Requirement(_check_key(selector, part[1:].strip()), "!"))
            continue
        if re.match(r"^\S+$", part):
            reqs.append(Requirement(_check_key(selector, part), "exists"))
            continue
        raise _bad(selector, f"cannot parse {part!r}")
    return reqs


def label_matcher(selector: str | None) -> Callable[[dict], bool] | None:
    """Return ``match(obj) -> bool`` for a label selector, or ``None`` when it selects everything."""
    reqs = parse_label_selector(selector)
    if not reqs:
        return None

    def match(obj: dict) -> bool:
        labels = (obj.get("metadata") or {}).get("labels") or {}
        return all(r.matches(labels) for r in reqs)

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
