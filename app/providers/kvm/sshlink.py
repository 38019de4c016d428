"""The SSH half of a host link: key material, the strict dial, and the unix-socket forward.

A host's libvirt daemon listens on a unix socket (``/var/run/libvirt/libvirt-sock``).  We
carry it over one paramiko SSH session: a local unix listener in a private temp directory
accepts libvirt-python's connection and pumps it through a ``direct-streamlocal@openssh.com``
channel (OpenSSH's unix-socket forwarding, ``ssh -L local.sock:/var/run/libvirt/libvirt-sock``;
the message layout is in OpenSSH's PROTOCOL file, section 2.4).  libvirt-python then opens
``qemu+unix:///system?socket=<local>``.

Host keys are checked strictly against the configured known_hosts file: an unknown host or a
changed key is refused, never added.  The key and known_hosts files are read on every dial, so
a Secret created or rotated after start is picked up by the next dial with no restart.
"""

from __future__ import annotations

import logging
import os
import queue
import shutil
import socket
import tempfile
import threading
import time
from dataclasses import dataclass

import paramiko
from paramiko.common import cMSG_CHANNEL_OPEN
from paramiko.message import Message

from app.providers.kvm.faults import (STAGE_HANDSHAKE, STAGE_LIBVIRT, STAGE_MATERIAL, STAGE_TCP,
                                      BadSSHMaterial, DialError)

log = logging.getLogger("proxy_operator.kvm.ssh")

_CHUNK = 64 * 1024


@dataclass(frozen=True)
class Material:
    """Loaded SSH material: the private key and the known host keys."""

    key: paramiko.PKey
    host_keys: paramiko.HostKeys


def material_problems(key_file: str, known_hosts_file: str) -> list[str]:
    """Return human-readable problems with the SSH files, ``[]`` when both are readable.

    Used for the startup warning; never raises and never parses key contents.
    """
    problems = []
    for label, path in (("SSH key file", key_file), ("known_hosts file", known_hosts_file)):
        if not os.path.exists(path):
            problems.append(f"{label} {path} does not exist")
        elif not os.access(path, os.R_OK):
            problems.append(f"{label} {path} is not readable")
    return problems


def load_material(host: str, key_file: str, known_hosts_file: str) -> Material:
    """Read the private key and the known_hosts file (stage "SSH material").

    Raises:
        DialError: a file is missing or unreadable (Transient: the Secret may appear later).
        BadSSHMaterial: the key does not parse, is a public key, or is passphrase-protected;
            or known_hosts cannot be decoded (Permanent: needs a new Secret).
    """
    for label, path in (("key file", key_file), ("known_hosts file", known_hosts_file)):
        if not os.path.exists(path):
            raise DialError(host, STAGE_MATERIAL, f"{label} {path} does not exist (is the kvm-ssh Secret mounted?)")
    try:
        with open(key_file, "rb") as fh:
            head = fh.read(64)
    except OSError as exc:
        raise DialError(host, STAGE_MATERIAL, f"cannot read key file {key_file}: {exc.strerror or exc}") from exc
    if head.lstrip().startswith((b"ssh-", b"ecdsa-", b"sk-")):
        raise BadSSHMaterial(host, f"key file {key_file} holds a public key; the private key is needed")
    try:
        key = paramiko.PKey.from_path(key_file)
    except paramiko.PasswordRequiredException as exc:
        raise BadSSHMaterial(host, f"key file {key_file} is passphrase-protected; use a key without one") from exc
    except OSError as exc:
        raise DialError(host, STAGE_MATERIAL, f"cannot read key file {key_file}: {exc.strerror or exc}") from exc
    except (paramiko.SSHException, ValueError, TypeError) as exc:
        raise BadSSHMaterial(host, f"key file {key_file} is not a usable private key: {exc}") from exc
    host_keys = paramiko.HostKeys()
    try:
        host_keys.load(known_hosts_file)
    except OSError as exc:
        raise DialError(host, STAGE_MATERIAL,
                        f"cannot read known_hosts file {known_hosts_file}: {exc.strerror or exc}") from exc
    except (UnicodeDecodeError, ValueError) as exc:
        raise BadSSHMaterial(host, f"known_hosts file {known_hosts_file} cannot be parsed: {exc}") from exc
    return Material(key, host_keys)


def known_hosts_name(address: str, port: int) -> str:
    """Return the name OpenSSH's known_hosts uses: ``addr`` on port 22, else ``[addr]:port``."""
    return address if port == 22 else f"[{address}]:{port}"


