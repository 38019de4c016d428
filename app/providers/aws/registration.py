"""The aws provider type, registered once: its config parser and constructor.

Pure at import (no boto3 import): the constructor imports the provider module when it is
called, so loading the providers config or routing a task never does.
"""

from __future__ import annotations

from app.config.provider_types import ProviderType
from app.providers.aws import config


def _build(pc):
    """Build an :class:`~app.providers.aws.provider.AwsProvider` (imports boto3; never dials)."""
    from app.providers.aws.provider import AwsProvider

    return AwsProvider(pc)


PROVIDER = ProviderType(name="aws", parse_settings=config.parse, build=_build)
