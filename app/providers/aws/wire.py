"""Request/response logging for the aws provider: only on demand, allow-listed and redacted.

botocore logs at DEBUG what it sends and receives (``botocore.endpoint``: the request dict with
the body, so the base64 user-data; ``botocore.auth``: the canonical request and string to sign;
``botocore.credentials`` and ``botocore.utils``: where credentials came from, IMDS tokens).  None
of those records may reach a handler of ours, so :func:`bridge` installs one
:class:`SdkBridge` handler on the ``botocore``, ``boto3`` and ``urllib3`` loggers and stops them
from propagating (fail-closed): WARNING and above go on, scrubbed, to ``proxy_operator.aws.sdk``;
everything else is dropped.  The three loggers are held at INFO so the SDK does not even build
its DEBUG records.

What wire logging shows instead comes from botocore's event hooks on our own clients
(:func:`attach`): ``before-call`` gives the operation and its parameters, ``after-call`` the
HTTP status and the parsed answer; both are :func:`redact`-ed (``UserData`` and every key,
token, password or signature field removed, long strings elided) and logged to
``proxy_operator.aws.wire`` at DEBUG, only while wire logging is on: ``wireLogging.enabled`` or
env ``PROXY_OPERATOR_AWS_WIRE_LOG=1``, and that logger enabled for DEBUG.
"""

from __future__ import annotations

import json
import logging
import os
import re
import threading
from typing import Any

WIRE_LOGGER = "proxy_operator.aws.wire"
SDK_LOGGER = "proxy_operator.aws.sdk"
ENV_ENABLE = "PROXY_OPERATOR_AWS_WIRE_LOG"
ENV_FULL_PAYLOADS = "PROXY_OPERATOR_AWS_WIRE_LOG_FULL_PAYLOADS"
#: Strings longer than this many UTF-8 bytes are elided unless full payloads are on.
MAX_STRING_BYTES = 1024
REDACTED = "<redacted>"

#: Parameter and answer keys whose value is never logged wherever they appear (case-insensitive).
SENSITIVE_FIELDS = frozenset(k.lower() for k in (
    "UserData", "user_data", "SecretAccessKey", "SessionToken", "AccessKeyId", "Password", "PrivateKey",
    "KeyMaterial", "Authorization", "X-Amz-Security-Token", "Signature", "Token", "ClientSecret",
    "WebIdentityToken", "Credentials",
))

_SIGNATURE = re.compile(r"(?i)(Signature=|Credential=)[^,&\s]+")
_ACCESS_KEY = re.compile(r"\b(AKIA|ASIA)[A-Z0-9]{12,}\b")
_BEARER = re.compile(r"(?i)\b(bearer|basic)\s+[A-Za-z0-9._~+/=-]+")
_JWT = re.compile(r"eyJ[A-Za-z0-9_-]{2,}\.[A-Za-z0-9_-]{2,}\.[A-Za-z0-9_-]*")


def scrub_text(text: str) -> str:
    """Return ``text`` with SigV4 signatures/credential scopes, access key IDs, bearer tokens and JWTs replaced."""
    text = _SIGNATURE.sub(lambda m: m.group(1) + REDACTED, text)
    text = _ACCESS_KEY.sub("<redacted-access-key>", text)
    text = _BEARER.sub(lambda m: f"{m.group(1)} {REDACTED}", text)
    return _JWT.sub("<redacted-jwt>", text)


