"""A TCP relay in front of a real Redis that can lose one reply: the command reaches Redis and
runs, then the relay closes the client's connection instead of forwarding the answer (a
connection that dies while a command's answer is on its way: a Redis restart, a failover, a
dropped NAT entry)."""

from __future__ import annotations

import socket
import threading


class LossyRelay:
    def __init__(self, upstream_port: int) -> None:
        self.upstream_port = upstream_port
        self.sock = socket.socket()
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(16)
        self.port = self.sock.getsockname()[1]
        self.armed: bytes | None = None  # drop the answer of the next command containing this
        self.dropped = 0
        self._lock = threading.Lock()
        threading.Thread(target=self._accept, daemon=True).start()

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def arm(self, marker: bytes = b"EVALSHA") -> None:
        self.armed = marker

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            up = socket.create_connection(("127.0.0.1", self.upstream_port))
            threading.Thread(target=self._serve, args=(conn, up), daemon=True).start()

    def _serve(self, conn: socket.socket, up: socket.socket) -> None:
        pending = threading.Event()

        def client_to_redis():
            try:
                while True:
                    data = conn.recv(65536)
                    if not data:
                        break
                    with self._lock:
                        if self.armed is not None and self.armed in data:
                            self.armed = None
                            pending.set()
                    up.sendall(data)
            except OSError:
                pass
            finally:
                for s in (conn, up):
                    try:
                        s.shutdown(socket.SHUT_RDWR)
                    except OSError:
                        pass

        threading.Thread(target=client_to_redis, daemon=True).start()
        try:
            while True:
                reply = up.recv(65536)
                if not reply:
                    return
                if pending.is_set():
                    if reply.startswith(b"-NOSCRIPT"):
                        with self._lock:
                            self.armed = self.armed or b"EVALSHA"
                        pending.clear()
                    else:
                        self.dropped += 1
                        return  # the command ran; its answer is lost with the connection
                conn.sendall(reply)
        except OSError:
            return
        finally:
            for s in (conn, up):
                try:
                    s.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass
                s.close()

    def close(self) -> None:
        self.sock.close()
