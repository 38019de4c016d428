"""A private redis-server (Debian's ``redis-server``) for the demo and the test session.

Neither touches the machine's own Redis: each starts one on a free loopback port with
persistence off, and stops it at the end.
"""

from __future__ import annotations

import shutil
import socket
import subprocess
import tempfile
import time

from devcluster.loopback import free_port  # imported from here by many tests


class RedisServer:
    """One ``redis-server`` process on 127.0.0.1:<port>.

    :meth:`kill` and :meth:`start` take it down and bring it back on the same port with the
    same settings (persistence off, so it comes back empty), for tests of a Redis outage.

    Args:
        password: when given, Redis requires it (``requirepass``, passed on stdin as a config
            line, so it is in no command line); :attr:`url` stays without it, clients add it
            (``REDIS_PASSWORD``) or use :attr:`authed_url`.
        config: more redis.conf lines, given on stdin after ``requirepass`` (e.g. the ACL
            users of :func:`app.store.acl.config`).

    Raises:
        RuntimeError: redis-server is not installed or did not answer within 10 s.
    """

    def __init__(self, password: str | None = None, config: str = "") -> None:
        self.password = password
        self.config = config
        self.binary = shutil.which("redis-server")
        if self.binary is None:
            raise RuntimeError("redis-server is not installed (apt-get install redis-server)")
        self.port = free_port()
        self.dir = tempfile.mkdtemp(prefix="redis-")
        self.proc: subprocess.Popen | None = None
        self.start()

    def start(self) -> "RedisServer":
        """Start redis-server on :attr:`port` (again, after :meth:`kill`) and wait for PONG.

        Raises:
            RuntimeError: it did not answer within 10 s (the port may have been taken meanwhile).
        """
        argv = [self.binary, "--port", str(self.port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
                 "--dir", self.dir, "--maxclients", "2000"]
        stdin = (f'requirepass "{self.password}"\n' if self.password is not None else "") + self.config
        if stdin:
            argv.insert(1, "-")  # read config lines from stdin first
        self.proc = subprocess.Popen(argv, stdin=subprocess.PIPE if stdin else None,
                                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        if stdin:
            self.proc.stdin.write(stdin.encode())
            self.proc.stdin.close()
        auth = b""
        if self.password is not None:
            pw = self.password.encode()
            auth = b"*2\r\n$4\r\nAUTH\r\n$%d\r\n%s\r\n" % (len(pw), pw)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.2) as s:
                    s.sendall(auth + b"PING\r\n")
                    if s.recv(32).replace(b"+OK\r\n", b"", 1).startswith(b"+PONG"):
                        return self
            except OSError:
                time.sleep(0.02)
        self.stop()
        raise RuntimeError("redis-server did not start")

    def kill(self) -> None:
        """SIGKILL the server (a crash: clients see their connections reset); its directory stays."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(5)

    @property
    def url(self) -> str:
        """``redis://127.0.0.1:<port>/0`` (without the password)."""
        return f"redis://127.0.0.1:{self.port}/0"

    @property
    def authed_url(self) -> str:
        """:attr:`url` with the password, for the test's own clients (never give it to a log)."""
        from app.config.settings import compose_redis_url

        return compose_redis_url(self.url, self.password)

    def stop(self) -> None:
        """Stop the server and remove its directory."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(5)
            except subprocess.TimeoutExpired:
                self.proc.kill()
        shutil.rmtree(self.dir, ignore_errors=True)
