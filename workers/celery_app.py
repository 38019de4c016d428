"""The Celery application every worker, beat and the watcher share (``celery -A workers``).

Broker: Redis at ``REDIS_URL``, with ``REDIS_PASSWORD`` put in (:func:`app.config.settings.redis_url_from_env`;
Celery logs the URL masked, ``redis://:**@...``), or the master of the Sentinels of a
``redis+sentinel://`` URL (:mod:`app.store.client`: kombu's ``sentinel://`` transport, redbeat's
Sentinel options).  Delivery: ``acks_late`` with ``reject_on_worker_lost`` so a
task whose worker dies is redelivered; prefetch 1; JSON only; results ignored.  The broker's
visibility timeout exceeds the hard time limit of every task and the longest countdown we
schedule (Celery docs, "Using Redis: Visibility timeout").  A worker SIGKILLed whole (parent included) does not
wait for it: the other workers put its messages back within seconds (``workers/broker.py``,
:mod:`app.store.holders`).

Queues: ``proxies`` (create/poll/delete for kubernetes and gcp proxies), ``health`` (probes),
``gc`` (sweeps), and one ``kvm.<provider>.<host>`` queue per KVM host, created on demand and
served by that host's dedicated worker (``-Q kvm.<provider>.<host>``).
"""

from __future__ import annotations

import importlib.util

from celery import Celery
from celery.signals import beat_init, setup_logging, worker_init
from kombu import Exchange, Queue

from app.store import client as redis_client, keys as redis_keys
from app.config.settings import Settings
from workers import broker, routing

# redis:// resolves to kombu's Redis transport re-creating the queue bindings a flushed or
# emptied Redis lost (workers/broker.py); before any connection is made.
broker.install()

settings = Settings.from_env()
# A redis+sentinel:// REDIS_URL becomes kombu's sentinel:// broker URL and redbeat's Sentinel
# options (app/store/client.py); a redis:// one is used as is.
_broker_url, _broker_sentinel_options = redis_client.celery_broker(settings.redis_url)
_redbeat_url, _redbeat_sentinel_options = redis_client.redbeat_settings(settings.redis_url)

#: Longest pause between two beat ticks, seconds: each tick extends the beat lock.
BEAT_MAX_LOOP_INTERVAL = 5

celery_app = Celery("proxy-operator")
celery_app.conf.update(
    broker_url=_broker_url,
    # Never give up on the broker: a worker, beat or watcher outlives any Redis outage
    # (None = retry forever, at start-up and after losing an established connection).
    broker_connection_retry_on_startup=True,
    broker_connection_retry=True,
    broker_connection_max_retries=None,
    broker_transport_options={
        "visibility_timeout": int(settings.visibility_timeout),
        # kombu's sweep runs every REAP_INTERVAL s, so messages of a dead worker go back within
        # seconds (workers/broker.py, app/store/holders.py); its visibility scan stays ~once a minute.
        "unacked_restore_interval": broker.REAP_INTERVAL, "unacked_restore_throttle": 30,
        # A Redis that vanishes without closing the connection (failover, a network partition)
        # must fail a command, not hang it: the consumer's BRPOP answers within 1 s normally.
        "socket_timeout": 30, "socket_connect_timeout": 5, "socket_keepalive": True,
        **_broker_sentinel_options,
    },
    task_serializer="json",
    accept_content=["json"],
    result_serializer="json",
    task_ignore_result=True,
    result_backend=None,
    task_acks_late=True,
    task_reject_on_worker_lost=True,
    worker_prefetch_multiplier=1,
    task_soft_time_limit=settings.task_soft_time_limit,
    task_time_limit=settings.task_time_limit,
    task_default_queue=routing.PROXIES,
    # One direct exchange per queue, bound by the queue's own name: a message for one queue
    # is never copied into another (the shape task_create_missing_queues uses for kvm.* too).
    task_queues=[Queue(q, Exchange(q, type="direct"), routing_key=q)
                 for q in (routing.PROXIES, routing.HEALTH, routing.GC)],
    task_create_missing_queues=True,
    task_routes=(routing.route_task,),
    worker_hijack_root_logger=False,
    # No pidbox consumer unless WORKER_REMOTE_CONTROL asks for one: a broadcast written into
    # Redis (shutdown, cancel_consumer, pool_shrink) cannot stop a worker.  Flower still sees
    # tasks and workers through events (-E).
    worker_enable_remote_control=settings.worker_remote_control,
    worker_send_task_events=False,
    redbeat_redis_url=_redbeat_url,
    redbeat_key_prefix=redis_keys.REDBEAT_PREFIX,
    redbeat_redis_options={"socket_timeout": 10, "socket_connect_timeout": 5, "socket_keepalive": True,
                           "health_check_interval": 25, **_redbeat_sentinel_options},
    # The leader extends its lock every tick (at most beat_max_loop_interval apart), so a short
    # lock lets a standby, or a beat started after one was killed, schedule within
    # BEAT_LOCK_TIMEOUT + beat_max_loop_interval seconds (20 + 5 by default).
    redbeat_lock_timeout=settings.beat_lock_timeout,
    beat_max_loop_interval=BEAT_MAX_LOOP_INTERVAL,
    # redbeat's scheduler, riding out Redis outages, restarts and flushes (workers/beat_scheduler.py).
    beat_scheduler="workers.beat_scheduler.ResilientRedBeatScheduler",
    timezone="UTC",
    include=[m for m in ("workers.tasks", "workers.probe_tasks") if importlib.util.find_spec(m)],
)


def sender(app: Celery):
    """Return the ``send(task_name, args, queue, countdown)`` callable for ``app``.

    The callable is an :class:`app.dispatch.proxies.Send`.

    Publishes by task name (``send_task``), so no task module is imported.  Raises what the
    broker raises while unreachable (``kombu.exceptions.OperationalError``, ``redis.RedisError``).
    """

    def send(task: str, args: list, queue: str, countdown: float | None = None) -> None:
        options: dict = {"queue": queue}
        if countdown:
            options["countdown"] = countdown
        app.send_task(task, args=args, **options)

    return send


#: The fleet's publisher: what the dispatcher sends through in workers, beat and the watcher.
send = sender(celery_app)


@setup_logging.connect
def _logging(**_):
    """Use the operator's logging (``LOG_LEVEL``, ``LOG_FORMAT=json``) in workers and beat.

    Connecting this signal makes Celery leave logging configuration to us (Celery docs,
    "Signals: setup_logging").
    """
    from app.observability.logs import setup

    setup("celery")


@worker_init.connect
def _worker_credentials(**_):
    """Exit (status 2, one clear line) if Redis refuses the worker's credentials (app.store.check),
    then install the worker's holder and its heartbeat before the pool forks (app.store.holders): the
    messages it takes and the locks its children take name it."""
    from app.store import holders
    from app.store.check import exit_if_credentials_refused

    exit_if_credentials_refused(settings.redis_url, "worker")
    holders.install(settings.redis_url)


@beat_init.connect
def _beat_credentials(**_):
    """Exit (status 2, one clear line) if Redis refuses beat's credentials (app.store.check)."""
    from app.store.check import exit_if_credentials_refused

    exit_if_credentials_refused(settings.redis_url, "beat")
