"""The ``kubernetes:`` block of a providers-config entry (no SDK import here).

Shape (every key optional)::

    kubernetes:
      namespace: proxies             # default: each Proxy's own namespace
      image: ubuntu/squid:latest     # the Squid image; always allowed
      images: [registry.example.com/squid:6.6]   # other images a Proxy may name in spec.placement.image
      port: 3128
      egressNetworkPolicy: true      # keep the NetworkPolicy proxy-operator-squid-egress in every
                                     # namespace with Squid Pods (app/egress.py); default true
"""

from __future__ import annotations

from dataclasses import dataclass

from app.provider_types import CheckTargets
from app.validation import Reader

DEFAULT_IMAGE = "ubuntu/squid:latest"
#: The one target the kubernetes provider's ``check()`` reports on.
CHECK_TARGET = "cluster"


@dataclass(frozen=True)
class KubernetesSettings(CheckTargets):
    """Settings of a kubernetes provider.

    Attributes:
        namespace: namespace for the Pods, or ``None`` to use each Proxy's own namespace.
        image: Squid container image (used when a Proxy names none; always allowed).
        images: further images a Proxy may ask for in ``spec.placement.image`` (exact strings);
            anything else is refused (issue 10, item 3: a Proxy author must not choose what
            runs in the provider's namespace).
        port: container port Squid listens on when a request carries no port.  The CRD
            defaults ``spec.endpoint.port`` to 3128, so Proxies admitted by the API server
            always carry one and this value is only a fallback (kept for the config contract).
        egress_network_policy: before creating a Pod, create (or replace) the NetworkPolicy
            :data:`app.egress.NETWORK_POLICY_NAME` in its namespace, which refuses the Squid
            Pods' egress to the destinations the squid.conf refuses
            (:func:`app.egress.squid_network_policy` of the entry's ``squid:`` block).
    """

    namespace: str | None = None
    image: str = DEFAULT_IMAGE
    port: int = 3128
    images: tuple[str, ...] = ()
    egress_network_policy: bool = True

    def check_targets(self) -> list[str]:
        """The one check target, :data:`CHECK_TARGET` (the cluster the Pods run in)."""
        return [CHECK_TARGET]

    def allowed_images(self) -> tuple[str, ...]:
        """Return every image a Proxy may name: ``image`` first, then ``images``."""
        return (self.image, *(i for i in self.images if i != self.image))


def parse(block: Reader) -> KubernetesSettings:
    """Parse the block; raises :class:`app.validation.ConfigError` naming the field."""
    images = block.str_list("images")
    for i, image in enumerate(images):
        if any(c.isspace() for c in image):
            raise block.error(f"images[{i}]", f"{image!r} is not an image reference (contains whitespace)")
    return KubernetesSettings(
        namespace=block.str("namespace"),
        image=block.str("image", DEFAULT_IMAGE),
        port=block.int("port", 3128, minimum=1, maximum=65535),
        images=tuple(images),
        egress_network_policy=block.bool("egressNetworkPolicy", True),
    )
