"""Remote control of the workers is off unless asked for (``WORKER_REMOTE_CONTROL``).

Whoever can write to Redis could otherwise stop a worker's consumers with a broadcast
(``celery control cancel_consumer health``, ``shutdown``) and so stop every health probe or
create.  A real health worker (``celery -A workers worker -Q health``, as deployed) on the
test's Redis is sent those broadcasts through Celery's own control client; it must go on
receiving the tasks of its queue.  With ``WORKER_REMOTE_CONTROL=true`` (where Flower's control
is wanted) the same worker answers a ping and obeys ``cancel_consumer``.
"""

from __future__ import annotations

import uuid

import pytest
from celery import Celery

from tests.support.processes import celery_worker
from tests.support.waiting import wait_for

pytestmark = [pytest.mark.slow, pytest.mark.timeout(120)]

QUEUE = "health"


@pytest.fixture()
def control(redis_url):
    """A Celery client on the test's Redis: what anyone holding the Redis password can run."""
    app = Celery("outsider", broker=redis_url)
    yield app
    app.close()


def _send(app: Celery) -> str:
    """A ``health.probe_batch`` for no proxy on the health queue; its task id."""
    task_id = uuid.uuid4().hex
    app.send_task("health.probe_batch", args=[[]], queue=QUEUE, task_id=task_id)
    return task_id


def _received(worker, task_id: str) -> bool:
    return task_id in worker.log()


def _start(redis_url: str, **env) -> object:
    worker = celery_worker({"REDIS_URL": redis_url, "LOG_LEVEL": "INFO", **env}, queues=QUEUE,
                           concurrency=1, name=f"health-{uuid.uuid4().hex[:6]}")
    worker.start()
    worker.wait_for_log("ready", timeout=60)
    return worker


def test_a_broadcast_cannot_stop_a_workers_consumers(redis_url, control):
    worker = _start(redis_url)
    try:
        first = _send(control)
        wait_for(lambda: _received(worker, first), 30, "the health worker receives a task")

        control.control.cancel_consumer(QUEUE)
        control.control.ping(timeout=2)  # the broadcast has been read by any listener
        after_cancel = _send(control)
        wait_for(lambda: _received(worker, after_cancel), 30, "a task after cancel_consumer")

        control.control.shutdown()
        control.control.pool_shrink(1)
        after_shutdown = _send(control)
        wait_for(lambda: _received(worker, after_shutdown), 30, "a task after shutdown")
        assert worker.alive(), worker.log()[-3000:]
        assert control.control.ping(timeout=2) == []  # nobody listens on the control channel
    finally:
        worker.stop()


def test_remote_control_on_request_obeys_broadcasts(redis_url, control):
    """Where Flower's control is wanted (``WORKER_REMOTE_CONTROL=true``) the broadcasts work."""
    worker = _start(redis_url, WORKER_REMOTE_CONTROL="true")
    try:
        wait_for(lambda: control.control.ping(timeout=1), 30, "the worker answers a ping")
        replies = control.control.cancel_consumer(QUEUE, reply=True, timeout=2)
        assert replies and all("ok" in next(iter(r.values())) for r in replies), replies
        ignored = _send(control)
        with pytest.raises(AssertionError):
            wait_for(lambda: _received(worker, ignored), 3, "a task after cancel_consumer")
    finally:
        worker.stop()


def test_a_bad_flag_names_the_variable(monkeypatch):
    from app.config.settings import Settings

    monkeypatch.setenv("WORKER_REMOTE_CONTROL", "sometimes")
    with pytest.raises(ValueError, match="WORKER_REMOTE_CONTROL"):
        Settings.from_env()
