"""A bootable Debian guest image built from Debian packages, cached by its recipe.

The image the real-guest test (tests/kvm/test_real_guest.py) boots: Debian 12 ``minbase``
with the cloud kernel, systemd, cloud-init, Squid and the QEMU guest agent preinstalled (the
guest has no network to the outside, so nothing can be installed at boot).  Built without loop
devices or mounts, as ``/work/shared/ENVIRONMENT.md`` measured it:

1. ``debootstrap --variant=minbase --include=<PACKAGES>`` into a directory;
2. inside it: systemd-networkd DHCP on ``en*``/``eth*``, ``datasource_list: [NoCloud, None]``,
   an fstab for ``LABEL=root``, an empty machine-id;
3. an EFI system partition made with ``mkfs.vfat -C`` + mtools holding a
   ``grub-mkstandalone -O x86_64-efi`` binary whose embedded grub.cfg boots the kernel with
   ``root=LABEL=root console=ttyS0``;
4. the root filesystem with ``mkfs.ext4 -L root -d ROOTFS``;
5. both ``dd``-ed into a GPT disk laid out by ``sgdisk``, then ``qemu-img convert -c -O qcow2``.

The result is cached under ``$PROXY_OPERATOR_CACHE`` (default ``~/.cache/proxy-operator``) in
``guest-<first 16 hex of the recipe's sha256>/guest.qcow2``: the key covers the suite, the
package list, the files written into the guest, the build steps' code and the mirror, so any
change to the recipe builds a new image.  Builds are
serialised by a lock file; a half-built image is never published (built in a temp dir, then
renamed).

Run ``python -m tests.kvm.guest_image`` (as root) to build or locate the image.
"""

from __future__ import annotations

import fcntl
import hashlib
import inspect
import os
import shutil
import subprocess
import sys
import tempfile
import urllib.error
import urllib.request
from pathlib import Path

SUITE = "bookworm"
PACKAGES = ("linux-image-cloud-amd64", "systemd-sysv", "udev", "dbus", "iproute2", "cloud-init",
            "python3-cffi-backend", "squid", "nftables", "qemu-guest-agent", "e2fsprogs", "netbase", "ca-certificates")
#: Tools the build needs on the host (Debian packages in .ci/apt-packages.txt).
TOOLS = ("debootstrap", "grub-mkstandalone", "mkfs.vfat", "mmd", "mcopy", "sgdisk", "mkfs.ext4", "qemu-img")
ESP_MIB = 32
ROOT_MIB = 2048

GRUB_CFG = """\
set timeout=0
insmod part_gpt
insmod ext2
search --no-floppy --label root --set=root
linux /{kernel} root=LABEL=root ro console=ttyS0 net.ifnames=1
initrd /{initrd}
boot
"""

NETWORK = "[Match]\nName=en* eth*\n\n[Network]\nDHCP=ipv4\n"
CLOUD_CFG = "datasource_list: [NoCloud, None]\n"


#: debootstrap's words for a mirror it could not reach (the build then skips rather than fails).
_NO_MIRROR = ("Failed getting release file", "Couldn't download", "Temporary failure resolving",
              "Connection refused", "Connection timed out", "Could not resolve")


class BuildUnavailable(Exception):
    """The image cannot be built on this machine (a tool is missing, no root, no mirror)."""


def mirror() -> str:
    """Return the Debian mirror (``$PROXY_OPERATOR_DEBIAN_MIRROR``, default deb.debian.org)."""
    return os.environ.get("PROXY_OPERATOR_DEBIAN_MIRROR", "http://deb.debian.org/debian")


def recipe_key() -> str:
    """Return the cache key: a hash of the recipe (suite, packages, files written, build steps, mirror)."""
    parts = [SUITE, mirror(), ",".join(PACKAGES), str(ESP_MIB), str(ROOT_MIB), GRUB_CFG, NETWORK, CLOUD_CFG,
             inspect.getsource(_configure_rootfs), inspect.getsource(build)]
    return hashlib.sha256("\n\0".join(parts).encode()).hexdigest()[:16]


def cache_dir() -> Path:
    """Return the cache root (``$PROXY_OPERATOR_CACHE`` or ``~/.cache/proxy-operator``)."""
    root = os.environ.get("PROXY_OPERATOR_CACHE")
    return Path(root) if root else Path.home() / ".cache" / "proxy-operator"


def image_path() -> Path:
    """Return where the image for the current recipe lives (it may not exist yet)."""
    return cache_dir() / f"guest-{recipe_key()}" / "guest.qcow2"


def check_can_build() -> None:
    """Raise :class:`BuildUnavailable` saying why this machine cannot build the image."""
    if os.geteuid() != 0:
        raise BuildUnavailable("building the guest image needs root (debootstrap)")
    absent = [t for t in TOOLS if shutil.which(t) is None and not os.path.exists(f"/usr/sbin/{t}")]
    if absent:
        raise BuildUnavailable(f"missing tools to build the guest image: {', '.join(absent)} "
                               "(Debian packages in .ci/apt-packages.txt)")
    url = f"{mirror()}/dists/{SUITE}/Release"
    try:
        with urllib.request.urlopen(url, timeout=15) as resp:
            resp.read(64)
    except (OSError, urllib.error.URLError) as exc:
        raise BuildUnavailable(f"no network to the Debian mirror ({url}: {exc})") from exc


def _run(*cmd: str, log, **kwargs) -> None:
    log.write(f"$ {' '.join(cmd)}\n")
    log.flush()
    subprocess.run(cmd, check=True, stdout=log, stderr=subprocess.STDOUT, **kwargs)


