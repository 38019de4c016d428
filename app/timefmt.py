"""RFC 3339 timestamps, the one formatter and the one parser.

Kubernetes serialises ``metav1.Time`` (conditions' ``lastTransitionTime``, ``creationTimestamp``,
status times) as RFC 3339 in UTC with second precision: ``2026-01-02T03:04:05Z``.  Everything
the operator writes in that form goes through :func:`rfc3339`; the API's lease times and the
log lines carry milliseconds (``millis=True``).  Timestamps read from the Kubernetes API, GCE
and libvirt metadata go through :func:`parse_rfc3339`.
"""

from __future__ import annotations

import re
from datetime import datetime, timedelta, timezone

_SECONDS = "%Y-%m-%dT%H:%M:%S"


def rfc3339(ts: float | datetime | None = None, *, millis: bool = False) -> str:
    """Return ``ts`` as RFC 3339 in UTC: ``2026-01-02T03:04:05Z`` (``...05.123Z`` with ``millis``).

    Args:
        ts: epoch seconds, a :class:`~datetime.datetime` (a naive one is taken as UTC), or
            ``None`` for now.
        millis: add milliseconds (truncated); default: seconds, truncated, as Kubernetes
            serialises ``metav1.Time``.
    """
    if ts is None:
        dt = datetime.now(timezone.utc)
    elif isinstance(ts, datetime):
        dt = ts.astimezone(timezone.utc) if ts.tzinfo else ts
    else:
        dt = datetime.fromtimestamp(ts, timezone.utc)
    if millis:
        return f"{dt.strftime(_SECONDS)}.{dt.microsecond // 1000:03d}Z"
    return f"{dt.strftime(_SECONDS)}Z"


_RFC3339 = re.compile(r"(\d{4})-(\d{2})-(\d{2})[Tt ](\d{2}):(\d{2}):(\d{2})(?:\.(\d+))?"
                      r"(?:([Zz])|([+-])(\d{2}):(\d{2}))?")


def parse_rfc3339(text: str) -> datetime:
    """Return the aware UTC :class:`~datetime.datetime` of an RFC 3339 timestamp.

    Accepts any fraction of a second (kept to microseconds) and any offset; a stamp without
    an offset is taken as UTC.

    Raises:
        ValueError: not an RFC 3339 date-time (the message quotes ``text``).
    """
    m = _RFC3339.fullmatch(text.strip()) if isinstance(text, str) else None
    if m is None:
        raise ValueError(f"not an RFC 3339 timestamp: {text!r}")
    year, month, day, hour, minute, second = (int(g) for g in m.groups()[:6])
    fraction, zulu, sign, off_h, off_m = m.groups()[6:]
    micro = int((fraction or "0")[:6].ljust(6, "0"))
    tz = timezone.utc
    if sign and not zulu:
        offset = timedelta(hours=int(off_h), minutes=int(off_m))
        tz = timezone(-offset if sign == "-" else offset)
    try:
        return datetime(year, month, day, hour, minute, second, micro, tzinfo=tz).astimezone(timezone.utc)
    except (ValueError, OverflowError) as exc:  # OverflowError: an offset past year 1 or 9999
        raise ValueError(f"not an RFC 3339 timestamp: {text!r}: {exc}") from None


__all__ = ["parse_rfc3339", "rfc3339"]
