"""Image resolution and the per-host image cache in the storage pool.

A Proxy's ``spec.placement.image`` is a key of the config's ``images`` map or, only when the
provider sets ``allowImageURLs``, an ``http(s)`` URL on one of its hosts that carries the
image's digest as ``#sha256=<64 hex>`` (docs/security.md: a Proxy author must not make
the hypervisor boot whatever an arbitrary URL serves).  Each host caches it in its pool as
``base-<key>.<format>``:

* the download is streamed straight into the volume (``virStorageVolUpload``) through a
  SHA-256 tee; a mismatch deletes the volume (Permanent: the configured checksum is wrong or
  the URL serves something else);
* only after verification is a marker volume ``base-<key>.<format>.sha256-<hex>`` written, so
  an interrupted upload is never mistaken for a cached image;
* the image is fetched again when its marker is missing or names another checksum than the
  configured one;
* a base that some other VM's overlay still uses is never replaced (the running VM would
  read a different disk): that create fails Transient with reason ``ImageInUse`` until those
  VMs are gone.  Rolling to a new image is done with a new image key.

URL images are verified like configured ones (the digest of the fragment); their key is
``url-`` + the first 16 hex characters of that digest, so one content is cached once.  Their
download follows redirects by hand, each one only to an allowed host, and is cut at
``allowImageURLs.maxSize`` (Permanent): no redirect to an internal address, no pool filled.
"""

from __future__ import annotations

import hashlib
import logging
import re
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any
from urllib.parse import urljoin, urlsplit

import libvirt
import requests

from app.errors import NotFound, Permanent, SpecNotAllowed, Transient
from app.providers.kvm.config import ImageSettings, KvmSettings
from app.providers.kvm.domain import backing_path, volume_xml
from app.providers.kvm.link import HostLink

log = logging.getLogger("proxy_operator.kvm.images")

_CHUNK = 1 << 20
#: Redirects a URL image's download may follow (each to an allowed host).
MAX_REDIRECTS = 5
_FRAGMENT_SHA256 = re.compile(r"^sha256=([0-9a-fA-F]{64})$")


class ImageInUse(Transient):
    """The cached base must be re-fetched but other VMs' overlays still use it."""

    reason = "ImageInUse"


def resolve(settings: KvmSettings, image: str | None) -> ImageSettings:
    """Return the image a Proxy asks for.

    Args:
        settings: the provider's settings.
        image: ``spec.placement.image``: a configured key; an ``http(s)`` URL ending in
            ``#sha256=<64 hex>`` on a host of ``allowImageURLs.hosts`` (only when that is set);
            or ``None`` (allowed when exactly one image is configured).
    Returns:
        the configured :class:`ImageSettings`, or one built for the URL (its fragment removed,
        ``sha256`` from the fragment, ``allowed_hosts`` and ``max_bytes`` from
        ``allowImageURLs``, format ``raw`` for a path ending ``.raw`` else ``qcow2``, UEFI).
    Raises:
        SpecNotAllowed: (Permanent, naming ``spec.placement.image``) an unknown key, a URL while
            URLs are not allowed, a URL on another host, without its digest, or not http(s);
            no image given with zero or several configured.
    """
    field = "spec.placement.image"
    configured = ", ".join(sorted(settings.images)) or "none"
    if image is None or image == "":
        if len(settings.images) == 1:
            return next(iter(settings.images.values()))
        raise SpecNotAllowed(field, f"required: the provider's configured images are {configured}")
    if image in settings.images:
        return settings.images[image]
    parts = urlsplit(image)
    shown = redacted(image) if parts.netloc else repr(image)  # never log a URL's userinfo or query
    if parts.scheme not in ("http", "https") or not parts.netloc:
        raise SpecNotAllowed(field, f"{shown} is not a configured image ({configured})")
    urls = settings.image_urls
    if urls is None:
        raise SpecNotAllowed(field, f"{shown} is a URL, and this provider takes only its configured images "
                                    f"({configured}; kvm.allowImageURLs is not set)")
    host = (parts.hostname or "").lower()
    if host not in urls.hosts:
        raise SpecNotAllowed(field, f"{shown}: host {host!r} is not in kvm.allowImageURLs.hosts "
                                    f"({', '.join(urls.hosts)})")
    m = _FRAGMENT_SHA256.match(parts.fragment)
    if not m:
        raise SpecNotAllowed(field, f"{shown}: a URL image must end with #sha256=<64 hex digits> "
                                    "(the SHA-256 of the image file)")
    digest = m.group(1).lower()
    fmt = "raw" if parts.path.lower().endswith(".raw") else "qcow2"
    return ImageSettings(key="url-" + digest[:16], url=image.split("#", 1)[0], sha256=digest, format=fmt,
                         firmware="uefi", allowed_hosts=urls.hosts, max_bytes=urls.max_bytes)


