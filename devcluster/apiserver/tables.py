"""Server-side printing: ``meta.k8s.io/v1`` Table answers, as kube-apiserver gives ``kubectl get``.

A client that sends ``Accept: application/json;as=Table;v=v1;g=meta.k8s.io`` gets a Table
instead of a list (and, on a watch, one single-row Table per event).  For a custom resource
the columns are ``Name`` plus the CRD version's ``additionalPrinterColumns``, each cell the
value of the column's JSONPath (apiextensions-apiserver's ``tableconvertor``): a missing
value is ``null``, a ``date`` column shows the age the way ``kubectl`` shows ages (``5s``,
``3m``, ``2d``).  Built-in types get kube-apiserver's columns (its printers,
``pkg/printers/internalversion/printers.go``): Pods ``Name Ready Status Restarts Age`` and, for
``-o wide``, ``IP Node Nominated Node Readiness Gates``; Events (core and ``events.k8s.io``)
``Last Seen Type Reason Object Message`` and, wide, ``Subobject Source First Seen Count Name``;
Namespaces ``Name Status Age``; Secrets ``Name Type Data Age``; Leases ``Name Holder Age``;
any other built-in ``Name`` and ``Age``.  As upstream, the server fills every column, the
``priority: 1`` ones too, and kubectl shows those only with ``-o wide``.  Rows carry the
object's metadata (``PartialObjectMetadata``), or the whole object with ``includeObject=Object``.
"""

from __future__ import annotations

import json
import re
from datetime import datetime, timezone
from typing import Callable

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


#: kubectl's age units (``duration.HumanDuration``): (unit seconds, unit, smaller unit seconds, smaller
#: unit, below how many units the smaller one is shown too, below how many the unit alone is).
_AGE_UNITS = ((60, "m", 1, "s", 10, 180), (3600, "h", 60, "m", 8, 48), (86400, "d", 3600, "h", 8, 365 * 2))


def human_age(timestamp: str | None, now: datetime | None = None) -> str:
    """``metav1.Time`` -> kubectl's age (``duration.HumanDuration``); ``<unknown>`` if unparsable."""
    try:  # metav1.Time, or metav1.MicroTime (an Event's eventTime: fractional seconds)
        then = datetime.fromisoformat(str(timestamp))
    except ValueError:
        return "<unknown>"
    if then.tzinfo is None:
        then = then.replace(tzinfo=timezone.utc)
    seconds = int(((now or datetime.now(timezone.utc)) - then).total_seconds())
    if seconds < 0:
        return "0s"
    if seconds < 120:
        return f"{seconds}s"
    for size, unit, small, small_unit, mixed, whole in _AGE_UNITS:
        count = seconds // size
        if count < mixed:
            rest = seconds % size // small
            return f"{count}{unit}{rest}{small_unit}" if rest else f"{count}{unit}"
        if count < whole:
            return f"{count}{unit}"
    return f"{seconds // 86400 // 365}y"


class Columns(list):
    """A Table's column definitions (dicts, in order) and how a row's cells are made.

    ``cells(obj) -> list`` gives one value per column (a built-in type's printer); ``None``
    means each column's ``jsonPath`` (a custom resource's ``additionalPrinterColumns``).
    """

    def __init__(self, columns: list[dict], cells: Callable[[dict], list] | None = None) -> None:
        super().__init__(columns)
        self.cells = cells


def columns_of(crd) -> Columns:
    """The printer columns of a custom resource (a :class:`devcluster.apiserver.openapi.CRDInfo`), or
    ``Name`` and ``Age`` for ``None``."""
    extra = list(crd.columns) if crd is not None and crd.columns else [_AGE_COLUMN]
    return Columns([_NAME_COLUMN] + [{"name": c["name"], "type": c.get("type", "string"),
                                      "format": c.get("format", ""), "description": c.get("description", ""),
                                      "priority": int(c.get("priority", 0)), "jsonPath": c["jsonPath"]}
                                     for c in extra])


def columns_for(group: str, plural: str, crd) -> Columns:
    """The Table columns kube-apiserver answers for ``plural`` in API group ``group`` (``""``:
    core): a built-in printer below, else :func:`columns_of` ``crd``."""
    printer = _BUILTIN_PRINTERS.get((group, plural))
    if printer is not None and crd is None:
        return Columns(*printer)
    return columns_of(crd)


# -- built-in printers (kube-apiserver's pkg/printers/internalversion/printers.go) -------------

def _col(name: str, description: str, priority: int = 0, fmt: str = "") -> dict:
    return {"name": name, "type": "string", "format": fmt, "description": description, "priority": priority}


