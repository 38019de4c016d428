"""One pooled SSH+libvirt link per host: lazy dial, redial after a drop, timed and traced calls.

:class:`HostLink` owns, per process, one SSH transport, one unix forward and one
``virConnect`` for its host.  Nothing is dialled until the first :meth:`HostLink.call`; a link
found dead (SSH session closed, libvirt reports the connection not alive, or a call overran its
timeout) is dropped and the next call dials again.  Errors that already carry a taxonomy class
(:mod:`app.errors`) are local verdicts — a missing domain, a bad checksum — and never
drop a working link.

Every call logs one line at DEBUG on the ``proxy_operator.kvm.libvirt`` logger: the libvirt
public API name (``rpc=virDomainLookupByName``), the identifiers it was given, the duration
and, on failure, the libvirt error code and name.  Domain and volume XML appear only at
level :data:`TRACE` (5); upload bodies never.

libvirt keepalives need an event loop: the first dial in a process registers libvirt's
default implementation and runs it on a daemon thread (https://libvirt.org/html/libvirt-libvirt-event.html).
"""

from __future__ import annotations

import concurrent.futures
import logging
import os
import threading
import time
from dataclasses import dataclass
from typing import Any, Callable, TypeVar

import libvirt
import paramiko

from app.lazy import per_process
from app.errors import ProviderError, Transient
from app.providers.kvm import sshlink
from app.providers.kvm.config import KvmHost, KvmSettings
from app.providers.kvm.faults import STAGE_LIBVIRT, DialError, classify_libvirt, code_name

T = TypeVar("T")

#: Log level of XML payloads in the call trace (more verbose than DEBUG).
TRACE = 5
logging.addLevelName(TRACE, "TRACE")

trace_log = logging.getLogger("proxy_operator.kvm.libvirt")
log = logging.getLogger("proxy_operator.kvm")

_event_lock = threading.Lock()
_event_registered = False


def _quiet(_ctx: Any, _err: Any) -> None:
    """libvirt's default handler prints every error to stderr; errors are raised and traced instead."""


def _ensure_event_loop() -> None:
    """Register libvirt's default event loop once per process image and run it in this process."""
    global _event_registered
    with _event_lock:
        if not _event_registered:
            libvirt.registerErrorHandler(_quiet, None)
            libvirt.virEventRegisterDefaultImpl()
            _event_registered = True
    _event_thread()


@per_process
def _event_thread() -> threading.Thread:
    """Start this process's thread running libvirt's event loop (a forked child inherits the
    registration, not the thread)."""
    thread = threading.Thread(target=_run_events, name="libvirt-events", daemon=True)
    thread.start()
    return thread


def _run_events() -> None:
    while True:
        try:
            libvirt.virEventRunDefaultImpl()
        except Exception:  # keep the loop alive
            log.exception("libvirt event loop iteration failed")
            time.sleep(1)


def libvirt_uri(driver_uri: str, local_socket: str) -> str:
    """Return the URI libvirt-python opens over the forward.

    ``qemu:///system`` + ``/tmp/x/libvirt.sock`` -> ``qemu+unix:///system?socket=/tmp/x/libvirt.sock``.
    """
    scheme, rest = driver_uri.split(":", 1)
    return f"{scheme}+unix:{rest}?socket={local_socket}"


@dataclass
class _Live:
    transport: paramiko.Transport
    forward: sshlink.UnixForward
    conn: libvirt.virConnect
    pid: int