def base_name(img: ImageSettings) -> str:
    """Return the cached volume's name: ``base-<key>.<format>``."""
    return f"base-{img.key}.{img.format}"


def marker_prefix(img: ImageSettings) -> str:
    """Return the prefix of the marker volume names of ``img``."""
    return base_name(img) + ".sha256-"


def redacted(url: str) -> str:
    """Return ``url`` without userinfo, query or fragment (signed URLs carry tokens there)."""
    p = urlsplit(url)
    host = p.hostname or ""
    if p.port:
        host = f"{host}:{p.port}"
    return f"{p.scheme}://{host}{p.path}"


def _scrubbed(exc: Exception, url: str) -> Exception:
    """Return a stand-in for ``exc`` whose text carries no URL userinfo or query string.

    requests puts the request path and query in its messages ("Max retries exceeded with url:
    /img.qcow2?X-Goog-Signature=..."), and the classified error's message and cause reach the
    Proxy's conditions and the logs.  The stand-in keeps the class name and the rest of the text.
    """
    text = str(exc).replace(url, redacted(url))
    text = re.sub(r"\?[^\s'\")]*", "?<redacted>", text)
    text = re.sub(r"//[^/@\s]*@", "//", text)
    return type(exc.__class__.__name__, (RuntimeError,), {})(text)


@dataclass(frozen=True)
class CachedImage:
    """A verified base volume: its libvirt handle, path and capacity (bytes)."""

    volume: libvirt.virStorageVol
    path: str
    capacity: int


def ensure_base(link: HostLink, pool: libvirt.virStoragePool, pool_name: str, *, img: ImageSettings,
                own_volumes: set[str], timeout: float) -> CachedImage:
    """Return the verified base of ``img`` in ``pool``, fetching it if needed.

    Args:
        link: the host's link.
        pool: the storage pool (from ``link``).
        pool_name: its name (for traces).
        img: the resolved image.
        own_volumes: volume names of the VM being created; they are not "other users" of a
            stale base (they are deleted with it and recreated).
        timeout: seconds for the download+upload.
    Raises:
        ImageInUse: the base must be re-fetched but other overlays use it.
        Permanent: HTTP 4xx, or the checksum does not match.
        Transient: network trouble, truncated download, libvirt errors.
    """
    names = volume_names(link, pool, pool_name)
    base = base_name(img)
    prefix = marker_prefix(img)
    markers = {n for n in names if n.startswith(prefix)}
    wanted = prefix + img.sha256 if img.sha256 else None
    if base in names and ((wanted and wanted in markers) or (not wanted and markers)):
        return _cached(link, pool, pool_name, base)
    if base in names:
        _replaceable(link, pool, pool_name, base, names - {base} - markers, own_volumes)
        for name in sorted(markers | (own_volumes & names)):
            delete_volume(link, pool, pool_name, name=name)
        delete_volume(link, pool, pool_name, name=base)
        reason = "its marker is missing" if not markers else "the configured checksum changed"
        log.info("kvm host %s: re-fetching %s: %s", link.host.name, base, reason)
    else:
        for name in sorted(markers):
            delete_volume(link, pool, pool_name, name=name)
    digest = _fetch(link, pool, pool_name, base, img, timeout)
    marker = prefix + digest
    xml = volume_xml(marker, 0, "raw")
    try:
        link.call("virStorageVolCreateXML", lambda c: pool.createXML(xml, 0), pool=pool_name, volume=marker)
    except Transient:
        if marker not in volume_names(link, pool, pool_name):
            raise
    return _cached(link, pool, pool_name, base)


def volume_names(link: HostLink, pool: libvirt.virStoragePool, pool_name: str) -> set[str]:
    """Return the names of every volume in ``pool``, read in one RPC.

    ``virStoragePoolListAllVolumes``, not ``listVolumes``: libvirt-python's ``listVolumes``
    asks for the count (``virStoragePoolNumOfVolumes``) and then for that many names, so a
    volume created between the two calls (another create's overlay) pushes an existing name
    out of the answer — seen here as a base image's marker "missing" while two creates
    shared one base. libvirt's API documentation discourages the old list calls for this race.
    """
    vols = link.call("virStoragePoolListAllVolumes", lambda c: pool.listAllVolumes(0), pool=pool_name)
    return {vol.name() for vol in vols}


