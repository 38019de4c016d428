"""The ``kubernetes:`` block of a providers-config entry (no SDK import here)."""

from __future__ import annotations

from dataclasses import dataclass

from app.validation import Reader

DEFAULT_IMAGE = "ubuntu/squid:latest"


@dataclass(frozen=True)
class KubernetesSettings:
    """Settings of a kubernetes provider.

    Attributes:
        namespace: namespace for the Pods, or ``None`` to use each Proxy's own namespace.
        image: Squid container image.
        port: container port Squid listens on when a request carries no port.  The CRD
            defaults ``spec.endpoint.port`` to 3128, so Proxies admitted by the API server
            always carry one and this value is only a fallback (kept for the config contract
            of SPEC §3).
    """

    namespace: str | None = None
    image: str = DEFAULT_IMAGE
    port: int = 3128


def parse(block: Reader) -> KubernetesSettings:
    """Parse the block; raises :class:`app.validation.ConfigError` naming the field."""
    return KubernetesSettings(
        namespace=block.str("namespace"),
        image=block.str("image", DEFAULT_IMAGE),
        port=block.int("port", 3128, minimum=1, maximum=65535),
    )