def _configure_rootfs(root: Path) -> tuple[str, str]:
    """Write the guest's own configuration into ``root``; return (kernel, initrd) paths in it."""
    (root / "etc/fstab").write_text("LABEL=root / ext4 defaults,errors=remount-ro 0 1\n")
    (root / "etc/machine-id").write_text("")
    (root / "etc/hostname").write_text("localhost\n")
    net = root / "etc/systemd/network"
    net.mkdir(parents=True, exist_ok=True)
    (net / "10-dhcp.network").write_text(NETWORK)
    for target, unit in (("multi-user.target.wants", "systemd-networkd.service"),
                         ("sockets.target.wants", "systemd-networkd.socket"),
                         ("network-online.target.wants", "systemd-networkd-wait-online.service")):
        wants = root / "etc/systemd/system" / target
        wants.mkdir(parents=True, exist_ok=True)
        link = wants / unit
        if not link.is_symlink() and (root / "lib/systemd/system" / unit).exists():
            link.symlink_to(f"/lib/systemd/system/{unit}")
    cfg = root / "etc/cloud/cloud.cfg.d"
    cfg.mkdir(parents=True, exist_ok=True)
    (cfg / "90-proxy-operator-datasource.cfg").write_text(CLOUD_CFG)
    kernels = sorted((root / "boot").glob("vmlinuz-*"))
    initrds = sorted((root / "boot").glob("initrd.img-*"))
    if not kernels or not initrds:
        raise RuntimeError(f"no kernel/initrd in {root / 'boot'}")
    # apt caches are useless in the image.
    shutil.rmtree(root / "var/cache/apt/archives", ignore_errors=True)
    (root / "var/cache/apt/archives/partial").mkdir(parents=True, exist_ok=True)
    for f in (root / "var/lib/apt/lists").glob("*_*"):
        f.unlink()
    return f"boot/{kernels[-1].name}", f"boot/{initrds[-1].name}"


def build(out: Path, work: Path, log) -> None:
    """Build the image into ``out`` using scratch directory ``work``, logging to ``log``."""
    root = work / "rootfs"
    _run("debootstrap", "--variant=minbase", f"--include={','.join(PACKAGES)}", SUITE, str(root), mirror(),
         log=log)
    kernel, initrd = _configure_rootfs(root)
    grub_cfg = work / "grub.cfg"
    grub_cfg.write_text(GRUB_CFG.format(kernel=kernel, initrd=initrd))
    efi = work / "BOOTX64.EFI"
    _run("grub-mkstandalone", "-O", "x86_64-efi", "-o", str(efi), f"boot/grub/grub.cfg={grub_cfg}", log=log)
    esp = work / "esp.img"
    _run("mkfs.vfat", "-C", "-n", "ESP", str(esp), str(ESP_MIB * 1024), log=log)
    _run("mmd", "-i", str(esp), "::/EFI", "::/EFI/BOOT", log=log)
    _run("mcopy", "-i", str(esp), str(efi), "::/EFI/BOOT/BOOTX64.EFI", log=log)
    rootimg = work / "root.img"
    _run("mkfs.ext4", "-q", "-L", "root", "-d", str(root), str(rootimg), f"{ROOT_MIB}M", log=log)
    disk = work / "disk.img"
    with open(disk, "wb") as f:
        f.truncate((1 + ESP_MIB + ROOT_MIB + 1) * 1024 * 1024)
    # Not -q: on a blank image sgdisk -q writes nothing.
    _run("sgdisk", "-n", f"1:2048:+{ESP_MIB}M", "-t", "1:ef00", "-c", "1:ESP",
         "-n", f"2:{2048 + ESP_MIB * 2048}:0", "-t", "2:8300", "-c", "2:root", str(disk), log=log)
    _run("dd", f"if={esp}", f"of={disk}", "bs=1M", "seek=1", "conv=notrunc,sparse", "status=none", log=log)
    _run("dd", f"if={rootimg}", f"of={disk}", "bs=1M", f"seek={1 + ESP_MIB}", "conv=notrunc,sparse",
         "status=none", log=log)
    _run("qemu-img", "convert", "-c", "-O", "qcow2", str(disk), str(out), log=log)


def ensure_image() -> Path:
    """Return the cached image for the current recipe, building it first when absent.

    Raises:
        BuildUnavailable: the machine cannot build it (see :func:`check_can_build`), or the
            build failed for lack of the mirror.
        subprocess.CalledProcessError: the build failed otherwise (the log is in the cache dir).
    """
    path = image_path()
    if path.exists():
        return path
    check_can_build()
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path.parent / "build.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if path.exists():
            return path
        logfile = path.parent / "build.log"
        with tempfile.TemporaryDirectory(prefix="guest-build-", dir=path.parent) as tmp, \
                open(logfile, "w") as log:
            partial = Path(tmp) / "guest.qcow2"
            try:
                build(partial, Path(tmp), log)
            except subprocess.CalledProcessError as exc:
                log.flush()
                text = logfile.read_text(errors="replace")
                if exc.cmd[0] == "debootstrap" and any(m in text for m in _NO_MIRROR):
                    raise BuildUnavailable(f"debootstrap could not download from {mirror()} "
                                           f"(log: {logfile})") from exc
                raise
            os.replace(partial, path)
    return path


if __name__ == "__main__":
    try:
        print(ensure_image())
    except BuildUnavailable as exc:
        print(f"cannot build: {exc}", file=sys.stderr)
        sys.exit(2)
