"""The ``kubernetes:`` block of a providers-config entry (no SDK import here).

Shape (every key optional)::

    kubernetes:
      namespace: proxies             # default: each Proxy's own namespace
      image: ubuntu/squid@sha256:...  # the Squid image, pinned by digest; always allowed
      images: [registry.example.com/squid@sha256:...]   # other images a Proxy may name in spec.placement.image
      port: 3128
      egressNetworkPolicy: true      # keep the NetworkPolicy proxy-operator-squid-egress in every
                                     # namespace with Squid Pods (app/squid/egress.py); default true
"""

from __future__ import annotations

import logging
import re
from dataclasses import dataclass

from app.config.provider_types import CheckTargets
from app.config.validation import Reader

log = logging.getLogger(__name__)

#: Canonical's Squid image (``ubuntu/squid``), pinned by the digest of its manifest list: a tag
#: can be moved to other content, a digest cannot.  Bumping it: docs/kubernetes-provider.md.
DEFAULT_IMAGE = "ubuntu/squid@sha256:6a097f68bae708cedbabd6188d68c7e2e7a38cedd05a176e1cc0ba29e3bbe029"
#: An image reference pinned by content: ``name[:tag]@sha256:<64 hex>`` (the OCI image spec's
#: digest form, https://github.com/opencontainers/image-spec/blob/main/descriptor.md#digests).
_DIGEST = re.compile(r"@sha256:[0-9a-f]{64}$")
#: The one target the kubernetes provider's ``check()`` reports on.
CHECK_TARGET = "cluster"


@dataclass(frozen=True)
class KubernetesSettings(CheckTargets):
    """Settings of a kubernetes provider.

    Attributes:
        namespace: namespace for the Pods, or ``None`` to use each Proxy's own namespace.
        image: Squid container image (used when a Proxy names none; always allowed).
        images: further images a Proxy may ask for in ``spec.placement.image`` (exact strings);
            anything else is refused (a Proxy author must not choose what runs in the
            provider's namespace: docs/security.md).
        port: container port Squid listens on when a request carries no port.  The CRD
            defaults ``spec.endpoint.port`` to 3128, so Proxies admitted by the API server
            always carry one and this value is only a fallback (kept for the config contract).
        egress_network_policy: before creating a Pod, create (or replace) the NetworkPolicy
            :data:`app.squid.egress.NETWORK_POLICY_NAME` in its namespace, which refuses the Squid
            Pods' egress to the destinations the squid.conf refuses
            (:func:`app.squid.egress.squid_network_policy` of the entry's ``squid:`` block).
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


def pinned(image: str) -> bool:
    """Whether ``image`` names its content by a ``sha256`` digest (``name[:tag]@sha256:<hex>``)."""
    return bool(_DIGEST.search(image))


def parse(block: Reader) -> KubernetesSettings:
    """Parse the block; raises :class:`app.config.validation.ConfigError` naming the field.

    An image not pinned by digest (:func:`pinned`) is accepted with one warning naming the
    field: whoever can push that tag chooses what runs in the provider's Pods."""
    images = block.str_list("images")
    for i, image in enumerate(images):
        if any(c.isspace() for c in image):
            raise block.error(f"images[{i}]", f"{image!r} is not an image reference (contains whitespace)")
    image = block.str("image", DEFAULT_IMAGE)
    for key, ref in (("image", image), *((f"images[{i}]", ref) for i, ref in enumerate(images))):
        if not pinned(ref):
            log.warning("%s", block.error(key, f"{ref!r} is not pinned by digest (name@sha256:<hex>); "
                                               "the registry may serve other content under its tag"))
    return KubernetesSettings(
        namespace=block.str("namespace"),
        image=image,
        port=block.int("port", 3128, minimum=1, maximum=65535),
        images=tuple(images),
        egress_network_policy=block.bool("egressNetworkPolicy", True),
    )
