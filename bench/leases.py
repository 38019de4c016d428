"""Lease API benchmark, side by side: the API's server (granian, ``proxy-operator api``) and
its former one (gunicorn gthread, bench/gunicorn_conf.py), each with the trivial-app floor.

Starts a private Redis, publishes N proxies to the serving view and marks them healthy (as
the health engine leaves a healthy proxy), then starts both servers as they are deployed:

* **new**: ``proxy-operator api`` (api/server.py: granian, ``--workers`` 2 x ``API_THREADS``
  4 Python threads, one runtime thread, one shared listening socket, access log on);
* **old**: ``gunicorn -c bench/gunicorn_conf.py 'api:create_app()'`` (2 gthread workers x 4
  threads, one ``SO_REUSEPORT`` socket per worker, no access log: the deploy/ command before
  the API moved to granian, decision 23).

The rounds alternate between the two (old, new, old, new, ...), each on fresh connections:
32 keep-alive connections opened one by one (``--connect-gap`` ms apart), each doing
``POST /v1/leases`` then ``DELETE /v1/leases/<id>`` for the measured period.  Then each
server's floors: the same serving configuration with a trivial app, driven by the same client
(``--no-floor`` skips them), twice: a bare WSGI callable (one static response: the serving
stack alone) and a Flask app with one route and no logic (the serving stack and the API's
framework).  Prints per round:

* lease + release pairs per second (all connections together);
* p50 / p99 of one pair (both requests), milliseconds;
* fairness: the spread of the connections' own p50, and how the connections split between
  the server's worker processes;
* one raw Redis round trip (``PING``) p50 under load;
* CPU milliseconds per pair spent by the server (all processes), Redis and the client;

and a closing table: medians per server, both floors in requests/s (and /2: the most pairs/s
the serving stack could give), the new/old ratio, and the targets (docs/performance.md, "Leases"): new >= 1.4 x old
in the same run, new p99 < 35 ms, new pairs/s >= 40 % of its own floor pairs/s (printed
against each floor; docs/performance.md says which the target is read against, and why).

The client runs in this process on the same cores as the servers, so it is kept lean: one
thread drives every connection through ``selectors`` (``--client threads``: one blocking
thread per connection, as before 2026-12, which costs a quarter more client CPU in GIL
hand-overs) with a minimal HTTP/1.1 client (:class:`RawHTTP`) rather than ``http.client``.

Usage: ``python bench/leases.py [--seconds 10] [--rounds 3] [--connections 32] [--proxies 20]
[--servers old,new] [--worker-threads 4] [--client loop|threads]``.
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import selectors
import statistics
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import redis  # noqa: E402

from app.serving import leases, view as serving  # noqa: E402
from app.store import keys as redis_keys  # noqa: E402
from app.resources import Proxy  # noqa: E402
from devcluster.redis_server import RedisServer, free_port  # noqa: E402
from tests.support.processes import BIN, Process  # noqa: E402

TOKEN = "bench-token-0123456789abcdef"


def percentile(values: list[float], q: float) -> float:
    """Nearest-rank percentile of ``values`` (q in 0..100)."""
    ordered = sorted(values)
    index = max(0, min(len(ordered) - 1, round(q / 100 * len(ordered) + 0.5) - 1))
    return ordered[index]


def seed(r: redis.Redis, count: int, max_leases: int) -> None:
    """Publish ``count`` healthy proxies."""
    for i in range(count):
        proxy = Proxy.from_dict({
            "metadata": {"name": f"bench-{i}", "namespace": "bench", "uid": f"uid-{i:05d}", "labels": {"pool": "a"}},
            "spec": {"mode": "External", "endpoint": {"host": f"203.0.113.{i % 250 + 1}", "port": 3128},
                     "maxLeases": max_leases},
        })
        serving.publish(r, proxy, address=proxy.spec.host, port=3128, phase="Ready")
        r.hset(redis_keys.proxy(proxy.uid), mapping={"health": "healthy", "healthy": "1", "egressIP": "192.0.2.1"})
        leases.reindex(r, proxy.uid)


def ping_p50(r: redis.Redis, n: int = 500) -> float:
    """Median PING round trip in milliseconds."""
    samples = []
    for _ in range(n):
        t0 = time.perf_counter()
        r.ping()
        samples.append((time.perf_counter() - t0) * 1000)
    return statistics.median(samples)


def group_cpu(pgid: int) -> float:
    """CPU seconds (user + system) of every live process in process group ``pgid`` (Linux /proc)."""
    tick = os.sysconf("SC_CLK_TCK")
    total = 0.0
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as fh:
                fields = fh.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[2]) == pgid:  # field 5 (pgrp) is the third after the command
            total += (int(fields[11]) + int(fields[12])) / tick  # utime, stime
    return total


def redis_cpu(r: redis.Redis) -> float:
    """CPU seconds Redis has used (INFO cpu)."""
    info = r.info("cpu")
    return float(info["used_cpu_user"]) + float(info["used_cpu_sys"])


def request_bytes(method: str, path: str, host: str, body: bytes = b"") -> bytes:
    """One HTTP/1.1 keep-alive request with the bench client's bearer token, as bytes."""
    head = (f"{method} {path} HTTP/1.1\r\nHost: {host}\r\nAuthorization: Bearer {TOKEN}\r\n"
            f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n")
    return head.encode("ascii") + body


class RawHTTP:
    """A minimal HTTP/1.1 keep-alive client for the load generator.

    The load generator shares the machine's two cores with the server under test, so it is
    kept lean: it writes prebuilt requests and reads responses framed by ``Content-Length``
    (what the API always sends), where ``http.client`` parses every header block through
    ``email.parser`` (measured: 0.25 ms of client CPU per pair with ``http.client``; see
    docs/performance.md).

    Raises (from :meth:`exchange`, :meth:`fill` and :meth:`take`):
        OSError: the connection failed or closed mid-response.
        ValueError: a response without ``Content-Length`` or with a malformed status line.
    """

    def __init__(self, host: str, port: int, timeout: float = 30) -> None:
        import socket

        self.sock = socket.create_connection((host, port), timeout=timeout)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.buf = b""

    def exchange(self, request: bytes) -> tuple[int, bytes]:
        """Send ``request``; return ``(status, body)`` of its response."""
        self.sock.sendall(request)
        while True:
            got = self.take()
            if got is not None:
                return got
            self.fill()

    def take(self) -> tuple[int, bytes] | None:
        """``(status, body)`` of the response read so far, or ``None`` while it is incomplete."""
        end = self.buf.find(b"\r\n\r\n")
        if end < 0:
            return None
        head, rest = self.buf[:end], self.buf[end + 4:]
        lines = head.split(b"\r\n")
        parts = lines[0].split(b" ", 2)
        if len(parts) < 2 or not parts[0].startswith(b"HTTP/1.") or not parts[1].isdigit():
            raise ValueError(f"malformed status line {lines[0][:80]!r}")
        length = None
        for line in lines[1:]:
            name, _, value = line.partition(b":")
            if name.strip().lower() == b"content-length":
                length = int(value)
        if length is None:
            raise ValueError(f"response without Content-Length: {head[:200]!r}")
        if len(rest) < length:
            return None
        self.buf = rest[length:]
        return int(parts[1]), rest[:length]

    def fill(self) -> None:
        """Read what the server sent (blocks until something arrives)."""
        chunk = self.sock.recv(65536)
        if not chunk:
            raise ConnectionResetError("server closed the connection")
        self.buf += chunk

    def close(self) -> None:
        """Close the connection."""
        self.sock.close()


class Session:
    """What one client connection does: :meth:`first` gives its first request, :meth:`answer`
    takes each response and gives the next request, ``None`` to stop."""

    def first(self) -> bytes | None:
        raise NotImplementedError

    def answer(self, status: int, body: bytes) -> bytes | None:
        raise NotImplementedError


def drive(port: int, conns: list[RawHTTP], sessions: list[Session], errors: list[str], mode: str) -> None:
    """Run ``sessions[i]`` on ``conns[i]`` until every session stopped; a connection that fails
    is noted in ``errors``, replaced, and its session starts over (:meth:`Session.first`).

    ``mode`` ``loop``: one thread drives every connection (``selectors``: the load generator
    costs less CPU, and no GIL hand-over between client threads); ``threads``: one thread per
    connection, blocking.
    """
    def reconnect(i: int, exc: Exception) -> bytes | None:
        errors.append(repr(exc))
        conns[i].close()
        conns[i] = RawHTTP("127.0.0.1", port)
        return sessions[i].first()

    if mode == "threads":
        def run(i: int) -> None:
            req = sessions[i].first()
            while req is not None:
                try:
                    req = sessions[i].answer(*conns[i].exchange(req))
                except (OSError, ValueError) as exc:
                    req = reconnect(i, exc)
            conns[i].close()

        threads = [threading.Thread(target=run, args=(i,)) for i in range(len(conns))]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        return

    sel = selectors.DefaultSelector()
    live = 0

    def send(i: int, req: bytes | None) -> None:
        nonlocal live
        while req is not None:
            try:
                conns[i].sock.sendall(req)
                sel.register(conns[i].sock, selectors.EVENT_READ, i)
                live += 1
                return
            except OSError as exc:
                req = reconnect(i, exc)
        conns[i].close()

    for i in range(len(conns)):
        send(i, sessions[i].first())
    while live:
        events = sel.select(timeout=30)
        if not events:
            raise SystemExit(f"no response on {live} connections for 30 s")
        for key, _ in events:
            i = key.data
            try:
                conns[i].fill()
                got = conns[i].take()
                if got is None:
                    continue
                req = sessions[i].answer(*got)
            except (OSError, ValueError) as exc:
                sel.unregister(key.fileobj)
                live -= 1
                send(i, reconnect(i, exc))
                continue
            if req is None:
                sel.unregister(key.fileobj)
                live -= 1
                conns[i].close()
            else:
                try:
                    conns[i].sock.sendall(req)
                except OSError as exc:
                    sel.unregister(key.fileobj)
                    live -= 1
                    send(i, reconnect(i, exc))
    sel.close()


def connection_split(master_pid: int, port: int) -> list[int]:
    """How many established TCP connections on ``port`` each child of ``master_pid`` holds,
    largest first (Linux: ``/proc/net/tcp`` matched to the children's socket inodes)."""
    inodes: set[str] = set()
    with open("/proc/net/tcp") as fh:
        next(fh)
        for line in fh:
            fields = line.split()
            if int(fields[1].rsplit(":", 1)[1], 16) == port and fields[3] == "01":  # ESTABLISHED
                inodes.add(fields[9])
    counts = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as fh:
                if int(fh.read().rsplit(")", 1)[1].split()[1]) != master_pid:  # ppid
                    continue
            links = [os.readlink(f"/proc/{entry}/fd/{fd}") for fd in os.listdir(f"/proc/{entry}/fd")]
        except OSError:
            continue
        counts.append(sum(1 for link in links if link.startswith("socket:[") and link[8:-1] in inodes))
    return sorted(counts, reverse=True)


def wait_http(host: str, port: int, path: str = "/healthz", timeout: float = 30) -> None:
    """Poll ``GET path`` until it answers 200; exit the benchmark after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            conn = http.client.HTTPConnection(host, port, timeout=1)
            conn.request("GET", path)
            status = conn.getresponse().status
            conn.close()
            if status == 200:
                return
        except OSError:
            pass
        time.sleep(0.1)
    raise SystemExit(f"the server on port {port} did not answer {path}")


FLOOR_LABELS = {"wsgi": "WSGI callable", "flask": "Flask app"}
FLOOR_APPS = {
    # a bare WSGI callable: the serving stack alone
    "wsgi": """def app(environ, start_response):
    start_response("200 OK", [("Content-Type", "application/json"), ("Content-Length", "2")])
    return [b"{}"]
""",
    # the API's framework with one route and no logic: the serving stack and Flask
    "flask": """from flask import Flask

app = Flask(__name__)


@app.get("/")
def index():
    return app.response_class(b"{}", mimetype="application/json")
""",
}


class FloorSession(Session):
    """``GET /`` on the floor app until ``stop`` (``time.perf_counter``), counting answers."""

    def __init__(self, get: bytes, stop: float) -> None:
        self.get, self.stop, self.count = get, stop, 0

    def first(self) -> bytes | None:
        return self.get if time.perf_counter() < self.stop else None

    def answer(self, status: int, body: bytes) -> bytes | None:
        self.count += 1
        return self.first()


def floor(server: "Server", workdir: str, args, seconds: float, kind: str) -> tuple[float, float, float]:
    """Requests/s, server CPU ms per request and client CPU ms per request of a trivial app
    (``kind``: a key of :data:`FLOOR_APPS`) served the way ``server`` serves the API, driven by
    the same client as the rounds."""
    Path(workdir, "floorapp.py").write_text(FLOOR_APPS[kind])
    port = free_port()
    proc = server.start_floor(port, workdir)
    try:
        wait_http("127.0.0.1", port, "/")
        get = request_bytes("GET", "/", f"127.0.0.1:{port}")
        conns = [RawHTTP("127.0.0.1", port) for _ in range(args.threads)]
        sessions = [FloorSession(get, time.perf_counter() + seconds) for _ in conns]
        cpu0, srv0 = os.times(), group_cpu(proc.proc.pid)
        drive(port, conns, sessions, [], args.client)
        cpu1, srv1 = os.times(), group_cpu(proc.proc.pid)
        total = max(sum(x.count for x in sessions), 1)
        client = cpu1.user - cpu0.user + cpu1.system - cpu0.system
        return total / seconds, (srv1 - srv0) / total * 1000, client / total * 1000
    finally:
        proc.stop()


class Server:
    """One of the servers compared: how to start it with the API, and with the floor app.

    Args:
        key: ``"old"`` or ``"new"``.
        label: how the tables name it.
        env: environment of its processes (Redis, tokens, ...).
        args: the parsed command line (workers, threads).
        workdir: where logs and the floor app go.
    """

    def __init__(self, key: str, label: str, env: dict[str, str], args, workdir: str) -> None:
        self.key, self.label, self.env, self.args, self.workdir = key, label, env, args, workdir
        self.port = free_port()
        self.proc: Process | None = None

    def _gunicorn(self, port: int, app: str, extra: list[str] = ()) -> list[str]:
        return [str(BIN / "gunicorn"), "-c", str(ROOT / "bench" / "gunicorn_conf.py"), "--log-level", "warning",
                "-w", str(self.args.workers), "-k", "gthread", "--threads", str(self.args.worker_threads),
                *extra, "-b", f"127.0.0.1:{port}", app]

    def _env(self) -> dict[str, str]:
        return {**self.env, "API_WORKERS": str(self.args.workers), "API_THREADS": str(self.args.worker_threads)}

    def start(self) -> None:
        """Start the API under this server (as deployed) and wait until it answers."""
        if self.key == "old":
            argv = self._gunicorn(self.port, "api:create_app()")
            # as deploy/ ran it: a fresh multiprocess directory (prometheus-client would take an
            # empty value for the current directory)
            metrics_dir = tempfile.mkdtemp(prefix="bench-metrics-", dir=self.workdir)
        else:
            argv = [str(BIN / "proxy-operator"), "api", "--bind", f"127.0.0.1:{self.port}"]
            metrics_dir = ""  # the command makes its own
        self.proc = Process(f"api-{self.key}", argv, {**self._env(), "PROMETHEUS_MULTIPROC_DIR": metrics_dir},
                            self.workdir).start()
        wait_http("127.0.0.1", self.port)

    def start_floor(self, port: int, workdir: str) -> Process:
        """Start the trivial app under the same serving configuration."""
        if self.key == "old":
            argv = self._gunicorn(port, "floorapp:app", ["--chdir", workdir])
        else:
            code = ("import sys; from api import server; s = server.ServerSettings.from_env(); "
                    "server.run(s, server.listen(s.host, s.port), target='floorapp:app', factory=False)")
            argv = [sys.executable, "-c", code]
        env = {**self._env(), "API_BIND": f"127.0.0.1:{port}", "PYTHONPATH": f"{workdir}:{ROOT}",
               "PROMETHEUS_MULTIPROC_DIR": tempfile.mkdtemp(prefix="bench-metrics-", dir=workdir)}
        return Process(f"floor-{self.key}", argv, env, workdir).start()

    def stop(self) -> None:
        """Stop the API process."""
        if self.proc is not None:
            self.proc.stop()


@dataclass
class Round:
    """What one measured round gave."""

    pairs_per_s: float
    p50: float
    p99: float
    thread_p50s: list[float]
    split: list[int]
    loaded_ping: float
    errors: list[str]
    cpu_server: float  # ms per pair
    cpu_redis: float
    cpu_client: float


def lease_id(body: bytes) -> str:
    """The ``leaseId`` of a ``201`` lease answer: the API writes it first, so it is read
    without decoding the JSON (the client's CPU counts against the server's)."""
    if body.startswith(b'{"leaseId":"') and body[44:45] == b'"':
        return body[12:44].decode("ascii")
    return json.loads(body)["leaseId"]


def release_template(host: str):
    """``lease id -> DELETE /v1/leases/<id>`` request bytes, the head built once."""
    head, _, tail = request_bytes("DELETE", "/v1/leases/{}", host).partition(b"{}")
    return lambda lid: head + lid.encode("ascii") + tail


class PairSession(Session):
    """``POST /v1/leases`` then ``DELETE /v1/leases/<id>``, again and again until ``stop``;
    the latency of each pair started after ``record_from`` (``time.perf_counter``) goes to
    ``latencies`` (ms), unexpected answers to ``errors``."""

    def __init__(self, host: str, lease: bytes, record_from: float, stop: float, latencies: list[float],
                 errors: list[str]) -> None:
        self.host, self.lease, self.record_from, self.stop = host, lease, record_from, stop
        self.release = release_template(host)
        self.latencies, self.errors = latencies, errors
        self.t0, self.releasing = 0.0, False

    def first(self) -> bytes | None:
        self.t0, self.releasing = time.perf_counter(), False
        return self.lease if self.t0 < self.stop else None

    def answer(self, status: int, body: bytes) -> bytes | None:
        if not self.releasing:
            if status != 201:
                self.errors.append(f"lease {status} {body[:200]!r}")
                return self.first()
            self.releasing = True
            return self.release(lease_id(body))
        if status != 200:
            self.errors.append(f"release {status} {body[:200]!r}")
        elif self.t0 >= self.record_from:
            self.latencies.append((time.perf_counter() - self.t0) * 1000)
        return self.first()


def run_round(args, port: int, server_pid: int, r: redis.Redis) -> Round:
    """Open ``args.threads`` keep-alive connections, run lease + release pairs on each for
    ``args.warmup`` + ``args.seconds``, and measure the last ``args.seconds``."""
    host = f"127.0.0.1:{port}"
    lease_request = request_bytes("POST", "/v1/leases", host, json.dumps({"ttlSeconds": 60}).encode())
    lat: list[list[float]] = [[] for _ in range(args.threads)]
    errors: list[str] = []
    # Crawlers do not all connect in the same millisecond: open the keep-alive connections one
    # by one. Which worker serves each is the kernel's choice (gunicorn: the address hash over
    # its SO_REUSEPORT sockets; granian: whichever worker accepts first on the shared
    # socket); connection_split shows it, as the split decides the tail latency.
    conns = []
    for _ in range(args.threads):
        conns.append(RawHTTP("127.0.0.1", port))
        time.sleep(args.connect_gap / 1000)
    split = connection_split(server_pid, port)
    now = time.perf_counter()
    sessions = [PairSession(host, lease_request, now + args.warmup, now + args.warmup + args.seconds, lat[i], errors)
                for i in range(args.threads)]
    client = threading.Thread(target=drive, args=(port, conns, sessions, errors, args.client))
    client.start()
    time.sleep(args.warmup)
    cpu0, srv0, red0 = os.times(), group_cpu(server_pid), redis_cpu(r)
    time.sleep(args.seconds / 2)
    loaded_ping = ping_p50(r, 200)
    client.join()
    cpu1, srv1, red1 = os.times(), group_cpu(server_pid), redis_cpu(r)
    all_lat = [x for per in lat for x in per]
    pairs = max(len(all_lat), 1)
    per = lambda cpu: cpu / pairs * 1000  # noqa: E731
    return Round(
        pairs_per_s=len(all_lat) / args.seconds,
        p50=percentile(all_lat, 50) if all_lat else float("nan"),
        p99=percentile(all_lat, 99) if all_lat else float("nan"),
        thread_p50s=sorted(statistics.median(x) for x in lat if x), split=split, loaded_ping=loaded_ping,
        errors=errors, cpu_server=per(srv1 - srv0), cpu_redis=per(red1 - red0),
        cpu_client=per(cpu1.user - cpu0.user + cpu1.system - cpu0.system))


def print_round(res: Round) -> None:
    """Print one round's figures."""
    print(f"  pairs/s (lease+release): {res.pairs_per_s:,.0f}")
    print(f"  pair latency p50: {res.p50:.1f} ms   p99: {res.p99:.1f} ms")
    if res.thread_p50s:
        print(f"  fairness: per-connection p50 from {res.thread_p50s[0]:.1f} to {res.thread_p50s[-1]:.1f} ms; "
              f"client connections per worker: {' / '.join(map(str, res.split))}")
    print(f"  raw Redis round trip (PING) p50 under load: {res.loaded_ping:.3f} ms")
    print(f"  errors: {len(res.errors)}" + (f" (first: {res.errors[0]})" if res.errors else ""))
    print(f"  CPU per pair: server {res.cpu_server:.2f} ms, Redis {res.cpu_redis:.2f} ms, "
          f"client {res.cpu_client:.2f} ms (measured window)")


def summary(servers: list[Server], results: dict[str, list[Round]],
            floors: dict[tuple[str, str], tuple[float, float]]) -> None:
    """Print the side-by-side table, the new/old ratio and the targets.

    ``floors`` maps (server key, floor kind) to (requests/s, server CPU ms per request); a
    missing floor prints ``-``.  The lease/floor ratio is pairs/s ÷ (floor requests/s ÷ 2), once
    against each trivial app of :data:`FLOOR_APPS`.
    """
    nan = float("nan")
    rows = {}
    print()
    print(f"{'server':<34} {'pairs/s median (min-max)':<26} {'p99 median (worst)':<20} {'CPU/pair':<9} "
          f"{'floor req/s WSGI / Flask':<26} {'lease/floor WSGI / Flask':<24}")
    for srv in servers:
        got = results[srv.key]
        rates, p99s = [x.pairs_per_s for x in got], [x.p99 for x in got]
        rate, p99 = statistics.median(rates), statistics.median(p99s)
        cpu = statistics.median(x.cpu_server for x in got)
        floor_rps = {kind: floors.get((srv.key, kind), (nan, 0.0))[0] for kind in FLOOR_APPS}
        rows[srv.key] = (rate, p99, floor_rps)
        shares = " / ".join(f"{rate / (x / 2):.0%}" if x == x else "-" for x in floor_rps.values())
        print(f"{srv.label:<34} {f'{rate:,.0f} ({min(rates):,.0f}-{max(rates):,.0f})':<26} "
              f"{f'{p99:.1f} ms ({max(p99s):.1f})':<20} {f'{cpu:.2f} ms':<9} "
              f"{' / '.join(f'{x:,.0f}' if x == x else '-' for x in floor_rps.values()):<26} {shares:<24}")
    if "old" in rows and "new" in rows:
        ratio = rows["new"][0] / rows["old"][0]
        paired = [n.pairs_per_s / o.pairs_per_s for o, n in zip(results["old"], results["new"])]
        print(f"new / old pairs/s: {ratio:.2f}x (per round pair: {', '.join(f'{x:.2f}' for x in paired)})")
    if "new" in rows:
        rate, p99, floor_rps = rows["new"]
        checks = [("new p99 < 35 ms", p99 < 35)]
        if "old" in rows:
            checks.insert(0, ("new >= 1.4 x old pairs/s", rate / rows["old"][0] >= 1.4))
        for kind, x in floor_rps.items():
            if x == x:
                checks.append((f"new pairs/s >= 40% of its {FLOOR_LABELS[kind]} floor/2", rate >= 0.4 * x / 2))
        print("targets: " + "; ".join(f"{name}: {'met' if ok else 'NOT met'}" for name, ok in checks))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seconds", type=float, default=10.0)
    ap.add_argument("--warmup", type=float, default=2.0)
    ap.add_argument("--rounds", type=int, default=3, help="measured rounds per server, each on fresh connections")
    ap.add_argument("--connections", "--threads", dest="threads", type=int, default=32,
                    help="client keep-alive connections")
    ap.add_argument("--client", choices=("loop", "threads"), default="loop",
                    help="loop: one client thread drives every connection; threads: one thread per connection "
                         "(the client before 2026-12)")
    ap.add_argument("--proxies", type=int, default=20)
    ap.add_argument("--max-leases", type=int, default=10)
    ap.add_argument("--workers", type=int, default=2, help="worker processes of either server")
    ap.add_argument("--worker-threads", type=int, default=4, help="Python threads per worker (API_THREADS)")
    ap.add_argument("--servers", default="old,new", help="which servers to run: old, new or both (old,new)")
    ap.add_argument("--connect-gap", type=float, default=5.0,
                    help="milliseconds between opening two client connections")
    ap.add_argument("--no-floor", action="store_true", help="skip the trivial-app floor measurements")
    args = ap.parse_args()
    labels = {"old": f"gunicorn gthread (old), {args.workers}x{args.worker_threads}",
              "new": f"granian (new), {args.workers}x{args.worker_threads}"}
    keys = [k for k in ("old", "new") if k in args.servers.split(",")]
    if not keys:
        raise SystemExit("--servers: name old, new or both")

    redis_server = RedisServer()
    workdir = tempfile.mkdtemp(prefix="bench-leases-")
    tokens = Path(workdir) / "tokens.yaml"
    tokens.write_text(f"sharedNamespaces: [\"*\"]\nclients:\n  - name: bench\n    token: {TOKEN}\n")
    r = redis.Redis.from_url(redis_server.url, decode_responses=True)
    seed(r, args.proxies, args.max_leases)
    env = {"REDIS_URL": redis_server.url, "API_TOKENS_FILE": str(tokens)}
    servers = [Server(k, labels[k], env, args, workdir) for k in keys]
    results: dict[str, list[Round]] = {k: [] for k in keys}
    floors: dict[tuple[str, str], tuple[float, float]] = {}
    try:
        for srv in servers:
            srv.start()
        print(f"lease bench: {' vs '.join(s.label for s in servers)}; {args.threads} client connections "
              f"({'one client thread' if args.client == 'loop' else 'a client thread each'}), "
              f"{args.proxies} proxies x maxLeases {args.max_leases}, {args.seconds:.0f} s measured after "
              f"{args.warmup:.0f} s warm-up, {args.rounds} rounds each, alternating; {os.cpu_count()} CPUs; "
              f"load average {os.getloadavg()[0]:.1f}")
        print(f"  raw Redis round trip (PING) p50 when idle: {ping_p50(r):.3f} ms")
        for n in range(args.rounds):
            for srv in servers:
                print(f"round {n + 1} of {args.rounds}, {srv.label}:")
                results[srv.key].append(run_round(args, srv.port, srv.proc.proc.pid, r))
                print_round(results[srv.key][-1])
        print(f"  load average after the lease rounds: {os.getloadavg()[0]:.1f}")
        for srv in servers:
            srv.stop()
        if not args.no_floor:
            for srv in servers:
                for kind in FLOOR_APPS:
                    rps, ms, client_ms = floor(srv, workdir, args, min(args.seconds, 6), kind)
                    floors[srv.key, kind] = (rps, ms)
                    print(f"  serving floor of {srv.label} (trivial {FLOOR_LABELS[kind]}, {args.threads} "
                          f"connections): {rps:,.0f} requests/s = {rps / 2:,.0f} pairs/s at most; CPU per "
                          f"request: server {ms:.3f} ms, client {client_ms:.3f} ms")
        summary(servers, results, floors)
    finally:
        for srv in servers:
            srv.stop()
        redis_server.stop()


if __name__ == "__main__":
    main()
