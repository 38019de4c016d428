"""SDK wire logging for the gcp provider: only on demand, allow-listed and redacted.

google-cloud-compute's REST transports log one DEBUG record per request ("Sending request
for ...", extra ``httpRequest`` with URL, headers and the JSON payload) and per response
("Received response for ...", extra ``httpResponse``).  An insert payload carries the
Proxy's cloud-init as ``user-data`` metadata, and google-auth logs its token exchange (a
signed JWT assertion, then a bearer token) under the same ``google`` logger tree.  So the
raw records must never reach a handler of ours.

:func:`configure` installs one :class:`WireBridge` handler on the ``google`` logger and stops
that tree from propagating, which makes the bridge the only way out (fail-closed: a record a
future SDK adds is dropped unless it matches the allow-list):

* WARNING and above from any ``google.*`` logger: the message only (no extras), with bearer
  tokens, JWTs and ``ya29.`` access tokens scrubbed, to ``proxy_operator.gcp.sdk``.
* DEBUG request/response records of a compute REST transport
  (``google.cloud.compute_v1.services.<service>.transports.rest``) whose request URL is on an
  allowed API host, and only while wire logging is on: URL, method, allow-listed headers and
  the payload with user-data (and other script/key metadata) removed, tokens and JWTs
  scrubbed and strings over 1 KiB elided (unless full payloads were asked for), to
  ``proxy_operator.gcp.wire`` at DEBUG.
* everything else (google-auth's request logs, client-creation records...): dropped.

Wire logging is on when a gcp provider's ``wireLogging.enabled`` is true or the environment
has ``PROXY_OPERATOR_GCP_WIRE_LOG=1``, *and* the ``proxy_operator.gcp.wire`` logger is
enabled for DEBUG when the provider builds its clients (the most verbose level).  It is
process-wide: the SDK's loggers are module globals.

``GOOGLE_SDK_PYTHON_LOGGING_SCOPE`` would make the SDK attach its own stdout handler that
prints raw payloads; :func:`configure` removes it from the environment (with a warning)
before any client is built.
"""

from __future__ import annotations

import json
import logging
import os
import re
import threading
from typing import Any
from urllib.parse import urlsplit

WIRE_LOGGER = "proxy_operator.gcp.wire"
SDK_LOGGER = "proxy_operator.gcp.sdk"
ENV_ENABLE = "PROXY_OPERATOR_GCP_WIRE_LOG"
ENV_FULL_PAYLOADS = "PROXY_OPERATOR_GCP_WIRE_LOG_FULL_PAYLOADS"
SDK_SCOPE_ENV = "GOOGLE_SDK_PYTHON_LOGGING_SCOPE"
DEFAULT_API_ENDPOINT = "https://compute.googleapis.com"
#: Payload strings longer than this many UTF-8 bytes are elided unless full payloads are on.
MAX_STRING_BYTES = 1024

_SDK_ROOT = "google"
_COMPUTE = "google.cloud.compute_v1"
_TRANSPORT = re.compile(r"^google\.cloud\.compute_v1\.services\.[a-z0-9_]+\.transports\.rest$")

#: Instance metadata keys whose value is never logged (cloud-init, scripts, keys).
SENSITIVE_METADATA_KEYS = frozenset({
    "user-data", "vendor-data", "startup-script", "shutdown-script", "ssh-keys", "sshKeys",
    "squid-htpasswd", "windows-keys", "sysprep-specialize-script-ps1", "windows-startup-script-ps1",
})
#: Mapping keys whose value is never logged wherever they appear.
SENSITIVE_FIELDS = frozenset({
    "user-data", "user_data", "userData", "vendor-data", "vendor_data", "vendorData",
    "access_token", "accessToken", "id_token", "idToken", "refresh_token", "refreshToken",
    "assertion", "private_key", "privateKey", "client_secret", "clientSecret", "password",
    "authorization", "Authorization",
})
#: Headers that are logged; any other header's value is replaced.
ALLOWED_HEADERS = frozenset({
    "content-type", "content-length", "content-encoding", "transfer-encoding", "date", "etag",
    "server", "vary", "cache-control", "x-goog-api-client", "x-goog-request-params",
    "x-goog-api-version", "x-goog-user-project", "alt-svc",
})