class HostLink:
    """The pooled link to one host.

    Args:
        provider: provider name (for logs).
        host: the host's config.
        settings: the provider's settings (SSH material paths, timeouts).

    Attributes:
        dials: number of SSH sessions this process has established to the host.
    """

    def __init__(self, provider: str, host: KvmHost, settings: KvmSettings) -> None:
        self.provider = provider
        self.host = host
        self.settings = settings
        self.dials = 0
        self._live: _Live | None = None
        self._dial_lock = threading.Lock()
        # this process's call threads (a forked child starts its own)
        self._pool = per_process(lambda: concurrent.futures.ThreadPoolExecutor(
            max_workers=8, thread_name_prefix=f"kvm-{self.host.name}"))

    # -- connection lifecycle ---------------------------------------------------------------
    def _alive(self, live: _Live) -> bool:
        if live.pid != os.getpid() or not live.transport.is_active():
            return False
        try:
            return live.conn.isAlive() == 1
        except libvirt.libvirtError:
            return False

    def _current(self) -> _Live:
        live = self._live
        if live is not None and self._alive(live):
            return live
        with self._dial_lock:
            live = self._live
            if live is not None and self._alive(live):
                return live
            if live is not None:
                self._drop(live, "the link was found dead")
            self._live = self._dial()
            return self._live

    def _dial(self) -> _Live:
        ssh = self.settings.ssh
        host = self.host
        port = self.settings.ssh_port(host)
        started = time.monotonic()
        try:
            material = sshlink.load_material(host.name, ssh.key_file, ssh.known_hosts_file)
            transport = sshlink.dial_ssh(host.name, host.address, port, user=ssh.user, material=material,
                                         connect_timeout=ssh.connect_timeout,
                                         handshake_timeout=ssh.handshake_timeout,
                                         keepalive_interval=ssh.keepalive_interval)
        except ProviderError as exc:
            log.info("kvm %s host %s: dial failed: %s", self.provider, host.name, exc)
            raise
        forward = None
        try:
            forward = sshlink.UnixForward(host.name, transport, host.libvirt_socket, open_timeout=ssh.handshake_timeout)
            forward.open()
            conn = self._open_libvirt(forward.path)
        except BaseException as exc:
            if forward is not None:
                forward.close()
            transport.close()
            if isinstance(exc, ProviderError):
                log.info("kvm %s host %s: dial failed: %s", self.provider, host.name, exc)
                raise
            if isinstance(exc, Exception):
                err = DialError(host.name, STAGE_LIBVIRT, f"local forward: {type(exc).__name__}: {exc}")
                log.info("kvm %s host %s: dial failed: %s", self.provider, host.name, err)
                raise err from exc
            raise
        if ssh.keepalive_interval:
            ka_started = time.monotonic()
            interval = int(max(1, ssh.keepalive_interval))
            try:
                conn.setKeepAlive(interval, ssh.keepalive_count)
                self._trace("virConnectSetKeepAlive", {"interval": interval, "count": ssh.keepalive_count},
                            ka_started)
            except libvirt.libvirtError as exc:
                self._trace("virConnectSetKeepAlive", {"interval": interval, "count": ssh.keepalive_count},
                            ka_started, error=exc.get_error_message() or str(exc), code=exc.get_error_code())
        self.dials += 1
        log.info("kvm %s host %s: connected to %s@%s:%d (%s) in %.2fs", self.provider, host.name, ssh.user,
                 host.address, port, host.libvirt_uri, time.monotonic() - started)
        return _Live(transport, forward, conn, os.getpid())

    def _open_libvirt(self, local_socket: str) -> libvirt.virConnect:
        _ensure_event_loop()
        uri = libvirt_uri(self.host.libvirt_uri, local_socket)
        ids = {"uri": self.host.libvirt_uri, "socket": self.host.libvirt_socket}
        started = time.monotonic()
        future = self._pool().submit(libvirt.open, uri)
        try:
            conn = future.result(timeout=self.settings.ssh.handshake_timeout)
            self._trace("virConnectOpen", ids, started)
            return conn
        except concurrent.futures.TimeoutError:
            self._trace("virConnectOpen", ids, started, error="no answer")
            raise DialError(self.host.name, STAGE_LIBVIRT,
                            f"libvirt did not answer {self.host.libvirt_uri} within "
                            f"{self.settings.ssh.handshake_timeout:g}s") from None
        except libvirt.libvirtError as exc:
            self._trace("virConnectOpen", ids, started, error=exc.get_error_message() or str(exc),
                        code=exc.get_error_code())
            raise DialError(self.host.name, STAGE_LIBVIRT,
                            f"{self.host.libvirt_uri} via {self.host.libvirt_socket}: "
                            f"{exc.get_error_message() or exc} ({code_name(exc.get_error_code())})") from exc

    def _drop(self, live: _Live, reason: str) -> None:
        if self._live is live:
            self._live = None
        if live.pid != os.getpid():
            return  # inherited across fork: the parent's sockets are not ours to close
        log.info("kvm %s host %s: dropping the link: %s", self.provider, self.host.name, reason)
        live.forward.close()
        live.transport.close()

        def close_conn() -> None:
            try:
                live.conn.close()
            except libvirt.libvirtError:
                pass

        threading.Thread(target=close_conn, daemon=True, name=f"kvm-close-{self.host.name}").start()

    def close(self) -> None:
        """Close the link (a later call dials again)."""
        live = self._live
        if live is not None:
            self._drop(live, "closed")

    # -- calls ------------------------------------------------------------------------------
    def call(self, rpc: str, fn: Callable[[libvirt.virConnect], T], *, timeout: float | None = None,
             xml: str | None = None, trace_result: bool = False, **ids: Any) -> T:
        """Run ``fn(conn)`` on the live connection, with a deadline, and trace it.

        Args:
            rpc: libvirt public API name for the trace (``"virDomainLookupByName"``).
            fn: the call; gets the ``virConnect``.  Objects it uses (domains, pools) must come
                from this link.
            timeout: seconds before the call is abandoned (default ``callTimeout``).
            xml: XML sent with the call, logged only at :data:`TRACE`.
            trace_result: log the (XML) result at :data:`TRACE`.
            **ids: identifiers for the trace line (``domain="proxy-x"``); never payloads.
        Returns:
            what ``fn`` returns.
        Raises:
            DialError / BadSSHMaterial: the link could not be established (named stage).
            NotFound, Permanent, QuotaExceeded, Transient: the libvirt error classified
            (:func:`app.providers.kvm.faults.classify_libvirt`), or an error ``fn`` raised
            itself.  A call past its deadline raises Transient and drops the link.
        """
        live = self._current()
        limit = timeout if timeout is not None else self.settings.call_timeout
        what = " ".join([rpc, *(str(v) for v in ids.values())])
        started = time.monotonic()
        future = self._pool().submit(fn, live.conn)
        try:
            result = future.result(timeout=limit)
        except concurrent.futures.TimeoutError:
            self._trace(rpc, ids, started, error=f"timed out after {limit:g}s")
            self._drop(live, f"{rpc} did not return within {limit:g}s")
            raise Transient(f"kvm host {self.host.name}: {what}: no answer within {limit:g}s; "
                            f"the link was dropped") from None
        except ProviderError as exc:
            self._trace(rpc, ids, started, error=str(exc))
            raise
        except libvirt.libvirtError as exc:
            code = exc.get_error_code()
            self._trace(rpc, ids, started, error=exc.get_error_message() or str(exc), code=code)
            if not self._alive(live):
                self._drop(live, f"{rpc} failed and the connection is gone")
            raise classify_libvirt(exc, f"kvm host {self.host.name}: {what}") from exc
        except Exception as exc:  # unclassified: Transient
            self._trace(rpc, ids, started, error=f"{type(exc).__name__}: {exc}")
            if not self._alive(live):
                self._drop(live, f"{rpc} failed and the connection is gone")
            raise Transient(f"kvm host {self.host.name}: {what}: {type(exc).__name__}: {exc}") from exc
        self._trace(rpc, ids, started, xml=xml, result=result if trace_result else None)
        return result

    def _trace(self, rpc: str, ids: dict[str, Any], started: float, *, error: str | None = None,
               code: int | None = None, xml: str | None = None, result: Any = None) -> None:
        if not trace_log.isEnabledFor(logging.DEBUG):
            return
        fields = [f"rpc={rpc}", f"provider={self.provider}", f"host={self.host.name}"]
        fields += [f"{k}={v}" for k, v in ids.items()]
        fields.append(f"duration={time.monotonic() - started:.3f}s")
        if error is not None:
            fields.append(f"error={error!r}")
        if code is not None:
            fields += [f"libvirtCode={code}", f"libvirtError={code_name(code)}"]
        trace_log.debug("libvirt call %s", " ".join(fields))
        if trace_log.isEnabledFor(TRACE):
            if xml:
                trace_log.log(TRACE, "libvirt call rpc=%s xml=%s", rpc, xml)
            if isinstance(result, str) and result.lstrip().startswith("<"):
                trace_log.log(TRACE, "libvirt call rpc=%s result=%s", rpc, result)
