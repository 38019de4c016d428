"""The ``gcp:`` block of a providers-config entry (no SDK import here)."""

from __future__ import annotations

from dataclasses import dataclass, field

from app.validation import Reader


@dataclass(frozen=True)
class GcpSettings:
    """Settings of a gcp provider.

    Attributes:
        project: GCP project ID (required).
        zones: zones to spread instances over when a Proxy names none.
        machine_type: default machine type.
        image: default boot image (a full image or image-family URL).
        credentials_file: service-account key file, or ``None`` for Application Default Credentials.
    """

    project: str
    zones: tuple[str, ...] = field(default_factory=tuple)
    machine_type: str = "e2-micro"
    image: str = "projects/debian-cloud/global/images/family/debian-12"
    credentials_file: str | None = None


def parse(block: Reader) -> GcpSettings:
    """Parse the block; raises :class:`app.validation.ConfigError` naming the field."""
    return GcpSettings(
        project=block.str("project", required=True),
        zones=tuple(block.str_list("zones")),
        machine_type=block.str("machineType", "e2-micro"),
        image=block.str("image", "projects/debian-cloud/global/images/family/debian-12"),
        credentials_file=block.str("credentialsFile"),
    )
