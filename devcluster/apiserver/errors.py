"""API errors as ``metav1.Status`` bodies, worded like the Kubernetes API server's.

:class:`ApiError` is what the fake raises internally; the HTTP layer turns it into the
status code and JSON ``Status`` body a real server sends (``kind: Status``,
``status: Failure``, ``reason``, ``message``, ``details``, ``code``), so the official client
raises :class:`kubernetes.client.ApiException` with the same ``status`` and ``body``.
:class:`Invalid` is what an admission hook raises to reject an object (422).
"""

from __future__ import annotations

from typing import Iterable


class ApiError(Exception):
    """An API error.

    Args:
        code: HTTP status code.
        reason: ``metav1.StatusReason`` (``NotFound``, ``Conflict``, ``Invalid``, ...).
        message: human-readable message.
        details: ``metav1.StatusDetails`` dict or ``None``.
        metadata: the Status's ``ListMeta`` (a 410 for an expired ``continue`` token carries
            the token of an inconsistent continuation there), ``None`` for none.
    """

    def __init__(self, code: int, reason: str, message: str, details: dict | None = None,
                 metadata: dict | None = None) -> None:
        super().__init__(message)
        self.code, self.reason, self.message, self.details = code, reason, message, details
        self.metadata = metadata

    def status(self) -> dict:
        """Return the ``Status`` object for the response body."""
        body = {"kind": "Status", "apiVersion": "v1", "metadata": dict(self.metadata or {}), "status": "Failure",
                "message": self.message, "reason": self.reason, "code": self.code}
        if self.details is not None:
            body["details"] = self.details
        return body

    # Constructors worded like k8s.io/apimachinery/pkg/api/errors.
    @classmethod
    def not_found(cls, group: str, plural: str, name: str) -> "ApiError":
        qual = f"{plural}.{group}" if group else plural
        return cls(404, "NotFound", f'{qual} "{name}" not found',
                   {"name": name, "group": group, "kind": plural})

    @classmethod
    def already_exists(cls, group: str, plural: str, name: str) -> "ApiError":
        qual = f"{plural}.{group}" if group else plural
        return cls(409, "AlreadyExists", f'{qual} "{name}" already exists',
                   {"name": name, "group": group, "kind": plural})

    @classmethod
    def conflict(cls, group: str, plural: str, name: str, why: str) -> "ApiError":
        qual = f"{plural}.{group}" if group else plural
        return cls(409, "Conflict", f'Operation cannot be fulfilled on {qual} "{name}": {why}',
                   {"name": name, "group": group, "kind": plural})

    @classmethod
    def invalid(cls, group: str, kind: str, name: str, causes: list[dict]) -> "ApiError":
        qual = f"{kind}.{group}" if group else kind
        joined = ", ".join(c["message"] if not c.get("field") else f'{c["field"]}: {c["message"]}'
                           for c in causes)
        msg = f'{qual} "{name}" is invalid: ' + (f"[{joined}]" if len(causes) > 1 else joined)
        return cls(422, "Invalid", msg, {"name": name, "group": group, "kind": kind, "causes": causes})

    @classmethod
    def bad_request(cls, message: str) -> "ApiError":
        return cls(400, "BadRequest", message)

    @classmethod
    def gone(cls, message: str) -> "ApiError":
        return cls(410, "Expired", message)

    @classmethod
    def not_acceptable(cls, message: str) -> "ApiError":
        return cls(406, "NotAcceptable", message)

    @classmethod
    def method_not_allowed(cls, message: str = "the server does not allow this method on the requested "
                                               "resource") -> "ApiError":
        return cls(405, "MethodNotAllowed", message)

    @classmethod
    def unsupported_media_type(cls, content_type: str) -> "ApiError":
        return cls(415, "UnsupportedMediaType", f"the body of the request was in an unknown format - "
                   f"accepted media types include: application/json-patch+json, "
                   f"application/merge-patch+json, application/apply-patch+yaml (got {content_type})")


class Invalid(Exception):
    """Raised by an admission hook to reject an object with 422 Invalid.

    Args:
        causes: one entry per problem: a ``"field.path: message"`` string, a
            ``(field, message)`` pair, or a ``{"field", "message"[, "reason"]}`` dict.
    """

    def __init__(self, causes: Iterable) -> None:
        self.causes = [_cause(c) for c in causes]
        if not self.causes:
            raise ValueError("Invalid needs at least one cause")
        super().__init__("; ".join(f"{c['field']}: {c['message']}" for c in self.causes))


def _cause(c) -> dict:
    if isinstance(c, dict):
        return {"reason": c.get("reason", "FieldValueInvalid"), "message": c["message"],
                "field": c.get("field", "")}
    if isinstance(c, tuple):
        field, message = c
        return {"reason": "FieldValueInvalid", "message": message, "field": field}
    text = str(c)
    field, sep, message = text.partition(": ")
    if not sep or " " in field:
        return {"reason": "FieldValueInvalid", "message": text, "field": ""}
    return {"reason": "FieldValueInvalid", "message": message, "field": field}
