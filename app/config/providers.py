"""The providers config file: a strict list of named provider instances.

Shape::

    providers:
      - name: k8s-local          # unique, [a-z0-9]([-a-z0-9]*[a-z0-9])?
        type: kubernetes         # kubernetes | gcp | kvm | aws
        checkInterval: 1m        # optional; 0 = off; else >= 10s
        checkTimeout: 15s        # optional
        squid: {allowedSourceRanges: [...], connectPorts: [443], httpPorts: [80, 443],
                deniedDestinations: [...], allowedDestinations: [...]}   # optional
        costs: {currency: USD, onDemand: {t3.micro: 0.0104}, spot: {t3.micro: 0.0035}}   # optional
        kubernetes: {...}        # exactly the block matching ``type``
    tenancy:                     # optional (app/config/tenancy.py); default: no namespace
      externalProxyNamespaces: [crawl-ops]
      cloudInitNamespaces: [crawl-ops]

:func:`load` parses and validates the whole file or raises one :class:`ConfigError` that
names the file, the provider and the field: a process never half-starts on a bad config.
This module knows no provider type: each type's block is parsed by the
:class:`~app.config.provider_types.ProviderType` its package registers, and the caller passes the
types (the composition root, :func:`app.wiring.load_config`, passes every shipped one).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Mapping

from app.config.costs import CostTable
from app.config.costs import parse as parse_costs
from app.squid.conf import SquidPolicy, parse_policy
from app.config.tenancy import Tenancy
from app.config.tenancy import parse as parse_tenancy
from app.config.validation import IDENTIFIER, Reader, load_yaml

if TYPE_CHECKING:
    from app.config.provider_types import ProviderType

DEFAULT_CHECK_INTERVAL = 60.0
DEFAULT_CHECK_TIMEOUT = 15.0
MIN_CHECK_INTERVAL = 10.0
#: Values of an entry's ``replacementEgressIP``: whether a new instance leaves from a new egress IP
#: or the same one as the instance it replaces (:attr:`ProviderConfig.replacement_keeps_ip`).
REPLACEMENT_EGRESS_IP = ("new", "same")


@dataclass(frozen=True)
class ProviderConfig:
    """One configured provider instance.

    Attributes:
        name: unique provider name (a plain identifier).
        type: ``"kubernetes"``, ``"gcp"``, ``"kvm"`` or ``"aws"``.
        check_interval: seconds between health checks; 0 = checks off.
        check_timeout: seconds one health-check round may take.
        settings: the parsed type block (``KubernetesSettings``, ``GcpSettings``, ``KvmSettings``).
        squid: the policy rendered into every instance's squid.conf (optional ``squid:`` block).
        costs: the operator's hourly prices (optional ``costs:`` block, :mod:`app.config.costs`), or ``None``.
        replacement_keeps_ip: a new instance of this provider leaves from the same egress IP as the
            one it replaces (``replacementEgressIP: same``; the default of its type,
            :attr:`app.config.provider_types.ProviderType.replacement_keeps_ip`): a ProxyPool's
            recycle policy drains its burned members in place instead of replacing them.
    """

    name: str
    type: str
    check_interval: float
    check_timeout: float
    settings: Any
    squid: SquidPolicy = field(default_factory=SquidPolicy)
    costs: CostTable | None = None
    replacement_keeps_ip: bool = False


@dataclass(frozen=True)
class ProvidersConfig:
    """The whole providers config file.

    Attributes:
        providers: entries in file order.
        source: the file it came from (``"<empty>"`` when no file was given).
        tenancy: the ``tenancy:`` block (:class:`app.config.tenancy.Tenancy`: which namespaces may add
            External Proxies or set ``spec.cloudInit``; none when absent).
    """

    providers: tuple[ProviderConfig, ...]
    source: str = "<empty>"
    tenancy: Tenancy = field(default_factory=Tenancy)

    def names(self) -> list[str]:
        """Return the configured provider names in file order."""
        return [p.name for p in self.providers]

    def get(self, name: str) -> ProviderConfig | None:
        """Return the provider called ``name`` or ``None``."""
        for p in self.providers:
            if p.name == name:
                return p
        return None


def parse(data: Any, file: str, types: Mapping[str, "ProviderType"]) -> ProvidersConfig:
    """Validate the already-decoded YAML ``data`` of ``file``.

    Args:
        data: the decoded document (``{"providers": [...]}``).
        file: the file it came from, for messages.
        types: type name -> :class:`~app.config.provider_types.ProviderType`, in the order messages
            list them (``app.wiring.PROVIDER_TYPES``).
    Returns:
        the :class:`ProvidersConfig`; each entry's ``settings`` is what its type's
        ``parse_settings`` returned.
    Raises:
        ConfigError: the first problem found, naming ``file``, the provider and the field.
    """
    top = Reader(data, file)
    entries = top.items("providers")
    tenancy = parse_tenancy(top.child("tenancy"))
    top.done()
    seen: set[str] = set()
    result: list[ProviderConfig] = []
    for index, entry in enumerate(entries):
        name = entry.raw("name")
        label = name if isinstance(name, str) and name else f"#{index}"
        entry.provider = label
        entry.path = ""
        name = entry.str("name", required=True, pattern=IDENTIFIER)
        if name in seen:
            raise entry.error("name", "duplicate provider name")
        seen.add(name)
        ptype = entry.str("type", required=True, choices=tuple(types))
        interval = entry.duration("checkInterval", DEFAULT_CHECK_INTERVAL)
        if interval and interval < MIN_CHECK_INTERVAL:
            raise entry.error("checkInterval", f"must be 0 (off) or at least 10s, got {interval:g}s")
        timeout = entry.duration("checkTimeout", DEFAULT_CHECK_TIMEOUT)
        if not timeout:
            raise entry.error("checkTimeout", "must be greater than 0")
        for other in types:
            if other != ptype and entry.has(other):
                raise entry.error(other, f'block for type "{other}" on a provider of type "{ptype}"')
        kind = types[ptype]
        block = entry.child(ptype, required=kind.block_required)
        settings = kind.parse_settings(block)
        block.done()
        egress = entry.str("replacementEgressIP", "same" if kind.replacement_keeps_ip else "new",
                           choices=REPLACEMENT_EGRESS_IP)
        squid = parse_policy(entry.child("squid"))
        costs = parse_costs(entry.child("costs"))
        problem = kind.check_entry(settings, squid) if kind.check_entry is not None else None
        if problem is not None:
            raise entry.error(*problem)
        entry.done()
        result.append(ProviderConfig(name, ptype, interval, timeout, settings, squid, costs,
                                     replacement_keeps_ip=egress == "same"))
    return ProvidersConfig(tuple(result), file, tenancy)


def load(path: str | Path | None, types: Mapping[str, "ProviderType"]) -> ProvidersConfig:
    """Read and validate the providers config at ``path``; ``None`` means no providers.

    Args:
        types: the provider types entries may name (see :func:`parse`).
    Raises:
        ConfigError: unreadable file, bad YAML, or any validation problem (see :func:`parse`).
    """
    if path is None or str(path) == "":
        return ProvidersConfig(())
    file = str(path)
    data = load_yaml(file)
    return parse(data, file, types)
