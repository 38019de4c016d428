"""The API's former server, for bench/leases.py's side-by-side only: gunicorn with the
configuration the API was deployed with before granian (``gunicorn -c bench/gunicorn_conf.py
'api:create_app()'``).  The API is served by granian (api/server.py, decision 23); gunicorn is a test
dependency, installed for this comparison.

* ``gthread`` workers (``API_WORKERS``, default 2) with ``API_THREADS`` threads each (default
  4): crawlers keep their connections alive between lease and release, and gthread parks an
  idle keep-alive connection in the worker's poller instead of holding a thread (the default
  ``sync`` worker closes every connection after one request). Ready connections are served
  first come, first served from one queue per worker, so no connection starves another
  (gevent's workers serve a connection whose next request already waits without yielding;
  measured in docs/performance.md). More threads per worker only contend for the GIL.
* ``reuse_port`` (``API_REUSE_PORT``, default ``true``): each worker listens on its own
  ``SO_REUSEPORT`` socket and the kernel spreads new connections over them by address hash.
  With one shared socket, whichever worker wakes first accepts, and a few long-lived crawler
  connections could all land on one worker (the lease benchmark saw 32 / 0 splits, halving
  throughput). The trade-offs (nginx's ``reuseport`` makes the same ones):

  - a new connection waits for the worker its hash chose, even if that worker is busy;
  - connections still queued on a worker that stops (restart after ``timeout``, a crash,
    ``kill -HUP`` of the master) are reset, and the crawler must retry; the master holds no
    socket, so ``kill -USR2`` (binary upgrade) does not work. Roll out new versions by
    replacing Pods, as deploy/ does;
  - Linux ``socket(7)`` lets any process of the same user bind the same address into the
    group: a second API started by mistake on the same port shares the traffic instead of
    failing with "address in use".

  ``API_REUSE_PORT=false`` goes back to one shared socket.
* ``control_socket_disable``: gunicorn 25.1+ opens a control socket at one fixed path per
  user (``$HOME/.gunicorn/gunicorn.ctl``), so two instances on one host remove each other's;
  its reload and resize commands are also what ``reuse_port`` does not support. Off.
* The config lives in the ``api`` package, so the gunicorn master imports the application's
  modules before it forks; ``kill -HUP`` does not load new code (replace the Pod instead).
* ``keepalive`` (``API_KEEPALIVE_SECONDS``, default 30): how long an idle client connection
  is kept open.
* Without ``PROMETHEUS_MULTIPROC_DIR`` each worker would answer ``/metrics`` with its own
  counters only; with it, a worker that exits is marked dead (prometheus-client
  multiprocess mode, "Gunicorn" in its documentation) so its live gauges stop counting.

``--bind``, ``--workers`` and the other command-line options still override these values.

Raises (when gunicorn loads it):
    ValueError: a malformed ``API_*`` variable, naming it.
"""

from __future__ import annotations

import os

from app.config.settings import env_flag, env_number

bind = os.environ.get("API_BIND") or "127.0.0.1:8080"  # deploy/ binds 0.0.0.0:8080 with -b
workers = int(env_number("API_WORKERS", 2, minimum=1, integer=True))
worker_class = "gthread"
threads = int(env_number("API_THREADS", 4, minimum=1, integer=True))
# One listening socket per worker (gunicorn >= 24 creates it in the worker).
reuse_port = env_flag("API_REUSE_PORT", True)
keepalive = int(env_number("API_KEEPALIVE_SECONDS", 30, minimum=1, integer=True))
# The API answers from Redis within milliseconds; a request still running after this long is
# stuck (Redis gone without a reset), and the worker is restarted.
timeout = 30
graceful_timeout = 20


control_socket_disable = True  # ignored by gunicorn < 25.1, which has none


def when_ready(server) -> None:
    """gunicorn hook: say where the workers listen (with ``reuse_port`` the master holds no
    socket, and gunicorn's own "Listening at" line is empty)."""
    server.log.info("proxy-operator api: %d workers listening on %s%s", server.cfg.workers,
                    ", ".join(server.cfg.bind), " (one SO_REUSEPORT socket each)" if server.cfg.reuse_port else "")


def child_exit(server, worker) -> None:
    """gunicorn hook: a worker exited; drop its live gauges from the multiprocess metrics."""
    if os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
        from prometheus_client import multiprocess

        multiprocess.mark_process_dead(worker.pid)
