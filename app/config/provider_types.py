"""What a provider type registers: :class:`ProviderType` and :class:`HostPlacement`.

A domain module, not part of :mod:`app.providers`: the config loader (:mod:`app.config.providers`) and the
dispatcher's router (:mod:`app.dispatch.proxies`) take registered types as a parameter, and each provider
package builds its own (``PROVIDER`` in ``app/providers/<type>/registration.py``), so providers
depend on this module and never the reverse.  The composition root (:mod:`app.wiring`) lists
the registrations.  This module imports nothing from :mod:`app.providers` (an import-linter
contract in pyproject.toml).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, Protocol, runtime_checkable

if TYPE_CHECKING:
    from app.config.providers import ProviderConfig
    from app.squid.conf import SquidPolicy
    from app.config.validation import Reader


class HostPlacement(Protocol):
    """Where the instances of a sharded provider type live, known from its settings alone.

    The dispatcher routes with it (:class:`app.dispatch.proxies.Router`) without building a provider.

    * ``hosts(settings) -> list[str]`` — the configured host names, in config order.
    * ``host_for(settings, zone) -> str | None`` — the host ``spec.placement.zone`` names (the
      only host when ``zone`` is empty and exactly one is configured); ``None`` when none matches.
    * ``host_of(provider_id) -> str | None`` — the host inside a provider ID (``None`` when it
      does not parse).
    """

    def hosts(self, settings: Any) -> list[str]: ...

    def host_for(self, settings: Any, zone: str | None) -> str | None: ...

    def host_of(self, provider_id: str) -> str | None: ...


@runtime_checkable
class CheckTargets(Protocol):
    """Settings of a provider type (what its ``parse_settings`` returns) that name, from the
    config alone, the targets the provider's ``check()`` reports on.

    A settings class declares it by subclassing; :func:`app.providers.checks.expected_targets`
    tests ``isinstance(settings, CheckTargets)`` (a type whose settings do not declare it has
    no targets known up front: whatever its check reports).

    * ``check_targets() -> list[str]`` — the target names, in config order (kvm: each host;
      kubernetes: ``"cluster"``; gcp: the project).
    """

    def check_targets(self) -> list[str]: ...


@dataclass(frozen=True)
class ProviderType:
    """One provider type, registered once by its package (``PROVIDER`` in ``registration.py``).

    The composition root (:mod:`app.wiring`) lists the registered types; the config loader
    (:func:`app.config.providers.parse`) takes them for the type blocks, the registry
    (:func:`app.providers.registry.build`) their constructors, the dispatcher their placement.

    Attributes:
        name: the ``type:`` of a providers-config entry, also the key of its block.
        parse_settings: ``parse_settings(block: Reader) -> settings``, pure Python (no SDK
            import); raises :class:`app.config.validation.ConfigError` naming the field.
        build: ``build(pc: ProviderConfig) -> Provider`` (:class:`app.providers.base.Provider`);
            imports the SDK (lazily, inside the function), never dials.  Whatever it raises
            propagates out of the registry build.
        block_required: whether an entry of this type must carry its block (``kubernetes:``
            may be left out: every key has a default).
        check_entry: optional ``check_entry(settings, squid) -> (field, problem) | None``: a rule
            across the type's block and the entry's shared ``squid:`` block; the problem is
            raised as a :class:`app.config.validation.ConfigError` at ``field``.
        placement: :class:`HostPlacement` of a type whose work is split by host (kvm), else ``None``.
        replacement_keeps_ip: a new instance of this type leaves from the same egress IP as the one
            it replaces (kubernetes: Pods leave through their node's address), the default of an
            entry's ``replacementEgressIP`` (``same``; else ``new``).
    """

    name: str
    parse_settings: Callable[["Reader"], Any]
    build: Callable[["ProviderConfig"], Any]
    block_required: bool = True
    check_entry: Callable[[Any, "SquidPolicy"], tuple[str, str] | None] | None = None
    placement: HostPlacement | None = None
    replacement_keeps_ip: bool = False