_JWT = re.compile(r"eyJ[A-Za-z0-9_-]{2,}\.[A-Za-z0-9_-]{2,}\.[A-Za-z0-9_-]*")
_BEARER = re.compile(r"(?i)\b(bearer|basic)\s+[A-Za-z0-9._~+/=-]+")
_GOOGLE_TOKEN = re.compile(r"\bya29\.[A-Za-z0-9._-]+")
_QUERY_SECRET = re.compile(r"(?i)([?&](?:access_token|token|key|assertion|signature)=)[^&#\s]+")

REDACTED = "<redacted>"


def scrub_text(text: str) -> str:
    """Return ``text`` with JWTs, bearer/basic credentials, ``ya29.`` tokens and secret query parameters replaced."""
    text = _JWT.sub("<redacted-jwt>", text)
    text = _BEARER.sub(lambda m: f"{m.group(1)} {REDACTED}", text)
    text = _GOOGLE_TOKEN.sub("<redacted-token>", text)
    return _QUERY_SECRET.sub(lambda m: m.group(1) + REDACTED, text)


def _string(value: str, full_payloads: bool) -> str:
    value = scrub_text(value)
    size = len(value.encode("utf-8"))
    if not full_payloads and size > MAX_STRING_BYTES:
        return f"<elided {size} bytes>"
    return value


def redact(value: Any, *, full_payloads: bool = False) -> Any:
    """Return a copy of a decoded JSON payload that is safe to log.

    * a mapping ``{"key": K, "value": V}`` with ``K`` in :data:`SENSITIVE_METADATA_KEYS`
      (an instance metadata item) gets ``V`` replaced, whatever ``full_payloads`` says;
    * a mapping entry whose key is in :data:`SENSITIVE_FIELDS` gets its value replaced;
    * every string is scrubbed (:func:`scrub_text`) and, unless ``full_payloads``, replaced by
      ``<elided N bytes>`` when longer than :data:`MAX_STRING_BYTES` UTF-8 bytes.
    """
    if isinstance(value, dict):
        item_key = value.get("key")
        secret_item = isinstance(item_key, str) and item_key in SENSITIVE_METADATA_KEYS
        out: dict[Any, Any] = {}
        for k, v in value.items():
            if k in SENSITIVE_FIELDS or (secret_item and k == "value"):
                out[k] = REDACTED
            else:
                out[k] = redact(v, full_payloads=full_payloads)
        return out
    if isinstance(value, list):
        return [redact(v, full_payloads=full_payloads) for v in value]
    if isinstance(value, str):
        return _string(value, full_payloads)
    return value


def sanitize_payload(payload: Any, *, full_payloads: bool = False) -> Any:
    """Decode a logged payload (usually a JSON string) and :func:`redact` it.

    A string that is not JSON is scrubbed and elided like any payload string; bytes are never
    logged (only their length).
    """
    if payload is None:
        return None
    if isinstance(payload, (bytes, bytearray)):
        return f"<{len(payload)} bytes>"
    if isinstance(payload, str):
        try:
            decoded = json.loads(payload)
        except ValueError:
            return _string(payload, full_payloads)
        return redact(decoded, full_payloads=full_payloads)
    return redact(payload, full_payloads=full_payloads)


def sanitize_headers(headers: Any) -> dict[str, str]:
    """Return headers with every value outside :data:`ALLOWED_HEADERS` replaced (fail-closed)."""
    if not isinstance(headers, dict):
        return {}
    out = {}
    for name, value in headers.items():
        key = str(name)
        out[key] = scrub_text(str(value)) if key.lower() in ALLOWED_HEADERS else REDACTED
    return out


def endpoint_host(url: str) -> tuple[str, int]:
    """Return ``(hostname, port)`` of an endpoint URL, with the scheme's default port."""
    parts = urlsplit(url if "://" in url else f"https://{url}")
    port = parts.port or (80 if parts.scheme == "http" else 443)
    return (parts.hostname or "").lower(), port


