"""How the API is served: granian's WSGI server, as ``proxy-operator api`` runs it.

One place for the serving configuration, used by ``proxy-operator api`` (and so by
deploy/base/api.yaml and docker-compose.yml, which run that command) and by bench/leases.py,
so the benchmark measures what is deployed.

* **granian** (Rust, hyper and tokio) owns the connections; the Flask app runs on
  ``API_THREADS`` Python threads per worker process (``API_WORKERS``).  A connection costs a
  Python thread only while a complete request head is being answered: slow, half-sent or
  silent clients and idle keep-alive connections wait in the Rust runtime, so they cannot
  take the threads the way they took gunicorn's gthread workers (decision 23).
* **Idle and slow connections are closed** after ``API_IDLE_TIMEOUT_SECONDS`` (default 30,
  at most 60): a connection must deliver a complete request head within that time of opening
  or of its previous response, or it is closed.  This is hyper's header-read timeout; it
  covers new connections only because the server speaks HTTP/1.1 alone (with HTTP/2
  auto-detection, granian first waits for the protocol preface with no time limit).
  Crawlers that keep a connection between lease and release reconnect after a longer pause.
* **One listening socket, bound here** without ``SO_REUSEPORT`` before the workers are
  forked; they all accept on it.  granian by itself gives each worker its own
  ``SO_REUSEPORT`` socket on Linux, which lets any other process of the same user bind the
  same address and silently take a share of the connections (a second API started by
  mistake, with other tokens, answered random 401s).  Here a busy address stops the start
  with :class:`AddressInUse`.  The kernel hands a new connection to whichever worker accepts
  first, so a few long-lived connections may split unevenly (bench/leases.py prints the split).
* **Graceful stop**: on SIGTERM (or SIGINT) the server stops accepting, lets the requests in
  progress finish and answer, then exits 0.  A worker still busy after
  ``API_GRACEFUL_TIMEOUT_SECONDS`` (default 20) is killed.  A worker that dies is replaced.
* **Logs**: the server's own records (logger ``_granian``), the access log (one line per
  request: client address, method, path, status, duration; never headers, bodies or the query
  string; written by :class:`AccessLog` in each worker on granian's ``granian.access`` logger)
  and the application's records go to stderr in the format of :mod:`app.observability.logs`
  (``LOG_FORMAT=json``: one JSON object per line; access lines add ``http`` fields) at
  ``LOG_LEVEL`` (the access log is INFO: ``LOG_LEVEL=WARNING`` turns it off).
* **Metrics**: the caller sets ``PROMETHEUS_MULTIPROC_DIR`` up before anything imports
  prometheus-client (:mod:`app.observability.multiproc`), so ``/metrics`` sums the counters of every worker.

Settings (environment; ``--bind`` and ``--workers`` of ``proxy-operator api`` win):
``API_BIND`` (``127.0.0.1:8080``), ``API_WORKERS`` (2), ``API_THREADS`` (4),
``API_IDLE_TIMEOUT_SECONDS`` (30), ``API_GRACEFUL_TIMEOUT_SECONDS`` (20).
"""

from __future__ import annotations

import errno
import functools
import importlib
import json
import logging
import os
import re
import socket
import time
from dataclasses import dataclass
from typing import Any, Callable

from app.observability.logs import TRACE, JsonFormatter
from app.config.settings import env_number

log = logging.getLogger("proxy_operator.api")

DEFAULT_BIND = "127.0.0.1:8080"
#: Connections the kernel queues before a worker accepts them.
BACKLOG = 1024
#: hyper's header-read timeout is given in milliseconds, 1 to 60,000.
MAX_IDLE_TIMEOUT = 60
#: granian kills a worker still busy this many seconds after it was asked to stop, at most.
MAX_GRACEFUL_TIMEOUT = 1800
ACCESS_LOGGER = "granian.access"
#: The access line: no headers, no query string, no body (they may carry tokens).
ACCESS_FORMAT = '%(addr)s "%(method)s %(path)s %(protocol)s" %(status)d %(dt_ms).1fms'
#: Variables of the gunicorn era that no longer mean anything (a warning names them).
RETIRED = ("API_KEEPALIVE_SECONDS", "API_REUSE_PORT")


class AddressInUse(OSError):
    """Another socket already listens on the address (the message names it)."""