def _cached(link: HostLink, pool: libvirt.virStoragePool, pool_name: str, base: str) -> CachedImage:
    vol = link.call("virStorageVolLookupByName", lambda c: pool.storageVolLookupByName(base),
                    pool=pool_name, volume=base)
    path = link.call("virStorageVolGetPath", lambda c: vol.path(), volume=base)
    capacity = link.call("virStorageVolGetInfo", lambda c: vol.info()[1], volume=base)
    return CachedImage(vol, path, capacity)


def _replaceable(link: HostLink, pool: libvirt.virStoragePool, pool_name: str, base: str,
                 candidates: set[str], own_volumes: set[str]) -> None:
    """Raise :class:`ImageInUse` when a volume other than ``own_volumes`` is backed by ``base``."""
    base_vol = link.call("virStorageVolLookupByName", lambda c: pool.storageVolLookupByName(base),
                         pool=pool_name, volume=base)
    base_path = link.call("virStorageVolGetPath", lambda c: base_vol.path(), volume=base)
    users = []
    for name in sorted(candidates - own_volumes):
        try:
            vol = link.call("virStorageVolLookupByName", lambda c, n=name: pool.storageVolLookupByName(n),  # type: ignore[misc]  # defaults bind this iteration's values
                            pool=pool_name, volume=name)
            xml = link.call("virStorageVolGetXMLDesc", lambda c, v=vol: v.XMLDesc(0), volume=name, trace_result=True)  # type: ignore[misc]  # defaults bind this iteration's values
        except NotFound:
            continue
        if backing_path(xml) == base_path:
            users.append(name)
    if users:
        raise ImageInUse(f"kvm host {link.host.name}: {base} must be re-fetched (its marker is missing or the "
                         f"configured checksum changed) but {len(users)} overlay(s) still use it "
                         f"({', '.join(users[:5])}{', ...' if len(users) > 5 else ''}); it is replaced once "
                         f"they are deleted. To roll out a new image while old VMs run, add it under a new key.")


def delete_volume(link: HostLink, pool: libvirt.virStoragePool, pool_name: str, *, name: str) -> None:
    """Delete volume ``name``; a missing volume is fine."""
    try:
        vol = link.call("virStorageVolLookupByName", lambda c: pool.storageVolLookupByName(name),
                        pool=pool_name, volume=name)
        link.call("virStorageVolDelete", lambda c: vol.delete(0), pool=pool_name, volume=name)
    except NotFound:
        pass


def _http_error(img: ImageSettings, status: int) -> Exception:
    msg = f"image {img.key}: GET {redacted(img.url)} answered HTTP {status}"
    if status in (408, 429) or status >= 500:
        return Transient(msg)
    return Permanent(msg)


def _get(img: ImageSettings) -> requests.Response:
    """Send the GET of ``img`` and return the (streamed) final response.

    A configured image follows redirects as requests does.  A URL image (``allowed_hosts`` set)
    follows at most :data:`MAX_REDIRECTS` redirects by hand, each only to an ``http(s)`` URL on
    an allowed host, so a redirect cannot point the hypervisor's operator at an internal address.

    Raises:
        Permanent: a redirect off the allowed hosts, or too many redirects.
        Transient: network errors (their text scrubbed of userinfo and query strings).
    """
    url = img.url
    for _ in range(MAX_REDIRECTS + 1):
        try:
            resp = requests.get(url, stream=True, timeout=(10, 60), allow_redirects=img.allowed_hosts is None)
        except requests.RequestException as exc:
            cause = _scrubbed(exc, url)
            raise Transient(f"image {img.key}: GET {redacted(url)}: {type(exc).__name__}: {cause}") from cause
        if img.allowed_hosts is None or not resp.is_redirect:
            return resp
        location = urljoin(url, resp.headers.get("Location", ""))
        resp.close()
        parts = urlsplit(location)
        if parts.scheme not in ("http", "https") or (parts.hostname or "").lower() not in img.allowed_hosts:
            raise Permanent(f"image {img.key}: GET {redacted(url)} redirects to {redacted(location)}, "
                            f"off kvm.allowImageURLs.hosts ({', '.join(img.allowed_hosts)})")
        url = location
    raise Permanent(f"image {img.key}: GET {redacted(img.url)}: more than {MAX_REDIRECTS} redirects")


