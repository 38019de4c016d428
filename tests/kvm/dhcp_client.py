"""A minimal DHCPv4 client (RFC 2131) used to obtain real dnsmasq leases for a domain's MAC.

Run inside the libvirt daemon's network namespace::

    python dhcp_client.py IFACE MAC CLIENT_ID

Sends DISCOVER, then REQUEST (each repeated every second until answered) for the offered address, with ``chaddr`` = MAC and option 61 =
CLIENT_ID (a guest that changes its client-id on every boot gets a new lease each time), and
prints the acknowledged address.  Exits 1 when no ACK arrives.
"""

from __future__ import annotations

import os
import socket
import struct
import sys
import time

MAGIC = b"\x63\x82\x53\x63"


def _packet(xid: int, mac: bytes, client_id: bytes, msg_type: int, extra: bytes = b"") -> bytes:
    head = struct.pack("!BBBBIHH4s4s4s4s16s64s128s", 1, 1, 6, 0, xid, 0, 0x8000, b"\0" * 4, b"\0" * 4,
                       b"\0" * 4, b"\0" * 4, mac + b"\0" * 10, b"\0" * 64, b"\0" * 128)
    opts = bytes([53, 1, msg_type]) + bytes([61, len(client_id)]) + client_id + extra + bytes([55, 3, 1, 3, 6, 255])
    return head + MAGIC + opts


def _options(data: bytes) -> dict[int, bytes]:
    out, i = {}, 240
    while i < len(data) and data[i] != 255:
        if data[i] == 0:
            i += 1
            continue
        code, length = data[i], data[i + 1]
        out[code] = data[i + 2:i + 2 + length]
        i += 2 + length
    return out


def _exchange(sock: socket.socket, packet: bytes, xid: int, want: int, timeout: float) -> tuple[str, dict[int, bytes]]:
    """Broadcast ``packet`` (again every second, as clients do) until a reply of type ``want``."""
    deadline = time.monotonic() + timeout
    while True:
        sock.sendto(packet, ("255.255.255.255", 67))
        try:
            return _wait(sock, xid, want, min(1.0, max(0.01, deadline - time.monotonic())))
        except socket.timeout:
            if time.monotonic() > deadline:
                raise


def _wait(sock: socket.socket, xid: int, want: int, timeout: float) -> tuple[str, dict[int, bytes]]:
    sock.settimeout(timeout)
    end = time.monotonic() + timeout
    while True:
        sock.settimeout(max(0.01, end - time.monotonic()))
        data, _ = sock.recvfrom(4096)
        if len(data) < 240 or struct.unpack("!I", data[4:8])[0] != xid:
            continue
        opts = _options(data)
        if opts.get(53) == bytes([want]):
            return socket.inet_ntoa(data[16:20]), opts


def lease(iface: str, mac: str, client_id: str, timeout: float = 5.0) -> str:
    """Run DISCOVER/OFFER/REQUEST/ACK on ``iface``; return the leased IPv4."""
    hw = bytes.fromhex(mac.replace(":", ""))
    cid = client_id.encode()
    xid = int.from_bytes(os.urandom(4), "big")
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_BROADCAST, 1)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_BINDTODEVICE, iface.encode())
    sock.bind(("0.0.0.0", 68))
    offered, opts = _exchange(sock, _packet(xid, hw, cid, 1), xid, 2, timeout)
    extra = bytes([50, 4]) + socket.inet_aton(offered) + bytes([54, 4]) + opts[54]
    acked, _ = _exchange(sock, _packet(xid, hw, cid, 3, extra), xid, 5, timeout)
    return acked


if __name__ == "__main__":
    try:
        print(lease(sys.argv[1], sys.argv[2], sys.argv[3]))
    except socket.timeout:
        print("no DHCP answer", file=sys.stderr)
        sys.exit(1)
