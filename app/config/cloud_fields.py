"""Readers of the fields the cloud providers' config blocks share (gcp, aws).

Each reader takes the :class:`app.config.validation.Reader` over the block that holds the key
and raises :class:`app.config.validation.ConfigError` naming the file, provider and field.
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass
from urllib.parse import urlsplit

from app.config.validation import Reader


@dataclass(frozen=True)
class WireLogSettings:
    """SDK request/response logging of a cloud provider (its ``wire`` module).

    Attributes:
        enabled: forward each API request and response, redacted, to the provider's
            ``proxy_operator.<type>.wire`` logger at DEBUG (also on with the provider's
            ``PROXY_OPERATOR_<TYPE>_WIRE_LOG=1``).
        full_payloads: keep payload strings over 1 KiB instead of eliding them; user-data,
            tokens, keys and signatures are removed regardless.
    """

    enabled: bool = False
    full_payloads: bool = False


def wire_logging(block: Reader) -> WireLogSettings:
    """Read the optional ``wireLogging`` child (``enabled``, ``fullPayloads``; both default false).

    Args:
        block: the provider's block.
    Returns:
        :class:`WireLogSettings`.
    Raises:
        app.config.validation.ConfigError: a value that is not a boolean, or an unknown key.
    """
    wl = block.child("wireLogging")
    result = WireLogSettings(enabled=bool(wl.bool("enabled", False)),
                             full_payloads=bool(wl.bool("fullPayloads", False)))
    wl.done()
    return result


def endpoint_url(block: Reader, key: str, example: str) -> str | None:
    """Read an optional API endpoint: ``http(s)://host[:port]``, no path, query or fragment.

    Args:
        block: the block holding ``key``.
        key: the field name (e.g. ``"apiEndpoint"``).
        example: a valid URL the error message shows.
    Returns:
        the URL without a trailing ``/``, or ``None`` when ``key`` is absent.
    Raises:
        app.config.validation.ConfigError: not such a URL, or a bad port.
    """
    value = block.str(key)
    if value is None:
        return None
    parts = urlsplit(value)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise block.error(key, f"{value!r} must be a URL such as {example}")
    if parts.path not in ("", "/") or parts.query or parts.fragment:
        raise block.error(key, f"{value!r} must be scheme://host[:port] with no path")
    try:
        parts.port  # noqa: B018 - raises ValueError on a bad port
    except ValueError as exc:
        raise block.error(key, f"{value!r}: {exc}") from None
    return value.rstrip("/")


def cidr_list(block: Reader, key: str) -> tuple[str, ...]:
    """Read an optional list of CIDR ranges (IPv4 or IPv6; host bits allowed), as written.

    Args:
        block: the block holding ``key``.
        key: the field name (e.g. ``"sourceRanges"``).
    Returns:
        the ranges, empty when ``key`` is absent.
    Raises:
        app.config.validation.ConfigError: an entry that is not a CIDR range, naming ``key[i]``.
    """
    ranges = block.str_list(key)
    for i, cidr in enumerate(ranges):
        try:
            ipaddress.ip_network(cidr, strict=False)
        except ValueError as exc:
            raise block.error(f"{key}[{i}]", f"not a CIDR range: {exc}") from None
    return tuple(ranges)


def port_list(block: Reader, key: str, default: tuple[int, ...]) -> tuple[int, ...]:
    """Read a non-empty list of TCP port numbers.

    Args:
        block: the block holding ``key``.
        key: the field name (e.g. ``"ports"``).
        default: the ports when ``key`` is absent.
    Returns:
        the ports (1..65535).
    Raises:
        app.config.validation.ConfigError: not a non-empty list, or an entry that is not an
            integer in 1..65535, naming ``key[i]``.
    """
    ports = block.raw(key, list(default))
    if not isinstance(ports, list) or not ports:
        raise block.error(key, "must be a non-empty list of port numbers")
    for i, port in enumerate(ports):
        if isinstance(port, bool) or not isinstance(port, int) or not 1 <= port <= 65535:
            raise block.error(f"{key}[{i}]", f"must be a port number 1..65535, got {port!r}")
    return tuple(ports)