class WireBridge(logging.Handler, logging.Filter):  # type: ignore[misc]  # both bases define name; Handler's wins
    """Sanitizes compute records where they are made, and is the way out of the ``google`` tree.

    As a *filter* on every compute client/transport logger it runs before any handler sees a
    record (logger filters apply to records logged on that logger): an allow-listed
    request/response record has its ``httpRequest``/``httpResponse``/``metadata`` extras
    replaced in place by the sanitized view (also kept as ``record.gcp_wire``), a WARNING+
    record has its message scrubbed, and anything else is dropped.  So even a handler someone
    attaches straight to a ``google`` logger only ever sees sanitized records.

    As a *handler* on the ``google`` logger it forwards sanitized wire records to
    ``proxy_operator.gcp.wire`` at DEBUG and WARNING+ messages to ``proxy_operator.gcp.sdk``.

    Attributes:
        enabled: let compute request/response records through.
        full_payloads: keep long payload strings.
        hosts: allowed ``(hostname, port)`` API endpoints.
    """

    def __init__(self) -> None:
        logging.Handler.__init__(self, level=logging.DEBUG)
        self.enabled = False
        self.full_payloads = False
        self.hosts: set[tuple[str, int]] = set()
        self._wire = logging.getLogger(WIRE_LOGGER)
        self._sdk = logging.getLogger(SDK_LOGGER)

    # -- filter: at the source ---------------------------------------------------------
    def filter(self, record: logging.LogRecord) -> bool:
        """Sanitize ``record`` in place and keep it, or drop it (return False); never raises."""
        try:
            if getattr(record, "gcp_sanitized", False):
                return True
            if record.levelno >= logging.WARNING:
                record.msg, record.args = scrub_text(record.getMessage()), ()
                for attr in ("httpRequest", "httpResponse", "metadata", "request", "response",
                             "credentialsInfo"):
                    if hasattr(record, attr):
                        setattr(record, attr, REDACTED)
                record.gcp_sanitized = True
                return True
            if not (self.enabled and _TRANSPORT.match(record.name)):
                return False
            entry = self.wire_entry(record)
            if entry is None:
                return False
            record.msg, record.args = "gcp wire %s %s", (entry["direction"], entry["rpc"])
            record.httpRequest = entry if entry["direction"] == "request" else None
            record.httpResponse = entry if entry["direction"] == "response" else None
            record.metadata = entry["headers"]
            record.gcp_wire = entry
            record.gcp_sanitized = True
            return True
        except Exception:  # noqa: BLE001 - a log path must never fail the call; drop on doubt
            return False

    # -- handler: the way out ----------------------------------------------------------
    def emit(self, record: logging.LogRecord) -> None:
        """Forward a sanitized record to our loggers; drop anything else (never raises)."""
        try:
            if not getattr(record, "gcp_sanitized", False) and not self.filter(record):
                return
            if record.levelno >= logging.WARNING:
                self._sdk.log(record.levelno, "%s: %s", record.name, record.getMessage())
            elif (entry := getattr(record, "gcp_wire", None)) is not None:
                self._wire.debug("gcp wire %s %s %s", entry["direction"], entry["rpc"],
                                 json.dumps(entry, sort_keys=True, default=str), extra={"gcp_wire": entry})
        except Exception:  # noqa: BLE001 - a log path must never fail the call, nor print the record
            pass

    def wire_entry(self, record: logging.LogRecord) -> dict[str, Any] | None:
        """Return the sanitized view of one transport record, or ``None`` to drop it."""
        rpc = str(getattr(record, "rpcName", "?"))
        service = str(getattr(record, "serviceName", "?"))
        request = getattr(record, "httpRequest", None)
        response = getattr(record, "httpResponse", None)
        if isinstance(request, dict):
            url = str(request.get("requestUrl") or "")
            if endpoint_host(url) not in self.hosts:
                return None
            return {"direction": "request", "service": service, "rpc": rpc,
                    "method": str(request.get("requestMethod") or ""), "url": scrub_text(url),
                    "headers": sanitize_headers(request.get("headers")),
                    "payload": sanitize_payload(request.get("payload"), full_payloads=self.full_payloads)}
        if isinstance(response, dict):
            return {"direction": "response", "service": service, "rpc": rpc,
                    "status": response.get("status"),
                    "headers": sanitize_headers(response.get("headers")),
                    "payload": sanitize_payload(response.get("payload"), full_payloads=self.full_payloads)}
        return None


