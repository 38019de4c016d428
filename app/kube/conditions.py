"""Status conditions with Kubernetes semantics (API conventions, "Typical status properties").

Conditions are a list-map keyed by ``type``; ``lastTransitionTime`` changes only when
``status`` flips; ``observedGeneration`` records the generation the condition describes.
"""

from __future__ import annotations

from app.timefmt import rfc3339


def find(conditions: list[dict] | None, ctype: str) -> dict | None:
    """Return the condition of type ``ctype`` or ``None``."""
    for c in conditions or ():
        if c.get("type") == ctype:
            return c
    return None


def set_condition(conditions: list[dict] | None, ctype: str, status: str, *, reason: str, message: str,
                  generation: int, now: str | None = None) -> list[dict]:
    """Return a new condition list with ``ctype`` set.

    Args:
        conditions: current list (not modified).
        ctype: condition type (``"Provisioned"``, ``"Healthy"``, ``"Ready"``).
        status: ``"True"``, ``"False"`` or ``"Unknown"``.
        reason: CamelCase reason.
        message: human-readable message (never secrets).
        generation: the object's ``metadata.generation``.
        now: timestamp to use when the status flips (default: now, :func:`app.timefmt.rfc3339`).
    Returns:
        the new list; ``lastTransitionTime`` is kept unless ``status`` changed.
    """
    out = [dict(c) for c in conditions or () if c.get("type") != ctype]
    old = find(conditions, ctype)
    ltt = old.get("lastTransitionTime") if old and old.get("status") == status else None
    out.append({
        "type": ctype, "status": status, "reason": reason, "message": message[:1024],
        "lastTransitionTime": ltt or now or rfc3339(), "observedGeneration": generation,
    })
    order = {"Provisioned": 0, "Healthy": 1, "Ready": 2}
    out.sort(key=lambda c: (order.get(c["type"], 9), c["type"]))
    return out


def same(a: list[dict] | None, b: list[dict] | None) -> bool:
    """Whether two condition lists say the same thing (ignoring order)."""
    key = lambda c: (c.get("type"), c.get("status"), c.get("reason"), c.get("message"),  # noqa: E731
                     c.get("observedGeneration"), c.get("lastTransitionTime"))
    return sorted(map(key, a or ())) == sorted(map(key, b or ()))
