"""Loopback addresses and ports claimed per process, so demos and test runs side by side never collide.

Two runs of the suite on one machine (two developers, two CI jobs, the workers of
``pytest -n 2``) share one loopback interface.  Nothing in the tests binds a fixed address
other than ``127.0.0.1`` or a fixed port: every address a test listens on comes from a
``127.A.B.0/24`` block claimed here, and every port from the kernel (``bind`` to port 0).

* :func:`claim_block` picks a random block in ``127.1.0.0``-``127.254.255.0`` (``127.0.x.x``
  is left alone: ``127.0.0.1`` is everyone's, ``127.0.0.53`` systemd-resolved's, ``127.0.1.1``
  Debian's host name) where no TCP socket is bound yet, and holds an exclusive ``fcntl.flock``
  on ``/tmp/proxy-operator-test-locks/127.A.B.lock`` until :meth:`Block.release` or until the
  process ends (the kernel drops the lock with the process, so a crashed run leaves nothing
  claimed).  Two processes never hold the same block.
* :func:`block` is the one block of an area (``"health"``, ``"api"`` ...) for this process:
  claimed on first use, held until the process ends.  Area fixtures and module constants use
  it (``ORIGIN_ADDRESS = loopback.block("health").host(1)``).
* :class:`AddressPool` hands out addresses one at a time, never the same twice within the
  process, claiming a new block when one is used up (the kubelet stand-in's Pod IPs).
* :func:`free_port` is a port the kernel says is free on an address.

``PROXY_OPERATOR_TEST_LOCK_DIR`` moves the lock directory (every run that must not collide has
to use the same one).
"""

from __future__ import annotations

import errno
import fcntl
import ipaddress
import os
import random
import socket
import threading
from pathlib import Path

#: Where the block locks live: one file per block ever claimed on this machine, never removed.
LOCK_DIR = Path(os.environ.get("PROXY_OPERATOR_TEST_LOCK_DIR") or "/tmp/proxy-operator-test-locks")

_lock = threading.Lock()
_areas: dict[str, "Block"] = {}
_held: dict[str, "Block"] = {}  # network -> Block, so the lock files stay open


class Block:
    """One claimed ``127.A.B.0/24``; usable hosts are ``.1`` to ``.254``.

    Attributes:
        network: the block as an :class:`ipaddress.IPv4Network`.
    """

    def __init__(self, network: ipaddress.IPv4Network, lock_file) -> None:
        self.network = network
        self._lock_file = lock_file

    @property
    def cidr(self) -> str:
        """The block in CIDR notation (``127.A.B.0/24``), e.g. for an allowed range."""
        return str(self.network)

    def host(self, n: int) -> str:
        """Return address ``n`` of the block (``1 <= n <= 254``) as a string."""
        if not 1 <= n <= 254:
            raise ValueError(f"host number {n} is outside 1-254")
        return str(self.network.network_address + n)

    def __contains__(self, address: object) -> bool:
        try:
            return ipaddress.ip_address(str(address)) in self.network
        except ValueError:
            return False

    def __repr__(self) -> str:
        return f"Block({self.cidr})"

    def release(self) -> None:
        """Give the block back (another process may claim it from now on)."""
        with _lock:
            _held.pop(self.cidr, None)
            for name, blk in list(_areas.items()):
                if blk is self:
                    del _areas[name]
        if self._lock_file is not None:
            self._lock_file.close()  # closing drops the flock
            self._lock_file = None


def _bound_blocks() -> set[tuple[int, int]]:
    """``(A, B)`` of every ``127.A.B.x`` some TCP socket on this machine is bound to."""
    busy: set[tuple[int, int]] = set()
    try:
        lines = Path("/proc/net/tcp").read_text().splitlines()[1:]
    except OSError:
        return busy
    for line in lines:
        try:
            local = line.split()[1].split(":")[0]
            packed = int(local, 16).to_bytes(4, "little")  # /proc shows the address in host order
        except (IndexError, ValueError):
            continue
        if packed[0] == 127:
            busy.add((packed[1], packed[2]))
    return busy


def claim_block() -> Block:
    """Claim a free ``127.A.B.0/24`` for this process (see the module docstring); return it.

    Raises:
        RuntimeError: no block could be claimed after many tries (the lock directory is not
            writable, or tens of thousands of blocks are held).
    """
    LOCK_DIR.mkdir(parents=True, exist_ok=True)
    try:
        os.chmod(LOCK_DIR, 0o1777)  # other users' runs lock here too
    except OSError:
        pass
    busy = _bound_blocks()
    rng = random.SystemRandom()
    last_error: OSError | None = None
    for _ in range(2000):
        a, b = rng.randint(1, 254), rng.randint(0, 255)
        if (a, b) in busy:
            continue
        network = ipaddress.IPv4Network(f"127.{a}.{b}.0/24")
        with _lock:
            if str(network) in _held:
                continue
        path = LOCK_DIR / f"127.{a}.{b}.lock"
        try:
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o666)
        except OSError as exc:
            last_error = exc
            continue
        lock_file = os.fdopen(fd, "r+")
        try:
            fcntl.flock(lock_file, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            lock_file.close()
            if exc.errno not in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                last_error = exc
            continue
        blk = Block(network, lock_file)
        with _lock:
            _held[blk.cidr] = blk
        return blk
    raise RuntimeError(f"could not claim a loopback block under {LOCK_DIR}: {last_error}")


def block(area: str) -> Block:
    """Return this process's block for ``area`` (claimed on first use, held until the process ends)."""
    with _lock:
        blk = _areas.get(area)
    if blk is not None:
        return blk
    new = claim_block()
    with _lock:
        blk = _areas.setdefault(area, new)
    if blk is not new:
        new.release()
    return blk


class AddressPool:
    """Loopback addresses handed out one at a time, never twice within the process.

    Args:
        first: the first host number used in each block (``1``-``254``).
    """

    def __init__(self, first: int = 1) -> None:
        self.first = first
        self._block: Block | None = None
        self._next = first
        self._lock = threading.Lock()

    def take(self) -> str:
        """Return an address no earlier :meth:`take` of this pool returned."""
        with self._lock:
            if self._block is None or self._next > 254:
                self._block, self._next = claim_block(), self.first
            address = self._block.host(self._next)
            self._next += 1
            return address


def free_port(host: str = "127.0.0.1") -> int:
    """Return a TCP port that was free on ``host`` a moment ago (the kernel's pick)."""
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def reserve_port(host: str = "127.0.0.1") -> socket.socket:
    """Return a socket bound (not listening) to a kernel-picked port on ``host``, with
    ``SO_REUSEADDR``: the port stays ours for a server that starts later (connects to it are
    refused meanwhile, as to a port nobody listens on), and on Linux a server that sets
    ``SO_REUSEADDR`` itself (sshd, Squid, Python's socketserver) can bind and listen on it while
    this socket is still open; close it once the server listens.  ``free_port`` alone lets
    another process (an outgoing connection's ephemeral port) take the port before the server
    starts."""
    s = socket.socket()
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.bind((host, 0))
    return s