# Not app.lazy.per_process: a forked child inherits this bridge on the `google` logger tree (one per PID would
# add a second).
_lock = threading.Lock()
_bridge: WireBridge | None = None
_warned = False
_COMPUTE_LOGGER = re.compile(r"^google\.cloud\.compute_v1\.services\.[a-z0-9_]+\.(client|transports\.rest)$")
#: google-auth and oauth2 log token exchanges at DEBUG: keep them from even making records.
_QUIET = ("google", "google.auth", "google.oauth2")


def _truthy(name: str) -> bool:
    return os.environ.get(name, "").strip().lower() in ("1", "true", "yes", "on")


def bridge() -> WireBridge:
    """Install (idempotently) and return the process's :class:`WireBridge`.

    * handler on the ``google`` logger, which stops propagating (the SDK does the same);
    * filter on every compute client and REST transport logger that exists (importing
      ``google.cloud.compute_v1`` creates them all);
    * ``google``, ``google.auth`` and ``google.oauth2`` at INFO unless set lower by us, so
      token exchanges are never turned into DEBUG records;
    * ``GOOGLE_SDK_PYTHON_LOGGING_SCOPE`` removed from the environment.
    """
    global _bridge
    with _lock:
        if _bridge is None:
            _bridge = WireBridge()
        root = logging.getLogger(_SDK_ROOT)
        if _bridge not in root.handlers:
            root.addHandler(_bridge)
        root.propagate = False
        for name in _QUIET:
            logging.getLogger(name).setLevel(logging.INFO)
        for name, logger in list(logging.root.manager.loggerDict.items()):
            if isinstance(logger, logging.Logger) and _COMPUTE_LOGGER.match(name) and _bridge not in logger.filters:
                logger.addFilter(_bridge)
        if os.environ.pop(SDK_SCOPE_ENV, None) is not None:
            logging.getLogger(SDK_LOGGER).warning(
                "%s removed from the environment: it would print raw Compute API payloads "
                "(including user-data); use the gcp provider's wireLogging instead", SDK_SCOPE_ENV)
        return _bridge


def disable() -> None:
    """Switch wire logging off again for the whole process (forget hosts and full payloads).

    The bridge stays installed, so the ``google`` tree still only lets sanitized warnings out.
    """
    global _warned
    b = bridge()
    with _lock:
        b.enabled = False
        b.full_payloads = False
        b.hosts.clear()
        logging.getLogger(_COMPUTE).setLevel(logging.INFO)
        _warned = False


def configure(*, enabled: bool, full_payloads: bool, api_endpoint: str | None) -> bool:
    """Install the bridge and switch wire logging on for ``api_endpoint`` if asked for.

    Call before building SDK clients (the SDK reads its logger level per call).

    Args:
        enabled: the provider's ``wireLogging.enabled`` (or-ed with env ``PROXY_OPERATOR_GCP_WIRE_LOG``).
        full_payloads: ``wireLogging.fullPayloads`` (or-ed with env
            ``PROXY_OPERATOR_GCP_WIRE_LOG_FULL_PAYLOADS``); sticky once any provider asks.
        api_endpoint: the provider's API endpoint, or ``None`` for the public one; added to
            the allow-list of hosts.
    Returns:
        whether wire records are now forwarded for this provider.
    """
    global _warned
    b = bridge()
    active = (enabled or _truthy(ENV_ENABLE)) and logging.getLogger(WIRE_LOGGER).isEnabledFor(logging.DEBUG)
    with _lock:
        compute = logging.getLogger(_COMPUTE)
        if active:
            b.enabled = True
            b.full_payloads = b.full_payloads or full_payloads or _truthy(ENV_FULL_PAYLOADS)
            b.hosts.add(endpoint_host(api_endpoint or DEFAULT_API_ENDPOINT))
            compute.setLevel(logging.DEBUG)
        elif not b.enabled:
            # Keep the transports from even building DEBUG payloads.
            compute.setLevel(logging.INFO)
        first = active and not _warned
        _warned = _warned or active
    if first:
        logging.getLogger(WIRE_LOGGER).warning(
            "GCP wire logging is on: redacted Compute API request/response records are logged "
            "at DEBUG on %s (user-data, tokens and JWTs removed; long strings %s)", WIRE_LOGGER,
            "kept" if b.full_payloads else f"over {MAX_STRING_BYTES} bytes elided")
    return active