def _fetch(link: HostLink, pool: libvirt.virStoragePool, pool_name: str, base: str, img: ImageSettings,
           timeout: float) -> str:
    """Stream ``img`` into a new volume ``base``; return the verified hex digest.

    Raises:
        Permanent: HTTP 4xx, a checksum mismatch, a download larger than ``img.max_bytes``
            (announced or counted), a redirect off the allowed hosts.
        Transient: network trouble, a truncated download, libvirt errors.
    """
    source = redacted(img.url)
    resp = _get(img)
    with resp:
        if resp.status_code != 200:
            raise _http_error(img, resp.status_code)
        length = int(resp.headers.get("Content-Length") or 0)
        if img.max_bytes is not None and length > img.max_bytes:
            raise Permanent(f"image {img.key}: {source} is {length} bytes, over kvm.allowImageURLs.maxSize "
                            f"({img.max_bytes} bytes)")
        xml = volume_xml(base, 0, "raw")
        vol = link.call("virStorageVolCreateXML", lambda c: pool.createXML(xml, 0),
                        pool=pool_name, volume=base, xml=xml)

        def upload(conn: libvirt.virConnect) -> tuple[str, int]:
            digest = hashlib.sha256()
            total = 0
            with upload_stream(conn, vol, 0) as stream:
                try:
                    for chunk in resp.iter_content(_CHUNK):
                        digest.update(chunk)
                        total += len(chunk)
                        if img.max_bytes is not None and total > img.max_bytes:
                            raise Permanent(f"image {img.key}: download from {source} passed "
                                            f"kvm.allowImageURLs.maxSize ({img.max_bytes} bytes); cut")
                        send_all(stream, chunk)
                except requests.RequestException as exc:
                    cause = _scrubbed(exc, img.url)
                    raise Transient(f"image {img.key}: download from {source} broke after {total} bytes: "
                                    f"{type(exc).__name__}: {cause}") from cause
                if length and total != length:
                    raise Transient(f"image {img.key}: download from {source} ended after {total} of "
                                    f"{length} bytes")
                if img.sha256 and digest.hexdigest() != img.sha256:
                    who = "the config" if img.allowed_hosts is None else "spec.placement.image"
                    raise Permanent(f"image {img.key}: SHA-256 of {source} is {digest.hexdigest()}, "
                                    f"{who} says {img.sha256}")
            return digest.hexdigest(), total

        try:
            hexdigest, total = link.call("virStorageVolUpload", upload, timeout=timeout,
                                         pool=pool_name, volume=base, source=source)
        except BaseException:
            try:
                delete_volume(link, pool, pool_name, name=base)
            except Exception as exc:  # noqa: BLE001 - the missing marker keeps it from being used
                log.warning("kvm host %s: could not remove the partial %s: %s", link.host.name, base, exc)
            raise
    log.info("kvm host %s: cached %s (%d bytes, sha256 %s) from %s", link.host.name, base, total, hexdigest, source)
    return hexdigest


@contextmanager
def upload_stream(conn: libvirt.virConnect, vol: libvirt.virStorageVol, length: int) -> Iterator[libvirt.virStream]:
    """Open a stream uploading into ``vol`` (``length`` bytes; 0 = up to the volume's end).

    The stream is finished when the block ends and aborted when it raises (libvirt requires
    one or the other before the stream is released; an abort that fails is ignored so the
    block's own error is the one raised).
    """
    stream = conn.newStream(0)
    vol.upload(stream, 0, length, 0)
    try:
        yield stream
        stream.finish()
    except BaseException:
        try:
            stream.abort()
        except libvirt.libvirtError:
            pass
        raise


def send_all(stream: libvirt.virStream, data: bytes) -> None:
    """Send all of ``data`` on a blocking libvirt stream."""
    view = memoryview(data)
    while view:
        sent = stream.send(bytes(view))
        if sent < 0:
            raise Transient(f"libvirt stream send failed ({sent})")
        view = view[sent:]


def upload_bytes(link: HostLink, vol: libvirt.virStorageVol, data: bytes, **ids: Any) -> None:
    """Upload ``data`` into ``vol`` (one traced ``virStorageVolUpload``; the body is never logged)."""
    def upload(conn: libvirt.virConnect) -> None:
        with upload_stream(conn, vol, len(data)) as stream:
            for i in range(0, len(data), _CHUNK):
                send_all(stream, data[i:i + _CHUNK])

    link.call("virStorageVolUpload", upload, bytes=len(data), **ids)
