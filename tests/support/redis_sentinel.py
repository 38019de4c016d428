"""A Sentinel-managed Redis for tests: a master, replicas and Sentinels on loopback.

Real ``redis-server`` processes (:class:`devcluster.redis_server.RedisServer`, replicas with
``replicaof``) and real ``redis-sentinel`` processes (Debian's ``redis-sentinel``), each on a
free loopback port, persistence off; :meth:`SentinelRedis.stop` ends them all.
"""

from __future__ import annotations

import shutil
import subprocess
import tempfile
import time
from pathlib import Path

import redis

from devcluster.redis_server import RedisServer, free_port

MASTER_NAME = "proxy-operator"


class SentinelRedis:
    """A master, ``replicas`` replicas and ``sentinels`` Sentinels (quorum: a majority).

    Args:
        replicas: replicas of the master.
        sentinels: Sentinel processes.
        down_after_ms: ``sentinel down-after-milliseconds``: how long the master must be silent
            before a Sentinel deems it down.
        failover_timeout_ms: ``sentinel failover-timeout`` (also the wait before a failed
            failover is tried again).

    Raises:
        RuntimeError: ``redis-sentinel`` is not installed, or a process did not start within 10 s.
    """

    def __init__(self, replicas: int = 2, sentinels: int = 3, down_after_ms: int = 1000,
                 failover_timeout_ms: int = 5000) -> None:
        self.binary = shutil.which("redis-sentinel")
        if self.binary is None:
            raise RuntimeError("redis-sentinel is not installed (apt-get install redis-sentinel)")
        self.dir = Path(tempfile.mkdtemp(prefix="sentinel-"))
        self.servers: list[RedisServer] = []
        self.sentinel_procs: list[subprocess.Popen] = []
        self.sentinel_ports: list[int] = []
        try:
            master = RedisServer()
            self.servers.append(master)
            for _ in range(replicas):
                self.servers.append(RedisServer(config=f"replicaof 127.0.0.1 {master.port}\n"))
            quorum = sentinels // 2 + 1
            for i in range(sentinels):
                port = free_port()
                conf = self.dir / f"sentinel-{i}.conf"  # Sentinel rewrites its config file: writable
                conf.write_text(f"port {port}\nbind 127.0.0.1\ndir {self.dir}\n"
                                f"sentinel monitor {MASTER_NAME} 127.0.0.1 {master.port} {quorum}\n"
                                f"sentinel down-after-milliseconds {MASTER_NAME} {down_after_ms}\n"
                                f"sentinel failover-timeout {MASTER_NAME} {failover_timeout_ms}\n"
                                f"sentinel parallel-syncs {MASTER_NAME} {replicas}\n")
                self.sentinel_procs.append(subprocess.Popen([self.binary, str(conf)], stdout=subprocess.DEVNULL,
                                                            stderr=subprocess.DEVNULL))
                self.sentinel_ports.append(port)
            self._wait_ready(replicas, sentinels)
        except BaseException:
            self.stop()
            raise

    def _wait_ready(self, replicas: int, sentinels: int) -> None:
        """Wait until every replica is in sync and every Sentinel knows the replicas and the others."""
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            try:
                if all(int(self._master_info(p)["num-slaves"]) >= replicas
                       and int(self._master_info(p)["num-other-sentinels"]) >= sentinels - 1
                       for p in self.sentinel_ports) \
                        and self.admin().info("replication")["connected_slaves"] >= replicas:
                    return
            except redis.RedisError:
                pass
            time.sleep(0.1)
        raise RuntimeError("the Sentinels did not discover the replicas and each other within 20 s")

    def _master_info(self, port: int) -> dict:
        reply = self._sentinel(port).execute_command("SENTINEL", "MASTER", MASTER_NAME)
        return dict(zip(reply[::2], reply[1::2]))

    @staticmethod
    def _sentinel(port: int) -> redis.Redis:
        return redis.Redis(host="127.0.0.1", port=port, socket_timeout=2, decode_responses=True)

    @property
    def url(self) -> str:
        """``redis+sentinel://127.0.0.1:<p1>,127.0.0.1:<p2>,.../proxy-operator/0`` (the operator's form)."""
        hosts = ",".join(f"127.0.0.1:{p}" for p in self.sentinel_ports)
        return f"redis+sentinel://{hosts}/{MASTER_NAME}/0"

    def master_port(self) -> int | None:
        """The master's port as the first Sentinel that answers says, or ``None`` (none answers)."""
        for port in self.sentinel_ports:
            try:
                addr = self._sentinel(port).execute_command("SENTINEL", "GET-MASTER-ADDR-BY-NAME", MASTER_NAME)
            except redis.RedisError:
                continue
            if addr:
                return int(addr[1])
        return None

    def server(self, port: int) -> RedisServer:
        """The :class:`RedisServer` on ``port``."""
        return next(s for s in self.servers if s.port == port)

    def master(self) -> RedisServer:
        """The server the Sentinels name the master."""
        return self.server(self.master_port())

    def replicas(self) -> list[RedisServer]:
        """The servers other than the master (running or not)."""
        port = self.master_port()
        return [s for s in self.servers if s.port != port]

    def admin(self, server: RedisServer | None = None) -> redis.Redis:
        """A test-side client of ``server`` (default: the current master)."""
        server = server or self.master()
        return redis.Redis(host="127.0.0.1", port=server.port, socket_timeout=5, decode_responses=True)

    def stop(self) -> None:
        """Stop every Sentinel and server and remove their directories."""
        for proc in self.sentinel_procs:
            if proc.poll() is None:
                proc.terminate()
        for proc in self.sentinel_procs:
            try:
                proc.wait(5)
            except subprocess.TimeoutExpired:
                proc.kill()
        for server in self.servers:
            server.stop()
        shutil.rmtree(self.dir, ignore_errors=True)
