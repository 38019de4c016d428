"""The per-host image cache in the storage pool, over SSH against the real daemon."""

from __future__ import annotations

import hashlib

import pytest

from app.errors import Permanent, SpecNotAllowed, Transient
from app.providers.kvm.images import ImageInUse, resolve
from app.providers.kvm.config import ImageSettings

pytestmark = pytest.mark.timeout(120)


def _sha(path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_refetch_on_checksum_change_never_while_in_use_and_on_missing_marker(rig, make_provider, image,
                                                                               request_for, harness_qcow2):
    path, url, sha1, _ = image("16M")
    pool = rig.daemon.pool_dir
    base = pool / "base-roll.qcow2"
    old = make_provider(rig.entry(images={"roll": {"url": url, "sha256": sha1}}))
    first = old.create(request_for(image="roll"))
    assert rig.images.gets[path] == 1 and _sha(base) == sha1

    # The image at the URL changes and the config follows with the new checksum.
    data2 = harness_qcow2("24M")
    _, sha2 = rig.images.put(path, data2)
    new = make_provider(rig.entry(images={"roll": {"url": url, "sha256": sha2}}))
    second = request_for(image="roll")
    with pytest.raises(ImageInUse) as err:
        new.create(second)
    assert isinstance(err.value, Transient) and err.value.reason == "ImageInUse"
    assert f"{first.name}.qcow2" in str(err.value)
    assert rig.images.gets[path] == 1, "nothing fetched while the base is in use"
    assert _sha(base) == sha1, "the in-use base is untouched"
    assert (pool / f"base-roll.qcow2.sha256-{sha1}").exists()
    assert not (pool / f"{second.name}.qcow2").exists()

    old.delete(first.provider_id)
    created = new.create(second)
    assert rig.images.gets[path] == 2
    assert _sha(base) == sha2
    assert (pool / f"base-roll.qcow2.sha256-{sha2}").exists()
    assert not (pool / f"base-roll.qcow2.sha256-{sha1}").exists()
    new.delete(created.provider_id)

    # A missing marker (e.g. an upload cut short) means the base is fetched again.
    link = new.link("h1")
    link.call("virStorageVolDelete", lambda c: c.storagePoolLookupByName("default")
              .storageVolLookupByName(f"base-roll.qcow2.sha256-{sha2}").delete(0))
    third = new.create(request_for(image="roll"))
    assert rig.images.gets[path] == 3
    assert (pool / f"base-roll.qcow2.sha256-{sha2}").exists()
    new.delete(third.provider_id)


def test_checksum_mismatch_is_permanent_leaves_nothing_and_keeps_the_link(rig, make_provider, image, request_for):
    path, url, sha, _ = image()
    provider = make_provider(rig.entry(images={"wrong": {"url": url, "sha256": "0" * 64}}))
    with pytest.raises(Permanent, match=f"SHA-256 of .* is {sha}, the config says 0000"):
        provider.create(request_for(image="wrong"))
    pool = rig.daemon.pool_dir
    assert not (pool / "base-wrong.qcow2").exists()
    assert not list(pool.glob("base-wrong.qcow2.sha256-*"))
    provider.check_host("h1")
    assert provider.link("h1").dials == 1, "a classified error is a local verdict: the link stays"


def test_http_errors_are_classified(rig, make_provider, request_for):
    url = f"http://127.0.0.1:{rig.images.port}/images/missing.qcow2"
    provider = make_provider(rig.entry(images={"gone": {"url": url, "sha256": "1" * 64}}))
    with pytest.raises(Permanent, match="HTTP 404"):
        provider.create(request_for(image="gone"))
    dead = make_provider(rig.entry(images={"gone": {"url": "http://127.0.0.1:9/x.qcow2", "sha256": "1" * 64}}))
    with pytest.raises(Transient, match="GET http://127.0.0.1:9/x.qcow2"):
        dead.create(request_for(image="gone"))


def url_entry(rig, **limits):
    """A kvm entry that lets Proxies name images by URL on the rig's image server (127.0.0.1)."""
    return rig.entry(allowImageURLs={"hosts": ["127.0.0.1"], **limits})


def unique_image(rig, image, size: str = "16M"):
    """Like the ``image`` fixture, with bytes no other test serves: URL images are cached by
    digest, and qemu-img makes identical empty images (trailing bytes do not bother qcow2)."""
    import uuid
    _, _, _, data = image(size)
    data += uuid.uuid4().bytes * 64
    path = f"/images/{uuid.uuid4().hex}.qcow2"
    url, sha = rig.images.put(path, data)
    return path, url, sha, data


def test_url_images_need_a_digest_and_are_cached_under_it(rig, make_provider, image, request_for):
    path, url, sha, _ = unique_image(rig, image)
    provider = make_provider(url_entry(rig))
    with pytest.raises(SpecNotAllowed, match="must end with #sha256="):
        provider.create(request_for(image=url))
    inst = provider.create(request_for(image=f"{url}#sha256={sha}"))
    key = resolve(provider.settings, f"{url}#sha256={sha}").key
    assert key == f"url-{sha[:16]}"
    pool = rig.daemon.pool_dir
    assert _sha(pool / f"base-{key}.qcow2") == sha
    assert (pool / f"base-{key}.qcow2.sha256-{sha}").exists()
    provider.create(request_for(image=f"{url}#sha256={sha}"))
    assert rig.images.gets[path] == 1, "a cached URL image is not fetched again"
    provider.delete(inst.provider_id)


def test_a_url_digest_that_does_not_match_is_permanent(rig, make_provider, image, request_for):
    path, url, sha, _ = unique_image(rig, image)
    provider = make_provider(url_entry(rig))
    with pytest.raises(Permanent, match=f"SHA-256 of .* is {sha}, spec.placement.image says 1111"):
        provider.create(request_for(image=f"{url}#sha256={'1' * 64}"))
    assert not list(rig.daemon.pool_dir.glob(f"base-url-{'1' * 16}*"))


def test_url_redirects_stay_on_the_allowed_hosts(rig, make_provider, image, request_for):
    path, url, sha, data = unique_image(rig, image)
    provider = make_provider(url_entry(rig))
    port = rig.images.port
    # on the allowed host: followed
    rig.images.redirects["/r/same.qcow2"] = path
    inst = provider.create(request_for(image=f"http://127.0.0.1:{port}/r/same.qcow2#sha256={sha}"))
    assert rig.images.gets[path] == 1
    provider.delete(inst.provider_id)
    # off the allowed hosts (the same server under another name): refused before any GET there
    _, other_sha = rig.images.put("/images/other.qcow2", data + b"\0" * 512)
    rig.images.redirects["/r/off.qcow2"] = f"http://localhost:{port}/images/other.qcow2"
    with pytest.raises(Permanent, match=r"redirects to http://localhost:\d+/images/other.qcow2, off"):
        provider.create(request_for(image=f"http://127.0.0.1:{port}/r/off.qcow2#sha256={other_sha}"))
    assert rig.images.gets.get("/images/other.qcow2", 0) == 0


def test_url_images_are_cut_at_the_size_cap(rig, make_provider, image, request_for):
    path, url, sha, data = unique_image(rig, image, "16M")
    provider = make_provider(url_entry(rig, maxSize="64KiB"))
    with pytest.raises(Permanent, match=r"over kvm.allowImageURLs.maxSize \(65536 bytes\)"):
        provider.create(request_for(image=f"{url}#sha256={sha}"))
    rig.images.no_length.add(path)  # no Content-Length announced: counted while streaming
    with pytest.raises(Permanent, match=r"passed kvm.allowImageURLs.maxSize \(65536 bytes\); cut"):
        provider.create(request_for(image=f"{url}#sha256={sha}"))
    assert not list(rig.daemon.pool_dir.glob(f"base-url-{sha[:16]}*")), "nothing left in the pool"


def test_resolve_rules():
    from tests.kvm.harness import kvm_entry, provider_config
    common = dict(user="u", port=22, key_file="/k", known_hosts_file="/kh", hosts=[{"name": "h", "address": "a"}],
                  images={"d": {"url": "https://example.invalid/d.qcow2", "sha256": "a" * 64, "format": "raw"}})
    one = provider_config(kvm_entry(**common)).settings
    assert resolve(one, None) == ImageSettings("d", "https://example.invalid/d.qcow2", "a" * 64, "raw", "uefi")
    for bad in ("https://example.invalid/disk.raw?sig=1#sha256=" + "b" * 64, "ftp://example.invalid/x", "debian-13"):
        with pytest.raises(SpecNotAllowed) as info:
            resolve(one, bad)
        assert info.value.field == "spec.placement.image"
    urls = provider_config(kvm_entry(**common, allowImageURLs={"hosts": ["Images.Example.invalid"],
                                                               "maxSize": "2GiB"})).settings
    raw = resolve(urls, "https://images.example.invalid/disk.raw?sig=1#sha256=" + "B" * 64)
    assert raw == ImageSettings("url-" + "b" * 16, "https://images.example.invalid/disk.raw?sig=1", "b" * 64, "raw",
                                "uefi", ("images.example.invalid",), 2 * 1024 ** 3)
    for bad, problem in (("https://elsewhere.invalid/x.qcow2#sha256=" + "b" * 64, "not in kvm.allowImageURLs.hosts"),
                         ("https://images.example.invalid/x.qcow2", "#sha256="),
                         ("https://images.example.invalid/x.qcow2#sha256=abc", "#sha256="),
                         ("ftp://images.example.invalid/x#sha256=" + "b" * 64, "not a configured image")):
        with pytest.raises(SpecNotAllowed, match=problem):
            resolve(urls, bad)


@pytest.fixture
def harness_qcow2(tmp_path):
    from tests.kvm.harness import qcow2

    def make(size: str) -> bytes:
        return qcow2(tmp_path / f"v-{size}.qcow2", size)
    return make


def test_concurrent_creates_in_one_worker_fetch_the_image_once(rig, make_provider, image, request_for):
    from concurrent.futures import ThreadPoolExecutor
    path, url, sha, _ = image()
    provider = make_provider(rig.entry(images={"shared": {"url": url, "sha256": sha}}))
    reqs = [request_for(image="shared") for _ in range(3)]
    with ThreadPoolExecutor(3) as pool:
        made = list(pool.map(provider.create, reqs))
    assert rig.images.gets[path] == 1
    assert {i.name for i in made} == {r.name for r in reqs}
    for inst in made:
        provider.delete(inst.provider_id)