_AGE = _col("Age", _AGE_COLUMN["description"])
_POD_COLUMNS = [
    _NAME_COLUMN,
    _col("Ready", "The aggregate readiness state of this pod for accepting traffic."),
    _col("Status", "The aggregate status of the containers in this pod."),
    _col("Restarts", "The number of times the containers in this pod have been restarted and when the last "
                     "container in this pod has restarted."),
    _AGE,
    _col("IP", "podIP address allocated to the pod.", 1),
    _col("Node", "NodeName indicates in which node this pod is scheduled.", 1),
    _col("Nominated Node", "nominatedNodeName is set only when this pod preempts other pods on the node.", 1),
    _col("Readiness Gates", "If specified, all readiness gates will be evaluated for pod readiness.", 1),
]


def _terminated_at(status: dict) -> str | None:
    return ((status.get("lastState") or {}).get("terminated") or {}).get("finishedAt")


def _pod_cells(pod: dict) -> list:
    """printPod: ``name, ready/total, status reason, restarts, age, IP, node, nominated node, gates``."""
    meta, spec, status = pod.get("metadata") or {}, pod.get("spec") or {}, pod.get("status") or {}
    phase = status.get("phase") or ""
    reason = status.get("reason") or phase
    conditions = status.get("conditions") or []
    if any(c.get("type") == "PodScheduled" and c.get("reason") == "SchedulingGated" for c in conditions):
        reason = "SchedulingGated"
    inits = {c.get("name"): c for c in spec.get("initContainers") or []}

    def sidecar(name) -> bool:  # a restartable init container counts as a container
        return (inits.get(name) or {}).get("restartPolicy") == "Always"

    total = len(spec.get("containers") or []) + sum(1 for c in inits.values() if c.get("restartPolicy") == "Always")
    ready = restarts = sidecar_restarts = 0
    last_restart = sidecar_last_restart = ""  # ISO timestamps compare as strings
    initializing = False
    init_statuses = status.get("initContainerStatuses") or []
    for i, c in enumerate(init_statuses):
        state = c.get("state") or {}
        restarts += int(c.get("restartCount") or 0)
        last_restart = max(last_restart, _terminated_at(c) or "")
        if sidecar(c.get("name")):
            sidecar_restarts += int(c.get("restartCount") or 0)
            sidecar_last_restart = max(sidecar_last_restart, _terminated_at(c) or "")
        terminated, waiting = state.get("terminated"), state.get("waiting")
        if terminated is not None and int(terminated.get("exitCode") or 0) == 0:
            continue
        if sidecar(c.get("name")) and c.get("started"):
            ready += 1 if c.get("ready") else 0
            continue
        if terminated is not None:
            if terminated.get("reason"):
                reason = "Init:" + terminated["reason"]
            elif terminated.get("signal"):
                reason = f"Init:Signal:{terminated['signal']}"
            else:
                reason = f"Init:ExitCode:{terminated.get('exitCode', 0)}"
        elif waiting is not None and waiting.get("reason") and waiting["reason"] != "PodInitializing":
            reason = "Init:" + waiting["reason"]
        else:
            reason = f"Init:{i}/{len(inits)}"
        initializing = True
        break
    initialized = any(c.get("type") == "Initialized" and c.get("status") == "True" for c in conditions)
    if not initializing or initialized:
        restarts, last_restart = sidecar_restarts, sidecar_last_restart
        has_running = False
        for c in reversed(status.get("containerStatuses") or []):
            state = c.get("state") or {}
            restarts += int(c.get("restartCount") or 0)
            last_restart = max(last_restart, _terminated_at(c) or "")
            waiting, terminated = state.get("waiting"), state.get("terminated")
            if waiting is not None and waiting.get("reason"):
                reason = waiting["reason"]
            elif terminated is not None and terminated.get("reason"):
                reason = terminated["reason"]
            elif terminated is not None:
                reason = (f"Signal:{terminated['signal']}" if terminated.get("signal")
                          else f"ExitCode:{terminated.get('exitCode', 0)}")
            elif c.get("ready") and state.get("running") is not None:
                has_running = True
                ready += 1
        if reason == "Completed" and has_running:
            pod_ready = any(c.get("type") == "Ready" and c.get("status") == "True" for c in conditions)
            reason = "Running" if pod_ready else "NotReady"
    if meta.get("deletionTimestamp") and status.get("reason") == "NodeLost":
        reason = "Unknown"
    elif meta.get("deletionTimestamp") and phase not in ("Succeeded", "Failed"):
        reason = "Terminating"
    shown_restarts = str(restarts)
    if restarts and last_restart:
        shown_restarts = f"{restarts} ({human_age(last_restart)} ago)"
    ips = status.get("podIPs") or []
    gates = spec.get("readinessGates") or []
    if gates:
        true = {c.get("type") for c in conditions if c.get("status") == "True"}
        shown_gates = f"{sum(1 for g in gates if g.get('conditionType') in true)}/{len(gates)}"
    else:
        shown_gates = "<none>"
    return [meta.get("name"), f"{ready}/{total}", reason, shown_restarts, human_age(meta.get("creationTimestamp")),
            (ips[0].get("ip") if ips else "") or "<none>", spec.get("nodeName") or "<none>",
            status.get("nominatedNodeName") or "<none>", shown_gates]


