"""Server-side printing: ``meta.k8s.io/v1`` Table answers, as kube-apiserver gives ``kubectl get``.

A client that sends ``Accept: application/json;as=Table;v=v1;g=meta.k8s.io`` gets a Table
instead of a list (and, on a watch, one single-row Table per event).  For a custom resource
the columns are ``Name`` plus the CRD version's ``additionalPrinterColumns``, each cell the
value of the column's JSONPath (apiextensions-apiserver's ``tableconvertor``): a missing
value is ``null``, a ``date`` column shows the age the way ``kubectl`` shows ages (``5s``,
``3m``, ``2d``).  Built-in types get ``Name`` and ``Age``.  Rows carry the object's metadata
(``PartialObjectMetadata``), or the whole object with ``includeObject=Object``.
"""

from __future__ import annotations

import json
import re
from datetime import datetime, timezone

_NAME_COLUMN = {"name": "Name", "type": "string", "format": "name", "priority": 0,
                "description": "Name must be unique within a namespace. More info: "
                               "https://kubernetes.io/docs/concepts/overview/working-with-objects/names#names"}
_AGE_COLUMN = {"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp",
               "description": "CreationTimestamp is a timestamp representing the server time when this object "
                              "was created."}
_STEP = re.compile(r"""\.([A-Za-z0-9_\-]+)|\[(\d+|\*)\]|\[\?\(@\.([A-Za-z0-9_\-.]+)\s*==\s*(?:"([^"]*)"|'([^']*)')\)\]""")


def wants_table(accept: str) -> bool:
    """Whether an ``Accept`` header asks for a ``meta.k8s.io`` Table first."""
    for part in (accept or "").split(","):
        params = {kv.split("=", 1)[0].strip(): kv.split("=", 1)[1].strip()
                  for kv in part.split(";")[1:] if "=" in kv}
        if params.get("as") == "Table" and params.get("g") == "meta.k8s.io":
            return True
        if part.strip().split(";")[0] in ("application/json", "*/*") and "as" not in params:
            return False
    return False


def jsonpath(obj, path: str) -> list:
    """Evaluate the JSONPath subset printer columns use; return the values found.

    Supports ``.field``, ``[n]``, ``[*]`` and ``[?(@.a.b=="value")]`` steps (an optional
    leading ``$`` or ``{...}`` wrapper is accepted).

    Raises:
        ValueError: a path outside that subset.
    """
    text = path.strip()
    if text.startswith("{") and text.endswith("}"):
        text = text[1:-1]
    text = text.lstrip("$")
    values = [obj]
    pos = 0
    while pos < len(text):
        m = _STEP.match(text, pos)
        if m is None:
            raise ValueError(f"unsupported JSONPath {path!r} at {text[pos:]!r}")
        pos = m.end()
        out = []
        for v in values:
            if m.group(1) is not None:
                if isinstance(v, dict) and m.group(1) in v:
                    out.append(v[m.group(1)])
            elif m.group(2) is not None:
                if isinstance(v, list):
                    if m.group(2) == "*":
                        out.extend(v)
                    elif int(m.group(2)) < len(v):
                        out.append(v[int(m.group(2))])
            else:
                want = m.group(4) if m.group(4) is not None else m.group(5)
                for item in v if isinstance(v, list) else []:
                    got = item
                    for key in m.group(3).split("."):
                        got = got.get(key) if isinstance(got, dict) else None
                    if got is not None and str(got) == want:
                        out.append(item)
        values = out
    return values


def human_age(timestamp: str | None, now: datetime | None = None) -> str:
    """``metav1.Time`` -> kubectl's age (``duration.HumanDuration``); ``<unknown>`` if unparsable."""
    try:
        then = datetime.strptime(str(timestamp), "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=timezone.utc)
    except ValueError:
        return "<unknown>"
    seconds = int(((now or datetime.now(timezone.utc)) - then).total_seconds())
    if seconds < 0:
        return "0s"
    if seconds < 120:
        return f"{seconds}s"
    minutes = seconds // 60
    if minutes < 10:
        s = seconds % 60
        return f"{minutes}m{s}s" if s else f"{minutes}m"
    if minutes < 180:
        return f"{minutes}m"
    hours = minutes // 60
    if hours < 8:
        m = minutes % 60
        return f"{hours}h{m}m" if m else f"{hours}h"
    if hours < 48:
        return f"{hours}h"
    days = hours // 24
    if days < 8:
        h = hours % 24
        return f"{days}d{h}h" if h else f"{days}d"
    if days < 365 * 2:
        return f"{days}d"
    return f"{days // 365}y"


def columns_of(crd) -> list[dict]:
    """The printer columns of a type (a :class:`tests.kubefake.openapi.CRDInfo` or ``None``)."""
    extra = list(crd.columns) if crd is not None and crd.columns else [_AGE_COLUMN]
    return [_NAME_COLUMN] + [{"name": c["name"], "type": c.get("type", "string"),
                              "format": c.get("format", ""), "description": c.get("description", ""),
                              "priority": int(c.get("priority", 0)), "jsonPath": c["jsonPath"]} for c in extra]


def _cell(column: dict, obj: dict):
    found = jsonpath(obj, column["jsonPath"])
    if not found:
        return None
    value = found[0]
    if column["type"] == "date":
        return human_age(value)
    if isinstance(value, (dict, list)):
        return json.dumps(value, separators=(",", ":"))
    return value


def row(columns: list[dict], obj: dict, include_object: str = "Metadata") -> dict:
    """One Table row for ``obj``."""
    cells = [obj.get("metadata", {}).get("name")] + [_cell(c, obj) for c in columns[1:]]
    if include_object == "Object":
        embedded = obj
    elif include_object == "None":
        embedded = None
    else:
        embedded = {"kind": "PartialObjectMetadata", "apiVersion": "meta.k8s.io/v1", "metadata": obj.get("metadata", {})}
    out = {"cells": cells}
    if embedded is not None:
        out["object"] = embedded
    return out


def table(columns: list[dict], objects: list[dict], metadata: dict, include_object: str = "Metadata") -> dict:
    """A ``meta.k8s.io/v1`` Table of ``objects``."""
    return {"kind": "Table", "apiVersion": "meta.k8s.io/v1", "metadata": metadata,
            "columnDefinitions": [{k: v for k, v in c.items() if k != "jsonPath"} for c in columns],
            "rows": [row(columns, o, include_object) for o in objects]}
