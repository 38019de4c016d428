"""Map botocore errors onto the provider taxonomy.

EC2 answers a failed call with an XML error whose ``Code`` botocore puts in
``ClientError.response["Error"]["Code"]`` (error codes:
https://docs.aws.amazon.com/AWSEC2/latest/APIReference/errors-overview.html).
:func:`to_provider_error` classifies:

* quota and capacity (:data:`QUOTA_CODES`: ``InstanceLimitExceeded``, ``VcpuLimitExceeded``,
  ``InsufficientInstanceCapacity``, ``MaxSpotInstanceCountExceeded`` ...) -> :class:`QuotaExceeded`:
  retry much later;
* rate limits (:data:`THROTTLING_CODES`: ``RequestLimitExceeded``, ``Throttling`` ...), 5xx,
  ``IncorrectState``-like codes, timeouts and connection errors -> :class:`Transient`
  (botocore's standard retry mode has already retried them ``maxAttempts`` times with its own
  backoff; the reconciler backs off further);
* ``*.NotFound`` (``InvalidInstanceID.NotFound``: EC2's reads lag behind its writes) ->
  :class:`NotFound` (callers that create pass ``on_404=Permanent``: a subnet, group or
  AMI that does not exist is a configuration problem);
* ``InvalidAMIID.*``, ``UnauthorizedOperation``, ``AuthFailure``, ``InvalidParameter*``,
  ``OptInRequired`` and any other 4xx -> :class:`Permanent`; missing credentials too, unless the
  configured credentials file is missing (Transient: a Secret mounted later heals);
* anything else -> :class:`Transient` (the taxonomy's default).

Messages carry the operation, the code and EC2's message, never parameters (user-data) or
credentials.  The caller raises the result ``from`` the original exception.
"""

from __future__ import annotations

import logging

from botocore import exceptions as bexc

from app.errors import NotFound, Permanent, ProviderError, QuotaExceeded, Transient

log = logging.getLogger("proxy_operator.aws")

#: Quota or capacity: retry much later (the long quota backoff).
QUOTA_CODES = frozenset({
    "InstanceLimitExceeded", "VcpuLimitExceeded", "InsufficientInstanceCapacity", "InsufficientCapacity",
    "InsufficientHostCapacity", "InsufficientReservedInstanceCapacity", "MaxSpotInstanceCountExceeded",
    "SpotMaxPriceTooLow", "InsufficientFreeAddressesInSubnet", "AddressLimitExceeded",
    "SecurityGroupLimitExceeded", "RulesPerSecurityGroupLimitExceeded", "ResourceLimitExceeded",
    "VolumeLimitExceeded", "MaxIOPSLimitExceeded", "TagLimitExceeded",
})
#: Rate limits: botocore retried them; still failing, they are Transient.
THROTTLING_CODES = frozenset({
    "RequestLimitExceeded", "Throttling", "ThrottlingException", "ThrottledException", "RequestThrottled",
    "RequestThrottledException", "TooManyRequestsException", "SlowDown", "PriorRequestNotComplete",
    "EC2ThrottledException", "BandwidthLimitExceeded",
})
#: Codes that resolve by themselves: the resource is busy or the service is.
TRANSIENT_CODES = frozenset({
    "InternalError", "InternalFailure", "ServiceUnavailable", "Unavailable", "RequestTimeout",
    "RequestTimeoutException", "IncorrectState", "IncorrectInstanceState", "DependencyViolation",
    "ConcurrentTagAccess", "RequestExpired", "IdempotentInstanceTerminated",
})


def code_of(exc: BaseException) -> str:
    """Return the EC2 error code of a ``ClientError`` (``""`` for anything else)."""
    if isinstance(exc, bexc.ClientError):
        return str((exc.response.get("Error") or {}).get("Code") or "")
    return ""


def status_of(exc: BaseException) -> int | None:
    """Return the HTTP status of a ``ClientError``, or ``None``."""
    if isinstance(exc, bexc.ClientError):
        status = (exc.response.get("ResponseMetadata") or {}).get("HTTPStatusCode")
        return int(status) if isinstance(status, int) else None
    return None


def _message(exc: bexc.ClientError) -> str:
    return str((exc.response.get("Error") or {}).get("Message") or "").strip()


def to_provider_error(exc: BaseException, what: str, *, on_404: type[ProviderError] = NotFound) -> ProviderError:
    """Return the taxonomy error for ``exc`` (raise it ``from exc``).

    Args:
        exc: what botocore raised.
        what: a short description for the message, e.g. ``"RunInstances eu-west-1a/proxy-abc"``
            (never user-data).
        on_404: the class for a ``*.NotFound`` code (``NotFound`` by default).
    Returns:
        a :class:`NotFound`, :class:`QuotaExceeded`, :class:`Transient` or :class:`Permanent`.
    """
    if isinstance(exc, ProviderError):
        return exc
    if isinstance(exc, bexc.ClientError):
        code, status = code_of(exc), status_of(exc)
        detail = f"aws {what}: {code or 'error'} (HTTP {status or '-'}): {_message(exc)}"
        log.debug("aws %s failed: status=%s code=%s", what, status, code)
        if code in QUOTA_CODES:
            return QuotaExceeded(detail)
        if code in THROTTLING_CODES or status == 429:
            return Transient(detail)
        if code.startswith("InvalidAMIID."):
            return Permanent(detail)
        if code.endswith(".NotFound"):
            return on_404(detail)
        if code in TRANSIENT_CODES or status is None or status >= 500:
            return Transient(detail)
        return Permanent(detail)
    if isinstance(exc, (bexc.ConnectionError, bexc.HTTPClientError, bexc.ReadTimeoutError,
                        bexc.ConnectTimeoutError, TimeoutError, ConnectionError)):
        return Transient(f"aws {what}: {type(exc).__name__}: {exc}")
    if isinstance(exc, (bexc.NoCredentialsError, bexc.PartialCredentialsError)):
        return Permanent(f"aws {what}: no usable AWS credentials ({type(exc).__name__}); set aws.credentialsFile, "
                         "the environment, a web identity (IRSA) or an instance profile")
    if isinstance(exc, bexc.CredentialRetrievalError):
        return Transient(f"aws {what}: credentials could not be fetched yet: {type(exc).__name__}")
    if isinstance(exc, (bexc.ProfileNotFound, bexc.NoRegionError, bexc.ParamValidationError)):
        return Permanent(f"aws {what}: {type(exc).__name__}: {exc}")
    return Transient(f"aws {what}: {type(exc).__name__}: {exc}")