def redact(value: Any, *, full_payloads: bool = False) -> Any:
    """Return a copy of request parameters or a parsed answer that is safe to log.

    A mapping entry whose key is in :data:`SENSITIVE_FIELDS` gets its value replaced; bytes are
    replaced by their length; every string is scrubbed (:func:`scrub_text`) and, unless
    ``full_payloads``, replaced by ``<elided N bytes>`` over :data:`MAX_STRING_BYTES`.
    """
    if isinstance(value, dict):
        return {k: (REDACTED if str(k).lower() in SENSITIVE_FIELDS else redact(v, full_payloads=full_payloads))
                for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [redact(v, full_payloads=full_payloads) for v in value]
    if isinstance(value, (bytes, bytearray)):
        return f"<{len(value)} bytes>"
    if isinstance(value, str):
        value = scrub_text(value)
        size = len(value.encode("utf-8"))
        return value if full_payloads or size <= MAX_STRING_BYTES else f"<elided {size} bytes>"
    if isinstance(value, (int, float, bool)) or value is None:
        return value
    return str(value)


class SdkBridge(logging.Handler):
    """The only way out of the ``botocore``/``boto3``/``urllib3`` logger trees: scrubbed warnings."""

    def __init__(self) -> None:
        super().__init__(level=logging.WARNING)
        self._sdk = logging.getLogger(SDK_LOGGER)

    def emit(self, record: logging.LogRecord) -> None:
        """Forward a WARNING+ record's scrubbed message; drop anything else (never raises)."""
        try:
            if record.levelno >= logging.WARNING:
                self._sdk.log(record.levelno, "%s: %s", record.name, scrub_text(record.getMessage()))
        except Exception:  # noqa: BLE001 - a log path must never fail the call, nor print the record
            pass


_lock = threading.Lock()
_bridge: SdkBridge | None = None
_SDK_ROOTS = ("botocore", "boto3", "urllib3", "s3transfer")


def bridge() -> SdkBridge:
    """Install (idempotently) and return the process's :class:`SdkBridge` on the SDK's logger trees."""
    global _bridge
    with _lock:
        if _bridge is None:
            _bridge = SdkBridge()
        for name in _SDK_ROOTS:
            logger = logging.getLogger(name)
            if _bridge not in logger.handlers:
                logger.addHandler(_bridge)
            logger.propagate = False
            if logger.level == logging.NOTSET or logger.level < logging.INFO:
                logger.setLevel(logging.INFO)
        return _bridge


def _truthy(name: str) -> bool:
    return os.environ.get(name, "").strip().lower() in ("1", "true", "yes", "on")


class WireHooks:
    """botocore event handlers that log one redacted record per request and per answer.

    Args:
        provider: the provider name (in every record).
        full_payloads: keep long strings.
    """

    def __init__(self, provider: str, full_payloads: bool) -> None:
        self.provider = provider
        self.full_payloads = full_payloads
        self._log = logging.getLogger(WIRE_LOGGER)

    def before_call(self, params: Any = None, model: Any = None, **_: Any) -> None:
        """``before-call.*``: log the operation and its redacted parameters."""
        try:
            body = params.get("body") if isinstance(params, dict) else None
            entry = {"direction": "request", "provider": self.provider,
                     "operation": getattr(model, "name", "?"),
                     "params": redact(_as_params(body), full_payloads=self.full_payloads)}
            self._log.debug("aws wire request %s %s", entry["operation"], json.dumps(entry, sort_keys=True,
                                                                                   default=str),
                            extra={"aws_wire": entry})
        except Exception:  # noqa: BLE001 - a log path must never fail the call
            pass

    def after_call(self, http_response: Any = None, parsed: Any = None, model: Any = None, **_: Any) -> None:
        """``after-call.*``: log the operation, the HTTP status and the redacted answer."""
        try:
            entry = {"direction": "response", "provider": self.provider,
                     "operation": getattr(model, "name", "?"),
                     "status": getattr(http_response, "status_code", None),
                     "payload": redact({k: v for k, v in (parsed or {}).items() if k != "ResponseMetadata"},
                                       full_payloads=self.full_payloads)}
            self._log.debug("aws wire response %s %s", entry["operation"], json.dumps(entry, sort_keys=True,
                                                                                    default=str),
                            extra={"aws_wire": entry})
        except Exception:  # noqa: BLE001 - a log path must never fail the call
            pass


def _as_params(body: Any) -> Any:
    """EC2's query protocol sends a form-encoded body: decode it into a dict for redaction."""
    if isinstance(body, dict):
        return body
    if isinstance(body, (bytes, str)):
        from urllib.parse import parse_qsl

        text = body.decode("utf-8", "replace") if isinstance(body, bytes) else body
        return dict(parse_qsl(text, keep_blank_values=True))
    return {}


def attach(client: Any, provider: str, *, enabled: bool, full_payloads: bool) -> bool:
    """Install the bridge and, when wire logging is on, the hooks on ``client``.

    Args:
        client: a boto3 client.
        provider: the provider name.
        enabled: ``wireLogging.enabled`` (or-ed with env ``PROXY_OPERATOR_AWS_WIRE_LOG``).
        full_payloads: ``wireLogging.fullPayloads`` (or-ed with env ``PROXY_OPERATOR_AWS_WIRE_LOG_FULL_PAYLOADS``).
    Returns:
        whether the hooks were attached.
    """
    bridge()
    active = (enabled or _truthy(ENV_ENABLE)) and logging.getLogger(WIRE_LOGGER).isEnabledFor(logging.DEBUG)
    if not active:
        return False
    hooks = WireHooks(provider, full_payloads or _truthy(ENV_FULL_PAYLOADS))
    client.meta.events.register("before-call", hooks.before_call)
    client.meta.events.register("after-call", hooks.after_call)
    return True
