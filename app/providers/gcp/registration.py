"""The gcp provider type, registered once: its config parser and constructor.

Pure at import (no google-cloud import): the constructor imports the provider module when it
is called, so loading the providers config or routing a task never does.
"""

from __future__ import annotations

from app.config.provider_types import ProviderType
from app.providers.gcp import config


def _build(pc):
    """Build a :class:`~app.providers.gcp.provider.GcpProvider` (imports the SDK; never dials)."""
    from app.providers.gcp.provider import GcpProvider

    return GcpProvider(pc)


PROVIDER = ProviderType(name="gcp", parse_settings=config.parse, build=_build)
