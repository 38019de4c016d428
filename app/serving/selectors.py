"""Kubernetes label selectors for the discovery API (``selector=k=v,k2!=v2,k3 in (a,b)``).

Syntax and meaning follow the Kubernetes "Labels and Selectors" concept page (equality- and
set-based requirements, comma = AND):

* ``k=v`` / ``k==v`` — label ``k`` present with value ``v``;
* ``k!=v`` — label ``k`` absent or with another value;
* ``k in (a,b)`` — present with one of the values; ``k notin (a,b)`` — absent or none of them;
* ``k`` — present; ``!k`` — absent.

:func:`parse` returns :class:`Requirement` s; :func:`matches` evaluates them in Python, and
:func:`as_lua` encodes them for the lease script, which applies the same rules in Redis.

A selector is evaluated against every proxy a request reads (in Redis, inside the lease
script, for ``POST /v1/leases``), so its size is capped (docs/security.md, "Redis's CPU"): at most
:data:`MAX_LENGTH` characters, :data:`MAX_REQUIREMENTS` requirements, :data:`MAX_VALUES`
values in one ``in``/``notin`` list; keys are Kubernetes label keys (an optional DNS-subdomain
prefix of at most :data:`MAX_PREFIX_LENGTH` characters, ``/``, a name of at most
:data:`MAX_NAME_LENGTH`), values Kubernetes label values (at most :data:`MAX_VALUE_LENGTH`).
The simulated API server (``devcluster/``) parses and matches with the same code, without the caps.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Mapping, Sequence

_KEY = re.compile(r"^([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?"
                  r"[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$")
_VALUE = re.compile(r"^([A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?)?$")
_SET = re.compile(r"^\s*(?P<key>[^\s!=()]+)\s+(?P<op>in|notin)\s*\((?P<values>[^()]*)\)\s*$")
_EQ = re.compile(r"^\s*(?P<key>[^\s!=()]+)\s*(?P<op>==|=|!=)\s*(?P<value>[^\s!=(),]*)\s*$")
_EXISTS = re.compile(r"^\s*(?P<neg>!?)\s*(?P<key>[^\s!=(),]+)\s*$")

EQ, NE, IN, NOTIN, EXISTS, NOT_EXISTS = "=", "!=", "in", "notin", "exists", "!exists"

#: Longest selector string, characters.
MAX_LENGTH = 4096
#: Most requirements (comma-separated parts) in one selector.
MAX_REQUIREMENTS = 16
#: Most values in one ``in`` / ``notin`` list.
MAX_VALUES = 32
#: Longest key prefix (the DNS subdomain before ``/``), name part and value (Kubernetes' limits).
MAX_PREFIX_LENGTH, MAX_NAME_LENGTH, MAX_VALUE_LENGTH = 253, 63, 63


class SelectorError(ValueError):
    """A label selector that does not parse; the message says which part and why."""


@dataclass(frozen=True)
class Requirement:
    """One requirement: ``key``, ``op`` (one of ``= != in notin exists !exists``), ``values``."""

    key: str
    op: str
    values: tuple[str, ...] = ()

    def matches(self, labels: Mapping[str, str]) -> bool:
        """Whether ``labels`` satisfy this requirement."""
        present = self.key in labels
        value = labels.get(self.key)
        if self.op == EQ:
            return present and value == self.values[0]
        if self.op == NE:
            return not present or value != self.values[0]
        if self.op == IN:
            return present and value in self.values
        if self.op == NOTIN:
            return not present or value not in self.values
        if self.op == EXISTS:
            return present
        return not present


def _split(text: str) -> list[str]:
    """Split on commas outside parentheses."""
    parts: list[str] = []
    depth = 0
    cur: list[str] = []
    for ch in text:
        if ch == "(":
            depth += 1
        elif ch == ")":
            depth -= 1
            if depth < 0:
                raise SelectorError("unbalanced ')'")
        if ch == "," and depth == 0:
            parts.append("".join(cur))
            cur = []
        else:
            cur.append(ch)
    if depth:
        raise SelectorError("unbalanced '('")
    parts.append("".join(cur))
    return parts


def is_label_key(key: str) -> bool:
    """Return whether ``key`` is a Kubernetes label key (an optional DNS-subdomain prefix of at
    most :data:`MAX_PREFIX_LENGTH` characters and ``/``, then a name of at most :data:`MAX_NAME_LENGTH`)."""
    prefix, slash, name = key.rpartition("/")
    return bool(_KEY.match(key)) and len(name) <= MAX_NAME_LENGTH and not (slash and len(prefix) > MAX_PREFIX_LENGTH)


def is_label_value(value: str) -> bool:
    """Return whether ``value`` is a Kubernetes label value (empty, or at most :data:`MAX_VALUE_LENGTH`
    alphanumerics, ``-``, ``_``, ``.``, starting and ending with an alphanumeric)."""
    return len(value) <= MAX_VALUE_LENGTH and bool(_VALUE.match(value))


def _length(part: str, what: str, text: str, limit: int) -> None:
    """Raise :class:`SelectorError` when ``text`` (``what`` of requirement ``part``) is longer than ``limit``."""
    if len(text) > limit:
        raise SelectorError(f"{part.strip()[:80]!r}: {what} is {len(text)} characters long, at most {limit}")


def _key(key: str, part: str) -> str:
    prefix, slash, name = key.rpartition("/")
    if slash:
        _length(part, "the key prefix", prefix, MAX_PREFIX_LENGTH)
    _length(part, "the key name", name, MAX_NAME_LENGTH)
    if not _KEY.match(key):
        raise SelectorError(f"{part.strip()!r}: {key!r} is not a valid label key")
    return key


def _value(value: str, part: str) -> str:
    _length(part, "a value", value, MAX_VALUE_LENGTH)
    if not _VALUE.match(value):
        raise SelectorError(f"{part.strip()!r}: {value!r} is not a valid label value")
    return value


def parse(text: str | None, *, capped: bool = True) -> tuple[Requirement, ...]:
    """Parse a selector string (``None``/empty = no requirement).

    Args:
        text: the selector.
        capped: enforce the discovery API's caps (:data:`MAX_LENGTH`, :data:`MAX_REQUIREMENTS`,
            :data:`MAX_VALUES`); ``False``: only Kubernetes' own rules, as kube-apiserver parses.
    Returns:
        the requirements, in order (AND).
    Raises:
        SelectorError: naming the offending requirement, or the limit exceeded (more than
            :data:`MAX_LENGTH` characters, :data:`MAX_REQUIREMENTS` requirements or
            :data:`MAX_VALUES` values in a list; a key or value over its length).
    """
    if capped and text is not None and len(text) > MAX_LENGTH:  # before the blank check: blanks count too
        raise SelectorError(f"the selector is {len(text)} characters long, at most {MAX_LENGTH}")
    if text is None or not text.strip():
        return ()
    parts = _split(text)
    if capped and len(parts) > MAX_REQUIREMENTS:
        raise SelectorError(f"the selector has {len(parts)} requirements, at most {MAX_REQUIREMENTS}")
    out = []
    for part in parts:
        if not part.strip():
            raise SelectorError("empty requirement (two commas in a row or a trailing comma)")
        m = _SET.match(part)
        if m:
            values = [v.strip() for v in m.group("values").split(",")]
            if capped and len(values) > MAX_VALUES:
                raise SelectorError(f"{m.group('key')[:80]!r} {m.group('op')} (...): {len(values)} values, at most "
                                    f"{MAX_VALUES} in one list")
            if not values or any(v == "" for v in values):
                raise SelectorError(f"{part.strip()!r}: the value list must not be empty or have empty items")
            out.append(Requirement(_key(m.group("key"), part), m.group("op"),
                                   tuple(_value(v, part) for v in values)))
            continue
        m = _EQ.match(part)
        if m:
            op = NE if m.group("op") == "!=" else EQ
            out.append(Requirement(_key(m.group("key"), part), op, (_value(m.group("value"), part),)))
            continue
        m = _EXISTS.match(part)
        if m:
            out.append(Requirement(_key(m.group("key"), part), NOT_EXISTS if m.group("neg") else EXISTS))
            continue
        raise SelectorError(f"{part.strip()!r} is not a requirement (use k=v, k!=v, k in (a,b), "
                            "k notin (a,b), k or !k)")
    return tuple(out)


def matches(requirements: Sequence[Requirement], labels: Mapping[str, str]) -> bool:
    """Whether ``labels`` satisfy every requirement (AND)."""
    return all(req.matches(labels) for req in requirements)


def as_lua(requirements: tuple[Requirement, ...]) -> list[list]:
    """Encode requirements as ``[[key, op, [values...]], ...]`` (JSON for the lease script)."""
    return [[req.key, req.op, list(req.values)] for req in requirements]
