"""The provider error taxonomy.

Every provider maps its SDK's errors onto exactly one of these classes and keeps the
original exception as ``__cause__`` (``raise NotFound(...) from sdk_error``), so the
reconciler branches on the class while logs keep the cause.  Anything a provider does not
classify is treated as :class:`Transient` by :func:`classify`: retrying is always safer than
latching a Proxy into Failed.
"""

from __future__ import annotations


class ProviderError(Exception):
    """Base class of every classified provider error.

    Attributes:
        reason: a short CamelCase reason suitable for a Kubernetes condition
            (``"NotFound"``, ``"QuotaExceeded"``, ``"Transient"``, ``"Permanent"`` unless a
            provider gives a more precise one such as ``"UnknownProvider"``).
    """

    reason = "ProviderError"

    def __init__(self, message: str, *, reason: str | None = None) -> None:
        super().__init__(message)
        if reason:
            self.reason = reason


class NotFound(ProviderError):
    """The instance (or the thing it lives in) does not exist."""

    reason = "NotFound"


class QuotaExceeded(ProviderError):
    """The provider refused for quota reasons; retry after a long backoff."""

    reason = "QuotaExceeded"


class Transient(ProviderError):
    """A failure that may go away by itself (timeouts, 5xx, a dropped connection, a missing Secret)."""

    reason = "Transient"


class Permanent(ProviderError):
    """A failure that will not go away until the spec or the configuration changes."""

    reason = "Permanent"


class NotManaged(Permanent):
    """A delete named an instance that does not carry our managed-by tag and a Proxy UID.

    Raised by every provider's ``delete`` after re-reading the instance (defence in depth
    against a forged ``gc.delete`` task or a wrong provider ID, docs/security.md); the
    instance is left in place.
    """

    reason = "NotManaged"


class SpecNotAllowed(Permanent):
    """A Proxy's spec asks for something the provider's config does not allow.

    The message starts with the field (``spec.placement.image: ...``); the reconciler writes it
    into the ``Provisioned`` condition of the ``Failed`` Proxy.

    Attributes:
        field: the dotted spec field, e.g. ``"spec.placement.image"``.
    """

    reason = "SpecNotAllowed"

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")
        self.field = field


def classify(exc: BaseException) -> type[ProviderError]:
    """Return the taxonomy class of ``exc``: its own class if classified, else :class:`Transient`.

    Args:
        exc: any exception raised by a provider call.
    Returns:
        one of :class:`NotFound`, :class:`QuotaExceeded`, :class:`Transient`, :class:`Permanent`.
    """
    for cls in (NotFound, QuotaExceeded, Permanent, Transient):
        if isinstance(exc, cls):
            return cls
    return Transient


def brief(exc: BaseException, limit: int = 200) -> str:
    """Return ``"<class>: <message>"`` for logs, the message cut at ``limit`` characters.

    Args:
        exc: any exception (Redis and broker errors name host and port, never a password).
        limit: characters of the message kept (``...`` marks a cut).
    Returns:
        the class name alone when the message is empty.
    """
    text = str(exc)
    if len(text) > limit:
        text = text[:limit] + "..."
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def describe(exc: BaseException) -> str:
    """Return ``"<message>: <cause>"`` for logs: the classified message plus its original cause, if any."""
    cause = exc.__cause__
    if cause is None or cause is exc:
        return str(exc)
    return f"{exc}: {type(cause).__name__}: {cause}"