_EVENT_COLUMNS = [
    _col("Last Seen", "The time at which the most recent occurrence of this event was recorded."),
    _col("Type", "Type of this event (Normal, Warning), new types could be added in the future"),
    _col("Reason", "This should be a short, machine understandable string that gives the reason for the "
                   "transition into the object's current status."),
    _col("Object", "The object that this event is about."),
    _col("Subobject", "The field of the object the event is about (fieldPath).", 1),
    _col("Source", "The component reporting this event.", 1),
    _col("Message", "A human-readable description of the status of this operation."),
    _col("First Seen", "The time at which the event was first recorded.", 1),
    _col("Count", "The number of times this event has occurred.", 1),
    {**_NAME_COLUMN, "priority": 1},
]


def _as_core_event(ev: dict) -> dict:
    """An ``events.k8s.io/v1`` Event in the ``v1`` Event's field names (as the apiserver's
    conversion to its internal Event does); a core Event unchanged."""
    if not str(ev.get("apiVersion", "")).startswith("events.k8s.io/"):
        return ev
    return {"metadata": ev.get("metadata") or {}, "involvedObject": ev.get("regarding") or {},
            "reason": ev.get("reason"), "message": ev.get("note"), "type": ev.get("type"),
            "source": ev.get("deprecatedSource") or {}, "firstTimestamp": ev.get("deprecatedFirstTimestamp"),
            "lastTimestamp": ev.get("deprecatedLastTimestamp"), "count": ev.get("deprecatedCount"),
            "eventTime": ev.get("eventTime"), "series": ev.get("series"),
            "reportingComponent": ev.get("reportingController"), "reportingInstance": ev.get("reportingInstance")}


def _event_cells(obj: dict) -> list:
    """printEvent (wide): last seen, type, reason, kind/name, fieldPath, source, message, first seen,
    count, name."""
    ev = _as_core_event(obj)
    first = human_age(ev.get("firstTimestamp")) if ev.get("firstTimestamp") else human_age(ev.get("eventTime"))
    last = human_age(ev.get("lastTimestamp")) if ev.get("lastTimestamp") else first
    count = ev.get("count") or 0
    series = ev.get("series")
    if series:
        last, count = human_age(series.get("lastObservedTime")), series.get("count") or 0
    elif not count:
        count = 1  # singleton events of the new API carry no count
    involved = ev.get("involvedObject") or {}
    kind = str(involved.get("kind") or "").lower()
    target = f"{kind}/{involved['name']}" if involved.get("name") else kind
    source = ev.get("source") or {}
    component = source.get("component") or ev.get("reportingComponent") or ""
    instance = source.get("host") or ev.get("reportingInstance") or ""
    return [last, ev.get("type") or "", ev.get("reason") or "", target, involved.get("fieldPath") or "",
            f"{component}, {instance}" if instance else component, (ev.get("message") or "").strip(), first,
            int(count), (ev.get("metadata") or {}).get("name")]


def _age_of(obj: dict) -> str:
    return human_age((obj.get("metadata") or {}).get("creationTimestamp"))


_NAMESPACE_COLUMNS = [_NAME_COLUMN, _col("Status", "The status of the namespace"), _AGE]
_SECRET_COLUMNS = [_NAME_COLUMN, _col("Type", "Used to facilitate programmatic handling of secret data."),
                   _col("Data", "The number of keys in the secret's data."), _AGE]
_LEASE_COLUMNS = [_NAME_COLUMN, _col("Holder", "holderIdentity contains the identity of the holder of a "
                                               "current lease."), _AGE]

_BUILTIN_PRINTERS: dict[tuple[str, str], tuple[list[dict], Callable[[dict], list]]] = {
    ("", "pods"): (_POD_COLUMNS, _pod_cells),
    ("", "events"): (_EVENT_COLUMNS, _event_cells),
    ("events.k8s.io", "events"): (_EVENT_COLUMNS, _event_cells),
    ("", "namespaces"): (_NAMESPACE_COLUMNS, lambda o: [
        o["metadata"].get("name"), (o.get("status") or {}).get("phase") or "", _age_of(o)]),
    ("", "secrets"): (_SECRET_COLUMNS, lambda o: [
        o["metadata"].get("name"), o.get("type") or "", len(o.get("data") or {}), _age_of(o)]),
    ("coordination.k8s.io", "leases"): (_LEASE_COLUMNS, lambda o: [
        o["metadata"].get("name"), (o.get("spec") or {}).get("holderIdentity") or "", _age_of(o)]),
}


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
    """One Table row for ``obj`` (``columns``: a :class:`Columns`, or a list of jsonPath columns)."""
    printer = getattr(columns, "cells", None)
    if printer is not None:
        cells = printer(obj)
    else:
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
