"""The per-host image cache in the storage pool, over SSH against the real daemon."""

from __future__ import annotations

import hashlib

import pytest

from app.providers.errors import Permanent, Transient
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


def test_url_images_are_cached_under_a_derived_key(rig, make_provider, image, request_for):
    path, url, sha, _ = image()
    provider = make_provider()
    inst = provider.create(request_for(image=url))
    key = resolve(provider.settings, url).key
    assert key.startswith("url-")
    pool = rig.daemon.pool_dir
    assert _sha(pool / f"base-{key}.qcow2") == sha
    assert (pool / f"base-{key}.qcow2.sha256-{sha}").exists()
    provider.create(request_for(image=url))
    assert rig.images.gets[path] == 1, "a cached URL image is not fetched again"
    provider.delete(inst.provider_id)


def test_resolve_rules():
    from tests.kvm.harness import kvm_entry, provider_config
    one = provider_config(kvm_entry(user="u", port=22, key_file="/k", known_hosts_file="/kh",
                                    hosts=[{"name": "h", "address": "a"}],
                                    images={"d": {"url": "https://example.invalid/d.qcow2", "sha256": "a" * 64,
                                                  "format": "raw"}})).settings
    assert resolve(one, None) == ImageSettings("d", "https://example.invalid/d.qcow2", "a" * 64, "raw", "uefi")
    raw = resolve(one, "https://example.invalid/disk.raw?sig=1")
    assert raw.format == "raw" and raw.sha256 is None and raw.firmware == "uefi"
    with pytest.raises(Permanent):
        resolve(one, "ftp://example.invalid/x")


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
