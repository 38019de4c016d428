"""Builds the configured providers from constructors it is given.

The registry knows no concrete provider: the composition root (:mod:`app.wiring`) passes a
``{type: constructor}`` map, so adding a provider never touches this module.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any, Callable

from app.config.providers import ProviderConfig, ProvidersConfig
from app.errors import Permanent

log = logging.getLogger(__name__)

#: A constructor builds one provider from its config entry.
Constructor = Callable[[ProviderConfig], Any]


class UnknownProvider(Permanent):
    """A Proxy names a provider that is not configured."""

    reason = "UnknownProvider"


@dataclass
class Registry:
    """The built providers, by name.

    Attributes:
        providers: name -> provider as used by reconcilers (wrapped, e.g. with metrics).
        unwrapped: name -> the same provider without wrappers (health checks use these so
            they never count as provider requests).
        configs: name -> :class:`ProviderConfig`.
    """

    providers: dict[str, Any] = field(default_factory=dict)
    unwrapped: dict[str, Any] = field(default_factory=dict)
    configs: dict[str, ProviderConfig] = field(default_factory=dict)

    def get(self, name: str | None) -> Any:
        """Return the provider called ``name``.

        Raises:
            UnknownProvider: no provider of that name is configured (a Permanent error).
        """
        if not name or name not in self.providers:
            raise UnknownProvider(f"provider {name!r} is not configured (configured: "
                                  f"{', '.join(sorted(self.providers)) or 'none'})")
        return self.providers[name]

    def names(self) -> list[str]:
        """Configured provider names in config order."""
        return list(self.providers)


def build(config: ProvidersConfig, constructors: dict[str, Constructor],
          wrap: Callable[[Any, ProviderConfig], Any] | None = None) -> Registry:
    """Build every provider of ``config`` with ``constructors``.

    Args:
        config: the validated providers config.
        constructors: type name -> constructor.
        wrap: optional decorator applied to each built provider (e.g. metrics).
    Raises:
        ValueError: a provider type has no constructor (a wiring bug, not a user error).
        Exception: whatever a constructor raises; constructors must not dial anything, so
            this only happens for configuration they cannot use.
    """
    reg = Registry()
    for pc in config.providers:
        ctor = constructors.get(pc.type)
        if ctor is None:
            raise ValueError(f"no constructor wired for provider type {pc.type!r}")
        provider = ctor(pc)
        reg.unwrapped[pc.name] = provider
        reg.providers[pc.name] = wrap(provider, pc) if wrap else provider
        reg.configs[pc.name] = pc
    return reg