def dial_ssh(host: str, address: str, port: int, *, user: str, material: Material,
             connect_timeout: float, handshake_timeout: float, keepalive_interval: float) -> paramiko.Transport:
    """Open an authenticated SSH transport with a strictly checked host key.

    Args:
        host: host name for messages.
        address, port: where to dial.
        user: SSH user.
        material: from :func:`load_material`.
        connect_timeout: seconds for the TCP connect.
        handshake_timeout: one deadline (seconds) for banner, key exchange and authentication.
        keepalive_interval: seconds between SSH keepalives (0 = off); TCP keepalives are on too.
    Returns:
        an active :class:`paramiko.Transport`.
    Raises:
        DialError: stage "TCP" (refused, unreachable, timed out) or "SSH handshake" (no banner
            or key exchange before the deadline, host not in known_hosts, host key mismatch,
            authentication refused).  All Transient: each heals without a config change.
    """
    try:
        sock = socket.create_connection((address, port), timeout=connect_timeout)
    except OSError as exc:
        raise DialError(host, STAGE_TCP, f"connect to {address}:{port}: {exc.strerror or exc}") from exc
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
    for opt, value in (("TCP_KEEPIDLE", 30), ("TCP_KEEPINTVL", 10), ("TCP_KEEPCNT", 3)):
        if hasattr(socket, opt):
            sock.setsockopt(socket.IPPROTO_TCP, getattr(socket, opt), value)
    deadline = time.monotonic() + handshake_timeout
    transport = paramiko.Transport(sock)
    name = known_hosts_name(address, port)
    expected = material.host_keys.lookup(name)
    try:
        if expected:
            # Ask for the key types we can verify first (OpenSSH's client does the same).
            opts = transport.get_security_options()
            known = [t for t in opts.key_types if t in expected.keys()]
            opts.key_types = known + [t for t in opts.key_types if t not in known]
        transport.banner_timeout = handshake_timeout
        transport.handshake_timeout = handshake_timeout
        transport.start_client(timeout=handshake_timeout)
        offered = transport.get_remote_server_key()
        if not expected:
            raise DialError(host, STAGE_HANDSHAKE,
                            f"host {name} is not in the known_hosts file (add it with ssh-keyscan; "
                            f"keys are never accepted automatically)")
        known_key = expected.get(offered.get_name())
        if known_key is None or known_key != offered:
            raise DialError(host, STAGE_HANDSHAKE,
                            f"host key mismatch for {name}: the server offered {offered.get_name()} "
                            f"{offered.fingerprint}, which known_hosts does not list for it")
        transport.auth_timeout = max(0.1, deadline - time.monotonic())
        transport.auth_publickey(user, material.key)
        if not transport.is_authenticated():
            raise DialError(host, STAGE_HANDSHAKE, f"authentication as {user!r} did not complete")
    except DialError:
        transport.close()
        raise
    except paramiko.AuthenticationException as exc:
        transport.close()
        raise DialError(host, STAGE_HANDSHAKE, f"authentication as {user!r} refused: {exc}") from exc
    except (paramiko.SSHException, OSError, EOFError) as exc:
        transport.close()
        raise DialError(host, STAGE_HANDSHAKE, f"{name}: {exc or type(exc).__name__}") from exc
    if keepalive_interval:
        transport.set_keepalive(int(max(1, keepalive_interval)))
    return transport


def open_streamlocal(transport: paramiko.Transport, path: str, timeout: float) -> paramiko.Channel:
    """Open a ``direct-streamlocal@openssh.com`` channel to the unix socket ``path`` on the host.

    paramiko's ``open_channel`` packs extra fields only for TCP kinds, so this builds the open
    message itself (OpenSSH PROTOCOL 2.4: ``string socket path, string reserved, uint32
    reserved``) and otherwise does what ``Transport.open_channel`` does.

    Raises:
        paramiko.SSHException: the server refused (e.g. no such socket, forwarding disabled)
            or did not answer within ``timeout`` seconds.
    """
    if not transport.is_active():
        raise paramiko.SSHException("SSH session not active")
    t = transport
    with t.lock:
        window = t._sanitize_window_size(None)
        packet = t._sanitize_packet_size(None)
        chanid = t._next_channel()
        m = Message()
        m.add_byte(cMSG_CHANNEL_OPEN)
        m.add_string("direct-streamlocal@openssh.com")
        m.add_int(chanid)
        m.add_int(window)
        m.add_int(packet)
        m.add_string(path)
        m.add_string("")
        m.add_int(0)
        chan = paramiko.Channel(chanid)
        t._channels.put(chanid, chan)
        t.channel_events[chanid] = event = threading.Event()
        t.channels_seen[chanid] = True
        chan._set_transport(t)
        chan._set_window(window, packet)
    t._send_user_message(m)
    deadline = time.monotonic() + timeout
    while not event.wait(0.05):
        if not t.is_active():
            raise t.get_exception() or paramiko.SSHException("SSH session closed while opening a channel")
        if time.monotonic() > deadline:
            raise paramiko.SSHException(f"timed out opening a channel to {path}")
    chan = t._channels.get(chanid)
    if chan is None:
        raise t.get_exception() or paramiko.SSHException(f"the server refused a channel to {path}")
    return chan