@dataclass(frozen=True)
class ServerSettings:
    """How the API is served.

    Attributes:
        host / port: where to listen (``API_BIND``, ``host:port``; ``[::1]:8080`` for IPv6,
            ``:8080`` for every IPv4 interface).
        workers: worker processes (``API_WORKERS``).
        threads: Python threads per worker running the app (``API_THREADS``).
        idle_timeout: seconds a connection may take to deliver a complete request head after
            it opened or after its previous response (``API_IDLE_TIMEOUT_SECONDS``, 1-60).
        graceful_timeout: seconds a stopping worker gets to finish its requests
            (``API_GRACEFUL_TIMEOUT_SECONDS``, 1-1800).
        backlog: the listening socket's accept queue.
    """

    host: str = "127.0.0.1"
    port: int = 8080
    workers: int = 2
    threads: int = 4
    idle_timeout: float = 30.0
    graceful_timeout: float = 20.0
    backlog: int = BACKLOG

    @property
    def address(self) -> str:
        """``host:port`` as given (IPv6 hosts in brackets)."""
        return f"[{self.host}]:{self.port}" if ":" in self.host else f"{self.host}:{self.port}"

    @classmethod
    def from_env(cls, bind: str | None = None, workers: int | None = None) -> "ServerSettings":
        """Read the settings from the environment; ``bind`` and ``workers`` (command-line
        flags) win over ``API_BIND`` and ``API_WORKERS``.

        Raises:
            ValueError: a malformed value; the message names the variable (or the flag).
        """
        host, port = parse_bind(bind or os.environ.get("API_BIND") or DEFAULT_BIND)
        idle = env_number("API_IDLE_TIMEOUT_SECONDS", cls.idle_timeout, minimum=1)
        if idle > MAX_IDLE_TIMEOUT:
            raise ValueError(f"environment variable API_IDLE_TIMEOUT_SECONDS: must be at most "
                             f"{MAX_IDLE_TIMEOUT}, got {os.environ['API_IDLE_TIMEOUT_SECONDS']!r}")
        graceful = env_number("API_GRACEFUL_TIMEOUT_SECONDS", cls.graceful_timeout, minimum=1, integer=True)
        if graceful > MAX_GRACEFUL_TIMEOUT:
            raise ValueError(f"environment variable API_GRACEFUL_TIMEOUT_SECONDS: must be at most "
                             f"{MAX_GRACEFUL_TIMEOUT}, got {os.environ['API_GRACEFUL_TIMEOUT_SECONDS']!r}")
        return cls(
            host=host, port=port,
            workers=workers or int(env_number("API_WORKERS", cls.workers, minimum=1, integer=True)),
            threads=int(env_number("API_THREADS", cls.threads, minimum=1, integer=True)),
            idle_timeout=float(idle), graceful_timeout=float(graceful),
        )


def parse_bind(text: str) -> tuple[str, int]:
    """Split ``host:port`` (``[v6]:port``; an empty host means ``0.0.0.0``).

    Raises:
        ValueError: no port, or a port outside 1-65535 (the message quotes the value).
    """
    raw = text.strip()
    host, sep, port = raw.rpartition(":")
    if not sep or not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(f"bind address {text!r}: expected host:port with a port from 1 to 65535")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    return host or "0.0.0.0", int(port)


def listen(host: str, port: int, backlog: int = BACKLOG) -> socket.socket:
    """Bind and listen on ``host:port`` without ``SO_REUSEPORT``: no other socket can join.

    ``SO_REUSEADDR`` is set (on Linux it only lets the address be reused while connections of
    an earlier server linger in TIME_WAIT; it never admits a second listener).  The socket is
    inheritable, for the forked workers.

    Returns:
        the listening socket.
    Raises:
        AddressInUse: something already listens on the address (message:
            ``<host>:<port>: address already in use``).
        OSError: any other failure (an unknown host, a privileged port), naming the address.
    """
    where = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
    try:
        family, kind, proto, _, sockaddr = socket.getaddrinfo(
            host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)[0]
    except socket.gaierror as exc:
        raise OSError(errno.EINVAL, f"{where}: cannot resolve the host: {exc.strerror}") from None
    sock = socket.socket(family, kind, proto)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(sockaddr)
        sock.listen(backlog)
    except OSError as exc:
        sock.close()
        if exc.errno == errno.EADDRINUSE:
            raise AddressInUse(exc.errno, f"{where}: address already in use (is another API or "
                                          "server running there?)") from None
        raise OSError(exc.errno, f"{where}: {exc.strerror}") from None
    sock.set_inheritable(True)
    return sock


_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f\\]")


