"""KVM provider benchmark: Create and Delete of N domains on one host over SSH.

Starts the same real parts as tests/kvm (a private libvirtd + virtlogd in their own
namespaces, sshd on loopback in front of it, a loopback image server with a tiny qcow2), builds
a :class:`app.providers.kvm.provider.KvmProvider` from a parsed config, and times
``create`` for N fresh Proxies one after the other (domains really start, ``domainType: qemu``),
then ``delete`` for each.  The first create also fetches and verifies the image; it is
reported separately.  Prints seconds per Create and per Delete (mean, p50, max) and how many
SSH sessions the provider opened.

Needs root (the daemon runs in private namespaces).  Usage: ``python bench/kvm.py [--domains 20]``.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from app.providers.naming import instance_name, tags_for  # noqa: E402
from app.providers.base import CreateRequest  # noqa: E402
from app.providers.kvm.provider import KvmProvider  # noqa: E402
from tests.kvm import harness  # noqa: E402


def summary(label: str, values: list[float]) -> str:
    """Return ``label: mean X s, p50 Y s, max Z s (n=N)``."""
    return (f"{label}: mean {statistics.mean(values):.3f} s, p50 {statistics.median(values):.3f} s, "
            f"max {max(values):.3f} s (n={len(values)})")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--domains", type=int, default=20, help="domains to create and delete (default 20)")
    args = parser.parse_args()

    with tempfile.TemporaryDirectory(prefix="bench-kvm-") as tmp:
        rig = harness.Rig(Path(tmp)).start()
        provider = None
        try:
            url, sha = rig.images.put("/bench.qcow2", harness.qcow2(Path(tmp) / "bench.qcow2"))
            provider = KvmProvider(harness.provider_config(rig.entry(images={"bench": {"url": url, "sha256": sha}})))
            requests = []
            for _ in range(args.domains):
                uid = str(uuid.uuid4())
                requests.append(CreateRequest(name=instance_name(uid), tags=tags_for(uid), namespace="bench",
                                              zone="h1", user_data=b"#cloud-config\npackages: [squid]\n"))
            creates, deletes, ids = [], [], []
            for req in requests:
                started = time.perf_counter()
                ids.append(provider.create(req).provider_id)
                creates.append(time.perf_counter() - started)
            for pid in ids:
                started = time.perf_counter()
                provider.delete(pid)
                deletes.append(time.perf_counter() - started)
            version = provider.check_host("h1").details.get("libvirtVersion", "?")
            print(f"kvm provider: {args.domains} domains on one host over SSH "
                  f"(libvirt {version}, domainType qemu, 128 MiB, UEFI)")
            print(f"first create (image fetch + verify + define + start): {creates[0]:.3f} s")
            print(summary("create (image cached)", creates[1:] or creates))
            print(summary("delete (destroy + undefine with NVRAM + volumes)", deletes))
            print(f"SSH sessions opened: {provider.link('h1').dials}")
        finally:
            if provider is not None:
                provider.close()
            rig.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
