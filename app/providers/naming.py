"""Deterministic instance names and the tags that make GC possible.

Tags are provider-neutral ``{key: value}`` pairs; each provider maps them onto its own
mechanism (Pod labels, GCE labels, libvirt metadata) and back.  Both keys and values are
valid GCE label keys/values and Kubernetes label values.
"""

from __future__ import annotations

import base64
import hashlib
import re

#: Value of the managed-by tag on every instance we create.
MANAGED_BY = "proxy-operator"
#: Tag key of the managed-by marker.
TAG_MANAGED_BY = "managed-by"
#: Tag key carrying the owning Proxy's ``metadata.uid``.
TAG_PROXY_UID = "proxy-uid"
#: Tag key marking an instance its Proxy released with the skip-cleanup annotation: GC never
#: deletes an instance carrying it (the mark lives with the instance, so it survives Redis).
TAG_ABANDONED = "abandoned"
#: Value of the abandoned tag.
ABANDONED = "true"

_RFC1035 = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")


def instance_name(uid: str) -> str:
    """Return the instance name for the Proxy with UID ``uid``.

    ``"proxy-"`` + the first 16 characters of lowercase base32(sha256(uid)): 22 characters,
    a valid RFC 1035 label (letters, digits 2-7, a dash), stable across processes.

    Raises:
        ValueError: ``uid`` is empty.
    """
    if not uid:
        raise ValueError("instance_name: empty Proxy UID")
    digest = hashlib.sha256(uid.encode("utf-8")).digest()
    return "proxy-" + base64.b32encode(digest).decode("ascii").lower()[:16]


_INSTANCE_NAME = re.compile(r"^proxy-[a-z2-7]{16}$")


def is_instance_name(value: str) -> bool:
    """Return whether ``value`` has the shape of :func:`instance_name` (``proxy-`` + 16 base32 characters)."""
    return bool(_INSTANCE_NAME.match(value))


def is_rfc1035_label(value: str) -> bool:
    """Return whether ``value`` is an RFC 1035 label (lowercase, <= 63 characters)."""
    return len(value) <= 63 and bool(_RFC1035.match(value))


def tags_for(uid: str) -> dict[str, str]:
    """Return the tags every instance of the Proxy ``uid`` carries: managed-by and the Proxy UID."""
    return {TAG_MANAGED_BY: MANAGED_BY, TAG_PROXY_UID: uid}


def is_abandoned(tags: dict[str, str] | None) -> bool:
    """Return whether ``tags`` carry the abandoned mark (``abandoned=true``, see :data:`TAG_ABANDONED`)."""
    return bool(tags) and (tags or {}).get(TAG_ABANDONED) == ABANDONED
