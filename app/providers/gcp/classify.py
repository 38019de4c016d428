"""Map google-cloud-compute / google-auth / requests errors onto the provider taxonomy.

The SDK reports a failure in two places (as google-cloud-compute raises them):

* the HTTP call itself fails: ``google.api_core.exceptions.GoogleAPICallError`` subclasses
  built from the JSON error body; a quota 403 is ``Forbidden`` with
  ``.reason == "QUOTA_EXCEEDED"`` (from the ``google.rpc.ErrorInfo`` detail) and
  ``.errors == [{"reason": "quotaExceeded", ...}]``; a rate limit is 429 ``TooManyRequests``;
* the zone/global operation finishes with an error: :func:`operation_error` builds the same
  exception the SDK's ``ExtendedOperation`` would (``from_http_status`` with
  ``httpErrorStatusCode``), which has ``reason is None`` and the error codes
  (``"QUOTA_EXCEEDED"``) in ``.errors``.

:func:`to_provider_error` classifies both the same way (Compute API error model:
https://cloud.google.com/compute/docs/api/handle-errors):

* a quota or rate-limit reason/code anywhere, or HTTP 429 -> :class:`QuotaExceeded`
  (zone resource-pool stockouts too: both mean "retry much later");
* 404 -> :class:`NotFound` (callers that create pass ``on_404=Permanent``: a 404 there means a
  referenced zone, image, machine type or network does not exist);
* 5xx, 408, 409, 412 (a stale fingerprint: ``conditionNotMet``, re-read and retry),
  ``resourceNotReady``, timeouts, connection and transport errors -> :class:`Transient`;
* other 4xx (400 invalid, 401, 403 permission denied) and unusable credentials ->
  :class:`Permanent`;
* anything else -> :class:`Transient` (the taxonomy's default).

The caller raises the result ``from`` the original exception so the cause is kept.
"""

from __future__ import annotations

import logging
from typing import Any

import requests
from google.api_core import exceptions as gexc
from google.auth import exceptions as auth_exc

from app.errors import NotFound, Permanent, ProviderError, QuotaExceeded, Transient

log = logging.getLogger("proxy_operator.gcp")

#: Reasons / operation error codes meaning "quota or capacity", normalised (lowercase, no "_").
QUOTA_REASONS = frozenset({
    "quotaexceeded", "ratelimitexceeded", "userratelimitexceeded", "resourceexhausted",
    "dailylimitexceeded", "zoneresourcepoolexhausted", "zoneresourcepoolexhaustedwithdetails",
    "regionresourcepoolexhausted",
})
#: Reasons that resolve by themselves (the resource is busy with another operation).
TRANSIENT_REASONS = frozenset({"resourcenotready", "resourceinuseby", "backenderror", "internalerror",
                               "conditionnotmet"})


def _norm(value: Any) -> str:
    return str(value or "").replace("_", "").replace("-", "").lower()


def reasons(exc: BaseException) -> list[str]:
    """Return every reason/code an SDK error carries, as given (for logs and classification).

    Looks at ``exc.reason`` (ErrorInfo), ``exc.errors`` (JSON error dicts with ``reason`` or
    operation ``Errors`` protos with ``code``).
    """
    found: list[str] = []
    reason = getattr(exc, "reason", None)
    if isinstance(reason, str) and reason:
        found.append(reason)
    for err in getattr(exc, "errors", None) or ():
        value = err.get("reason") if isinstance(err, dict) else getattr(err, "code", None)
        if isinstance(value, str) and value and value not in found:
            found.append(value)
    return found


def operation_error(op: Any) -> gexc.GoogleAPICallError | None:
    """Return the exception a finished Compute ``Operation`` carries, or ``None`` when it succeeded.

    Built like ``google.api_core.extended_operation.ExtendedOperation`` does (same class from
    ``httpErrorStatusCode``, the operation's ``Errors`` in ``.errors``), with the errors'
    messages added to the status text so logs say what happened.
    """
    errors = list(op.error.errors) if op.error and op.error.errors else []
    code = int(op.http_error_status_code or 0)
    # httpErrorMessage is only the status text ("FORBIDDEN"); the errors say what happened.
    detail = "; ".join(e.message for e in errors if e.message)
    message = f"{op.http_error_message}: {detail}" if op.http_error_message and detail else \
        (detail or op.http_error_message)
    if not errors and not code:
        return None
    if code:
        return gexc.from_http_status(status_code=code, message=message or "operation failed",
                                     response=op, errors=errors)
    return gexc.GoogleAPICallError(f"operation {op.name} failed: {message}", errors=errors, response=op)


def already_exists(exc: BaseException | None) -> bool:
    """Return whether ``exc`` says the resource being inserted already exists (HTTP 409 with
    reason ``alreadyExists``, or an operation error ``RESOURCE_ALREADY_EXISTS``)."""
    if not isinstance(exc, gexc.GoogleAPICallError) or exc.code != 409:
        return False
    normed = {_norm(r) for r in reasons(exc)}
    return not normed or bool(normed & {"alreadyexists", "resourcealreadyexists"})


def to_provider_error(exc: BaseException, what: str, *,
                      on_404: type[ProviderError] = NotFound) -> ProviderError:
    """Return the taxonomy error for ``exc`` (raise it ``from exc``).

    Args:
        exc: what the SDK, google-auth or requests raised (or :func:`operation_error` built).
        what: a short description for the message, e.g.
            ``"insert projects/p/zones/z/instances/n"`` (never user-data).
        on_404: the class for HTTP 404 (``NotFound`` by default).
    Returns:
        a :class:`NotFound`, :class:`QuotaExceeded`, :class:`Transient` or :class:`Permanent`.
    """
    if isinstance(exc, ProviderError):
        return exc
    if isinstance(exc, gexc.GoogleAPICallError):
        code = exc.code if isinstance(exc.code, int) else None
        found = reasons(exc)
        normed = {_norm(r) for r in found}
        detail = f"gcp {what}: HTTP {code or '-'}"
        if found:
            detail += f" [{', '.join(found)}]"
        detail += f": {exc.message}"
        log.debug("gcp %s failed: status=%s reasons=%s", what, code, found)
        if normed & QUOTA_REASONS or code == 429:
            return QuotaExceeded(detail)
        if code == 404:
            return on_404(detail)
        if normed & TRANSIENT_REASONS or code in (408, 409, 412) or code is None or code >= 500:
            return Transient(detail)
        return Permanent(detail)
    if isinstance(exc, (gexc.RetryError, requests.exceptions.Timeout, requests.exceptions.ConnectionError,
                        TimeoutError, ConnectionError, auth_exc.TransportError)):
        return Transient(f"gcp {what}: {type(exc).__name__}: {exc}")
    if isinstance(exc, auth_exc.RefreshError):
        cls = Transient if getattr(exc, "retryable", False) else Permanent
        return cls(f"gcp {what}: credentials refresh failed: {exc}")
    if isinstance(exc, auth_exc.GoogleAuthError):
        return Permanent(f"gcp {what}: credentials: {exc}")
    return Transient(f"gcp {what}: {type(exc).__name__}: {exc}")
