"""libvirt errors onto the provider taxonomy, and the dial-stage errors.

libvirt reports every failure as ``libvirt.libvirtError`` carrying a numeric code
(``virErrorNumber``, https://libvirt.org/html/libvirt-virterror.html).  :func:`classify_libvirt`
maps the code onto :mod:`app.errors` and keeps the original as ``__cause__``.  Whether
the *link* must be dropped is a separate question answered by the pool from the connection's
liveness, never from the class: an error that already carries a taxonomy class is a local
verdict and says nothing about the link.
"""

from __future__ import annotations

import libvirt

from app.errors import NotFound, Permanent, ProviderError, QuotaExceeded, Transient

#: Dial stages, in order ("Dial errors say their stage").
STAGE_MATERIAL = "SSH material"
STAGE_TCP = "TCP"
STAGE_HANDSHAKE = "SSH handshake"
STAGE_LIBVIRT = "libvirt connect"

_LEVEL_NAMES = {"VIR_ERR_NONE", "VIR_ERR_WARNING", "VIR_ERR_ERROR"}
#: libvirt error code -> public name (``42 -> "VIR_ERR_NO_DOMAIN"``).
CODE_NAMES: dict[int, str] = {
    getattr(libvirt, n): n for n in dir(libvirt)
    if n.startswith("VIR_ERR_") and n not in _LEVEL_NAMES and isinstance(getattr(libvirt, n), int)
}

_NOT_FOUND = {
    libvirt.VIR_ERR_NO_DOMAIN, libvirt.VIR_ERR_NO_STORAGE_VOL, libvirt.VIR_ERR_NO_STORAGE_POOL,
    libvirt.VIR_ERR_NO_NETWORK, libvirt.VIR_ERR_NO_DOMAIN_METADATA,
}
_PERMANENT = {
    libvirt.VIR_ERR_XML_ERROR, libvirt.VIR_ERR_XML_DETAIL, libvirt.VIR_ERR_CONFIG_UNSUPPORTED,
    libvirt.VIR_ERR_INVALID_ARG, libvirt.VIR_ERR_NO_SUPPORT, libvirt.VIR_ERR_OPERATION_UNSUPPORTED,
    libvirt.VIR_ERR_ARGUMENT_UNSUPPORTED, libvirt.VIR_ERR_OPERATION_DENIED,
    libvirt.VIR_ERR_NO_SECURITY_MODEL,
}
#: Messages that mean the host ran out of a resource: retry after a long backoff.
_EXHAUSTED = ("No space left on device", "Cannot allocate memory", "Disk quota exceeded")


class DialError(Transient):
    """The link to a host could not be established (a Transient error naming its stage).

    Attributes:
        stage: one of :data:`STAGE_MATERIAL`, :data:`STAGE_TCP`, :data:`STAGE_HANDSHAKE`,
            :data:`STAGE_LIBVIRT`.
        host: host name from the config.
    """

    reason = "HostUnreachable"

    def __init__(self, host: str, stage: str, message: str) -> None:
        super().__init__(f"kvm host {host}: {stage}: {message}")
        self.host, self.stage = host, stage


class BadSSHMaterial(Permanent):
    """The SSH key file exists but cannot be used (unparsable, a public key, encrypted).

    Attributes:
        stage: always :data:`STAGE_MATERIAL`.
        host: host name from the config.
    """

    reason = "BadSSHMaterial"

    def __init__(self, host: str, message: str) -> None:
        super().__init__(f"kvm host {host}: {STAGE_MATERIAL}: {message}")
        self.host, self.stage = host, STAGE_MATERIAL


def code_of(exc: BaseException) -> int | None:
    """Return the libvirt error code of ``exc`` (or of its cause), else ``None``."""
    for e in (exc, exc.__cause__):
        if isinstance(e, libvirt.libvirtError):
            return e.get_error_code()
    return None


def code_name(code: int | None) -> str:
    """Return the public name of a libvirt error code (``"VIR_ERR_NO_DOMAIN"``), ``""`` for ``None``."""
    if code is None:
        return ""
    return CODE_NAMES.get(code, f"VIR_ERR_{code}")


def classify_libvirt(exc: libvirt.libvirtError, what: str) -> ProviderError:
    """Return the taxonomy error for a libvirt failure, with ``exc`` as its cause.

    Args:
        exc: the libvirt error.
        what: what was being done, for the message (``"virDomainCreate proxy-abc"``).
    Returns:
        :class:`NotFound` for a missing domain/volume/pool/network/metadata;
        :class:`QuotaExceeded` when the host is out of disk or memory;
        :class:`Permanent` for invalid XML, unsupported configuration, invalid arguments,
        denied operations; :class:`Transient` otherwise (unclassified is Transient).
    """
    code = exc.get_error_code()
    text = exc.get_error_message() or str(exc)
    message = f"{what}: {text} ({code_name(code)})"
    if code in _NOT_FOUND:
        err: ProviderError = NotFound(message)
    elif any(marker in text for marker in _EXHAUSTED):
        err = QuotaExceeded(message)
    elif code in _PERMANENT:
        err = Permanent(message)
    else:
        err = Transient(message)
    err.__cause__ = exc
    return err