def _escaped(record: logging.LogRecord) -> dict | None:
    """The access record's fields with control characters of the (percent-decoded) path
    escaped, so a path such as ``/x%0a<forged line>`` stays on its own log line; ``None``
    for any other record."""
    if record.name != ACCESS_LOGGER or not isinstance(record.args, dict):
        return None
    path = str(record.args.get("path", ""))
    if path.isascii() and path.isprintable() and "\\" not in path:  # nothing to escape (the usual)
        return record.args
    return {**record.args, "path": _CONTROL.sub(lambda m: f"\\x{ord(m.group()):02x}", path)}


class AccessTextFormatter(logging.Formatter):
    """The :mod:`app.observability.logs` text format; access lines get their path escaped (:func:`_escaped`)."""

    _second: tuple[int, str] = (-1, "")

    def format(self, record: logging.LogRecord) -> str:
        fields = _escaped(record)
        if fields is not None:
            record.args = fields
        return super().format(record)

    def formatTime(self, record: logging.LogRecord, datefmt: str | None = None) -> str:
        """:meth:`logging.Formatter.formatTime`'s text, its date and time part formatted once a
        second rather than for every record (every request writes one)."""
        if datefmt:
            return super().formatTime(record, datefmt)
        second, text = self._second
        if second != int(record.created):
            second = int(record.created)
            text = time.strftime(self.default_time_format, self.converter(second))
            self._second = (second, text)
        return (self.default_msec_format or "%s,%03d") % (text, record.msecs)


class AccessJsonFormatter(JsonFormatter):
    """:class:`app.observability.logs.JsonFormatter`; an access record also gets
    ``http: {remote, method, path, protocol, status, durationMs}`` (path escaped as in
    :func:`_escaped`)."""

    def format(self, record: logging.LogRecord) -> str:
        a = _escaped(record)
        if a is None:
            return super().format(record)
        record.args = a
        out = self.fields(record)
        out["http"] = {"remote": a.get("addr"), "method": a.get("method"), "path": a.get("path"),
                       "protocol": a.get("protocol"), "status": a.get("status"),
                       "durationMs": round(float(a.get("dt_ms") or 0.0), 3)}
        return json.dumps(out)


def log_level() -> int:
    """``LOG_LEVEL`` (default INFO) as a number; ``TRACE`` is :data:`app.observability.logs.TRACE`.

    Raises:
        ValueError: an unknown level name, naming the variable.
    """
    name = (os.environ.get("LOG_LEVEL") or "INFO").strip().upper()
    if name == "TRACE":
        return TRACE
    level = logging.getLevelName(name)
    if not isinstance(level, int):
        raise ValueError(f"environment variable LOG_LEVEL: unknown level {name!r}")
    return level


def logging_config(json_format: bool, level: int) -> dict:
    """The ``logging.config.dictConfig`` document granian applies in its main process and in
    every worker: the root logger (the app), granian's own logger and its access log, all to
    stderr in the :mod:`app.observability.logs` format at ``level``."""
    formatter = ({"()": f"{__name__}.AccessJsonFormatter"} if json_format
                 else {"()": f"{__name__}.AccessTextFormatter",
                       "fmt": "%(asctime)s %(levelname)s %(name)s %(message)s"})
    handler = {"class": "logging.StreamHandler", "formatter": "default", "stream": "ext://sys.stderr"}
    return {
        "version": 1, "disable_existing_loggers": False,
        "formatters": {"default": formatter},
        "handlers": {"stderr": handler},
        "root": {"handlers": ["stderr"], "level": level},
        "loggers": {name: {"handlers": ["stderr"], "level": level, "propagate": False}
                    for name in ("_granian", ACCESS_LOGGER)},
    }


class AccessLog:
    """WSGI middleware writing the access log: one INFO record per request on the
    ``granian.access`` logger, message :data:`ACCESS_FORMAT`, arguments ``addr method path
    protocol status dt_ms`` (what the formatters above read), after the application returned
    (500 when it raised).

    It stands in for granian's own access log (``log_access``), which writes the same record
    but also formats a timestamp and builds two dictionaries that the format never uses: a
    quarter of the access log's CPU, and the access log is two records per lease pair
    (docs/performance.md).
    """

    def __init__(self, app: Callable[..., Any]) -> None:
        self.app = app
        self.log = logging.getLogger(ACCESS_LOGGER)

    def __call__(self, environ: dict, start_response):
        started = time.perf_counter()
        status = 200  # as granian, for an application that has not called start_response yet

        def respond(line: str, headers, exc_info=None):
            nonlocal status
            status = int(line.split(" ", 1)[0])
            return start_response(line, headers, exc_info)

        try:
            body = self.app(environ, respond)
        except BaseException:
            status = 500
            raise
        finally:
            self.log.info(ACCESS_FORMAT, {
                "addr": environ.get("REMOTE_ADDR", ""), "method": environ.get("REQUEST_METHOD", ""),
                "path": environ.get("PATH_INFO", ""), "protocol": environ.get("SERVER_PROTOCOL", ""),
                "status": status, "dt_ms": (time.perf_counter() - started) * 1000})
        return body


