"""The exceptions of the client.

* :class:`ApiError` — the API answered with an error (any 4xx/5xx, or an answer that is not the
  API's JSON).  Its :attr:`~ApiError.code` is the API's stable ``error`` code
  (``no_proxy_available``, ``lease_expired``, ``unauthorized``, ... — docs/discovery-api.md,
  "Errors").
* :class:`TransportError` — the API could not be reached or did not answer in time.
* :class:`ClientClosed` — the :class:`~proxy_operator_client.Client` was closed while a call
  waited.

All three derive from :class:`ProxyOperatorError`.  None of them ever carries the bearer token
or a proxy credential in its message.
"""

from __future__ import annotations

import email.utils
import math
import time
from datetime import timezone
from typing import Optional


class ProxyOperatorError(Exception):
    """Base class of every exception this package raises (besides ``ValueError`` for bad
    arguments)."""


class ApiError(ProxyOperatorError):
    """An error answer of the discovery/lease API.

    Args:
        status: the HTTP status (e.g. ``503``).
        code: the API's ``error`` code (e.g. ``"no_proxy_available"``); ``"unexpected_response"``
            when the answer was not the API's JSON error document (a gateway's HTML page, say).
        message: the API's ``message`` (never a token or credential: the API guarantees it).
        field: the request field at fault (``"ttlSeconds"``, ``"sessionKey"``, ...) or ``None``.
        retry_after: seconds the API asked to wait before retrying (``Retry-After``), or ``None``.
        target: the target (registrable domain) of a refused targeted lease request
            (``target_refusing``, or a ``no_proxy_available`` for a target), else ``None``.

    Attributes:
        status, code, message, field, retry_after, target: as above.
    """

    def __init__(self, status: int, code: str, message: str, field: Optional[str] = None,
                 retry_after: Optional[float] = None, target: Optional[str] = None) -> None:
        super().__init__(status, code, message, field, retry_after)
        self.status, self.code, self.message = status, code, message
        self.field, self.retry_after, self.target = field, retry_after, target

    def __str__(self) -> str:
        return f"{self.status} {self.code}: {self.message}"

    def __repr__(self) -> str:
        return f"ApiError(status={self.status}, code={self.code!r}, message={self.message!r}, field={self.field!r})"


class TransportError(ProxyOperatorError):
    """The API could not be reached (connection refused, DNS, TLS) or did not answer within the
    client's timeout.  The message names the API's address and the operation, nothing more."""


class ClientClosed(ProxyOperatorError):
    """The client was closed (:meth:`proxy_operator_client.Client.close`) while the call waited
    for a proxy, or before it started."""


def parse_retry_after(value: Optional[str], now: Optional[float] = None) -> Optional[float]:
    """Seconds to wait from a ``Retry-After`` header value: delta-seconds (``"1"``) or an
    HTTP-date (GMT in each of its three formats, also when the zone is left out; a date already
    past gives ``0``), counted from ``now`` (``time.time()``); ``None`` when absent or unreadable
    (a negative or non-finite number included: the caller then uses its default)."""
    if value is None or not value.strip():
        return None
    value = value.strip()
    try:
        seconds = float(value)
    except ValueError:
        pass
    else:
        return max(0.0, seconds) if math.isfinite(seconds) and seconds >= 0 else None
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError, IndexError, OverflowError):
        return None
    if when is None:
        return None
    if when.tzinfo is None:  # asctime dates and "-0000" carry no zone: HTTP-dates are always GMT
        when = when.replace(tzinfo=timezone.utc)
    return max(0.0, when.timestamp() - (time.time() if now is None else now))