class UnixForward:
    """A local unix listener whose every connection is carried to ``remote_path`` over SSH.

    The listener lives in a fresh 0700 temp directory (only this user can connect).  The
    first channel is opened eagerly by :meth:`open` so that a missing remote socket is
    reported as a dial failure with the server's reason; later connections open theirs on
    accept.

    Attributes:
        path: the local socket path to give libvirt (``...?socket=<path>``).
    """

    def __init__(self, host: str, transport: paramiko.Transport, remote_path: str, *, open_timeout: float) -> None:
        self.host = host
        self._transport = transport
        self._remote = remote_path
        self._timeout = open_timeout
        self._ready: queue.SimpleQueue[paramiko.Channel] = queue.SimpleQueue()
        self._dir = tempfile.mkdtemp(prefix=f"proxy-operator-kvm-{host}-")
        self.path = os.path.join(self._dir, "libvirt.sock")
        self._listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self._listener.bind(self.path)
        self._listener.listen(8)
        self._closed = threading.Event()
        self._open: set[object] = set()
        self._lock = threading.Lock()
        threading.Thread(target=self._accept_loop, name=f"kvm-fwd-{host}", daemon=True).start()

    def open(self) -> None:
        """Open the first channel now (stage "libvirt connect").

        Raises:
            DialError: the host refused the channel (no libvirt socket at that path, unix
                forwarding disabled in sshd) or did not answer in time.
        """
        try:
            self._ready.put(open_streamlocal(self._transport, self._remote, self._timeout))
        except (paramiko.SSHException, OSError, EOFError) as exc:
            raise DialError(self.host, STAGE_LIBVIRT,
                            f"cannot reach the libvirt socket {self._remote} over SSH (is libvirtd running "
                            f"there, and does sshd permit unix-socket forwarding for this key? see "
                            f"docs/kvm-provider.md): {exc}") from exc

    def _accept_loop(self) -> None:
        while not self._closed.is_set():
            try:
                local, _ = self._listener.accept()
            except OSError:
                return
            try:
                try:
                    chan = self._ready.get_nowait()
                except queue.Empty:
                    chan = open_streamlocal(self._transport, self._remote, self._timeout)
            except Exception as exc:  # noqa: BLE001 - the peer sees EOF; libvirt reports it
                log.debug("kvm host %s: forward: cannot open a channel to %s: %s", self.host, self._remote, exc)
                local.close()
                continue
            with self._lock:
                self._open.update((local, chan))
            threading.Thread(target=self._pump, args=(local, chan, True), daemon=True,
                             name=f"kvm-fwd-{self.host}-up").start()
            threading.Thread(target=self._pump, args=(local, chan, False), daemon=True,
                             name=f"kvm-fwd-{self.host}-down").start()

    def _pump(self, local: socket.socket, chan: paramiko.Channel, upstream: bool) -> None:
        src, dst = (local, chan) if upstream else (chan, local)
        try:
            while True:
                data = src.recv(_CHUNK)
                if not data:
                    break
                dst.sendall(data)
        except (OSError, EOFError, paramiko.SSHException):
            pass
        # One direction ended: tear both down so libvirt sees EOF promptly.
        _shut(local)
        _shut(chan)
        with self._lock:
            self._open.discard(local)
            self._open.discard(chan)

    def close(self) -> None:
        """Stop listening, close every forwarded connection and remove the temp directory."""
        self._closed.set()
        _shut(self._listener)
        with self._lock:
            ends = list(self._open)
            self._open.clear()
        while True:
            try:
                ends.append(self._ready.get_nowait())
            except queue.Empty:
                break
        for end in ends:
            _shut(end)
        shutil.rmtree(self._dir, ignore_errors=True)


def _shut(end: object) -> None:
    """Close a socket or channel, waking any thread blocked on it (Linux needs shutdown first)."""
    if isinstance(end, socket.socket):
        try:
            end.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
    try:
        end.close()  # type: ignore[attr-defined]
    except Exception:  # noqa: BLE001 - best effort
        pass
