"""The Celery application every worker, beat and the watcher share (``celery -A workers``).

Broker: Redis at ``REDIS_URL``.  Delivery: ``acks_late`` with ``reject_on_worker_lost`` so a
task whose worker dies is redelivered; prefetch 1; JSON only; results ignored.  The broker's
visibility timeout exceeds the hard time limit of every task and the longest countdown we
schedule (Celery docs, "Using Redis: Visibility timeout").

Queues: ``proxies`` (create/poll/delete for kubernetes and gcp proxies), ``health`` (probes),
``gc`` (sweeps), and one ``kvm.<provider>.<host>`` queue per KVM host, created on demand and
served by that host's dedicated worker (``-Q kvm.<provider>.<host>``).
"""

from __future__ import annotations

import importlib.util

from celery import Celery
from celery.signals import setup_logging
from kombu import Exchange, Queue

from app.settings import Settings
from workers import routing

settings = Settings.from_env()

celery_app = Celery("proxy-operator")
celery_app.conf.update(
    broker_url=settings.redis_url,
    broker_connection_retry_on_startup=True,
    broker_transport_options={"visibility_timeout": int(settings.visibility_timeout)},
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
    worker_send_task_events=False,
    redbeat_redis_url=settings.redis_url,
    redbeat_key_prefix="po:redbeat",
    # The leader extends its lock every tick (the health sweep ticks every few seconds), so a
    # short lock lets a standby take over within a minute of a beat dying.
    redbeat_lock_timeout=60,
    beat_max_loop_interval=10,
    beat_scheduler="redbeat.RedBeatScheduler",
    timezone="UTC",
    include=[m for m in ("workers.tasks", "workers.health_tasks") if importlib.util.find_spec(m)],
)


@setup_logging.connect
def _logging(**_):
    """Use the operator's logging (``LOG_LEVEL``, ``LOG_FORMAT=json``) in workers and beat.

    Connecting this signal makes Celery leave logging configuration to us (Celery docs,
    "Signals: setup_logging").
    """
    from app.logs import setup

    setup("celery")
