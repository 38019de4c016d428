"""What the image and the Squid Pods run is pinned: base and Squid images by digest, the image's
Python dependencies by a hashed lock file.

No Docker engine and no registry here: the Dockerfile, the lock files and the configs are
read.  The lock must cover pyproject.toml (every dependency of the project and of its ``kvm``
extra, at a version its range admits, with hashes), the build backend of
``[build-system]`` likewise (requirements-build.lock), and the Dockerfile must install
exactly those with ``--require-hashes``.  Requirement and marker syntax: PEP 508 (``packaging``);
hash-checking mode: pip's "Secure installs" documentation.
"""

from __future__ import annotations

import logging
import re
import tomllib
from pathlib import Path

import pytest
import yaml
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

from app.providers.kubernetes import config as pods_config
from app.config.validation import Reader

ROOT = Path(__file__).resolve().parents[1]
DIGEST = re.compile(r"@sha256:[0-9a-f]{64}$")
#: The image's interpreter (the Dockerfile's base): markers are evaluated for it.
IMAGE_PYTHON = {"python_version": "3.11", "python_full_version": "3.11.9", "sys_platform": "linux",
                "platform_system": "Linux", "os_name": "posix", "implementation_name": "cpython",
                "platform_python_implementation": "CPython", "platform_machine": "x86_64"}


def read_lock(path: Path) -> dict[str, tuple[Version, list[str]]]:
    """``{canonical name: (version, [sha256 hashes])}`` of a pip requirements file made with
    ``--generate-hashes``; raises AssertionError on an entry that is not ``name==version``."""
    text = path.read_text().replace("\\\n", " ")
    out = {}
    for line in text.splitlines():
        line = line.split(" #", 1)[0].strip()
        if not line or line.startswith("#"):
            continue
        spec, *options = line.split(" --hash=")
        req = Requirement(spec.strip())
        pins = [s for s in req.specifier if s.operator == "=="]
        assert len(pins) == 1 and len(req.specifier) == 1, f"{path.name}: {spec!r} is not pinned with =="
        out[canonicalize_name(req.name)] = (Version(pins[0].version), [o.strip() for o in options])
    return out


def _pyproject() -> dict:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())


def _assert_covered(requirements: list[str], lock: dict, where: str) -> None:
    for raw in requirements:
        req = Requirement(raw)
        if req.marker is not None and not req.marker.evaluate(IMAGE_PYTHON):
            continue
        name = canonicalize_name(req.name)
        assert name in lock, f"{where}: {req.name} is not in the lock"
        version, hashes = lock[name]
        assert req.specifier.contains(version, prereleases=True), \
            f"{where}: {req.name} is locked at {version}, outside {req.specifier}"
        assert hashes, f"{where}: {req.name} has no hash"


def test_the_lock_covers_every_dependency_of_pyproject():
    lock = read_lock(ROOT / "requirements.lock")
    project = _pyproject()["project"]
    _assert_covered(project["dependencies"], lock, "requirements.lock")
    _assert_covered(project["optional-dependencies"]["kvm"], lock, "requirements.lock (kvm extra)")
    _assert_covered(project["optional-dependencies"]["aws"], lock, "requirements.lock (aws extra)")
    for name, (_version, hashes) in lock.items():
        assert hashes and all(re.fullmatch(r"sha256:[0-9a-f]{64}", h) for h in hashes), f"{name}: {hashes}"
    # the extras the project asks for came along (celery[redis] -> kombu's redis, redis[hiredis])
    assert {"kombu", "hiredis"} <= set(lock)
    header = (ROOT / "requirements.lock").read_text().splitlines()[:3]
    assert any("--generate-hashes" in line and "--extra kvm" in line and "--extra aws" in line
               for line in header), header


def test_the_build_backend_is_locked_too():
    build = read_lock(ROOT / "requirements-build.lock")
    _assert_covered(_pyproject()["build-system"]["requires"], build, "requirements-build.lock")


def test_the_dockerfile_installs_the_locks_with_hashes_only():
    text = (ROOT / "Dockerfile").read_text().replace("\\\n", " ")
    installs = [re.sub(r"\s+", " ", m) for m in re.findall(r"pip install ([^&\n]+)", text)]
    assert "--require-hashes --no-deps -r requirements-build.lock" in installs[0], installs
    assert "--require-hashes --no-deps --no-build-isolation -r requirements.lock" in installs[1], installs
    # the project itself: nothing more resolved or fetched
    assert installs[2].strip() == "--no-deps --no-build-isolation .", installs
    assert len(installs) == 3
    assert re.search(r"^COPY requirements-build\.lock requirements\.lock \./$", text, re.M)


def test_the_base_image_and_the_squid_image_are_pinned_by_digest():
    text = (ROOT / "Dockerfile").read_text()
    [base] = re.findall(r"^ARG PYTHON_IMAGE=(\S+)$", text, re.M)
    assert base.startswith("python:3.11-slim@") and DIGEST.search(base), base
    assert all(f == "${PYTHON_IMAGE}" or f.startswith("${PYTHON_IMAGE} ")
               for f in re.findall(r"^FROM\s+(.+)$", text, re.M))

    default = pods_config.DEFAULT_IMAGE
    assert default.startswith("ubuntu/squid@") and DIGEST.search(default), default
    for path in ("deploy/default/providers.yaml", "deploy/compose/providers.yaml", "deploy/samples/providers.yaml"):
        [entry] = [p for p in yaml.safe_load((ROOT / path).read_text())["providers"] if p["type"] == "kubernetes"]
        assert entry["kubernetes"]["image"] == default, path
    assert default in (ROOT / "README.md").read_text()


def _parse(image_block: dict) -> pods_config.KubernetesSettings:
    return pods_config.parse(Reader(image_block, "providers.yaml", "k8s", "kubernetes"))


def test_an_image_without_a_digest_is_used_with_a_warning_naming_the_field(caplog):
    caplog.set_level(logging.WARNING, logger=pods_config.__name__)
    settings = _parse({"image": "ubuntu/squid:latest",
                       "images": [pods_config.DEFAULT_IMAGE, "registry.example.com/squid:6.6"]})
    assert settings.image == "ubuntu/squid:latest"
    warnings = [r.getMessage() for r in caplog.records]
    assert len(warnings) == 2, warnings
    assert warnings[0].startswith('providers.yaml: provider "k8s": kubernetes.image: \'ubuntu/squid:latest\' '
                                  "is not pinned by digest"), warnings
    assert 'kubernetes.images[1]: \'registry.example.com/squid:6.6\'' in warnings[1], warnings

    caplog.clear()
    assert _parse({}).image == pods_config.DEFAULT_IMAGE
    assert _parse({"image": "registry.example.com/squid:6.6@sha256:" + "ab" * 32}).image.endswith("ab" * 32)
    assert caplog.records == []


@pytest.mark.parametrize("image", ["ubuntu/squid@sha256:abc", "ubuntu/squid@sha256:" + "A" * 64,
                                   "ubuntu/squid@sha512:" + "a" * 128, "ubuntu/squid:sha256"])
def test_only_a_full_sha256_digest_counts_as_pinned(image):
    assert not pods_config.pinned(image)