def lean_log_records() -> None:
    """Have log records skip what no format here shows but every record computes by default:
    the caller's file, line and function (a walk up the stack) and the thread's and process's
    names (the switches of the logging HOWTO's "Optimization" section).  Called in each worker;
    the access log alone makes two records per lease pair."""
    logging._srcfile = None  # the documented switch
    logging.logThreads = False
    logging.logProcesses = False
    logging.logMultiprocessing = False


def _import_target(target: str, factory: bool) -> Callable[..., Any]:
    """Import ``module:attribute`` (and call it when ``factory``): the WSGI app of a worker,
    behind :class:`AccessLog` unless ``LOG_LEVEL`` turns the access log off.  Runs in the
    worker after granian applied :func:`logging_config`."""
    lean_log_records()
    module, _, attr = target.partition(":")
    obj = getattr(importlib.import_module(module), attr or "app")
    app = obj() if factory else obj
    return AccessLog(app) if logging.getLogger(ACCESS_LOGGER).isEnabledFor(logging.INFO) else app


def _granian_level(level: int):
    from granian.log import LogLevels

    for name, value in (("debug", logging.DEBUG), ("info", logging.INFO), ("warning", logging.WARNING),
                        ("error", logging.ERROR)):
        if level <= value:
            return LogLevels(name)
    return LogLevels.critical


def _server_class():
    from granian._granian import SocketHolder
    from granian.server.mp import MPServer

    class SharedSocketServer(MPServer):
        """granian's multiprocess server on a socket bound by :func:`listen`, shared by its
        workers (instead of one ``SO_REUSEPORT`` socket per worker)."""

        def __init__(self, sock: socket.socket, **kwargs) -> None:
            self._listener = sock
            super().__init__(**kwargs)

        def _init_shared_socket(self) -> None:
            self._ssp = None
            self._sso = self._listener  # closed by MPServer._drop_shared_socket at shutdown
            # granian's stubs type these attributes None and SocketHolder without a constructor.
            self._sfd = self._listener.fileno()  # type: ignore[assignment]
            self._shd = SocketHolder(self._sfd, False, self.backlog)  # type: ignore[call-arg, assignment]

    return SharedSocketServer


def run(settings: ServerSettings, sock: socket.socket, *, target: str = "api:create_app",
        factory: bool = True) -> None:
    """Serve ``target`` on ``sock`` until SIGTERM/SIGINT, then stop gracefully.

    Each worker process imports ``target`` (``module:attribute``; called when ``factory``)
    after it is forked: for the API, :func:`api.create_app`, which rebuilds the lease index.

    Args:
        settings: :class:`ServerSettings`.
        sock: the listening socket (:func:`listen`); closed in this process at shutdown.
        target / factory: the WSGI application of the workers.
    Raises:
        SystemExit: non-zero when a worker could not start or kept crashing.
        ValueError: a malformed ``LOG_LEVEL``.
    """
    from granian.constants import HTTPModes, Interfaces, RuntimeModes
    from granian.http import HTTP1Settings

    for name in RETIRED:
        if os.environ.get(name, "").strip():
            log.warning("api: %s is set but no longer used (the API is served by granian; see api/server.py)",
                        name)
    level = log_level()
    server = _server_class()(
        sock,
        target=target, address=settings.host, port=settings.port, interface=Interfaces.WSGI,
        workers=settings.workers, blocking_threads=settings.threads, runtime_threads=1,
        runtime_mode=RuntimeModes.mt, http=HTTPModes.http1, websockets=False,
        http1_settings=HTTP1Settings(header_read_timeout=int(settings.idle_timeout * 1000), keep_alive=True),
        backlog=settings.backlog, log_enabled=True, log_level=_granian_level(level),
        log_dictconfig=logging_config(os.environ.get("LOG_FORMAT", "").lower() == "json", level),
        log_access=False,  # written by AccessLog, for less CPU
        respawn_failed_workers=True, workers_kill_timeout=int(settings.graceful_timeout),
    )
    log.info("api: granian, %d workers x %d threads on one socket at %s; idle connections closed after %gs",
             settings.workers, settings.threads, settings.address, settings.idle_timeout)
    server.serve(target_loader=functools.partial(_import_target, target, factory), wrap_loader=False)
