"""Decision 22: a holder taken for dead while it lives (a GC pause, a stopped VM, Redis slow to
take its heartbeat) has its messages put back; the step may then run twice, which is allowed.
What must not happen: the late acknowledgement of the paused worker wiping out the copy another
worker now holds, so that when *that* worker is killed nothing is put back (the message is
lost, not restored within 2 x HOLDER_TTL + 2 s)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest
import redis

from devcluster.redis_server import RedisServer

pytestmark = pytest.mark.timeout(90)

TTL = 1.0


@pytest.fixture()
def server():
    s = RedisServer()
    yield s
    s.stop()


class Proc:
    def __init__(self, url: str) -> None:
        env = {**os.environ, "HOLDER_TTL": str(TTL)}
        self.p = subprocess.Popen([sys.executable, "-m", "tests.support.broker_proc", url], stdin=subprocess.PIPE,
                                  stdout=subprocess.PIPE, text=True, env=env, cwd=os.getcwd())
        self.id = self.p.stdout.readline().split()[1]

    def ask(self, cmd: str) -> str:
        self.p.stdin.write(cmd + "\n")
        self.p.stdin.flush()
        return self.p.stdout.readline().strip()

    def stop(self) -> None:
        if self.p.poll() is None:
            self.p.send_signal(signal.SIGCONT)
            self.p.kill()
        self.p.wait()


def _queued(r) -> int:
    return r.llen("proxies")


def test_a_late_ack_of_a_worker_taken_for_dead_does_not_lose_the_restored_copy(server):
    from kombu import Connection, Exchange, Queue

    from workers import broker

    broker.install()
    r = redis.Redis.from_url(server.url)
    procs = []
    try:
        reaper = Proc(server.url)
        procs.append(reaper)
        a = Proc(server.url)
        procs.append(a)
        q = Queue("proxies", Exchange("proxies", type="direct"), routing_key="proxies")
        with Connection(server.url) as p:
            p.Producer().publish({"step": "create"}, exchange=q.exchange, routing_key="proxies", declare=[q])
        tag = a.ask("get").split()[1]
        assert tag != "None"
        time.sleep(TTL * 1.2)  # the reaper may judge once it has beaten for its TTL
        assert reaper.ask("reap") == "reaping"
        a.p.send_signal(signal.SIGSTOP)  # a long pause: its heartbeat lapses
        deadline = time.time() + 10
        while _queued(r) == 0 and time.time() < deadline:
            time.sleep(0.1)
        assert _queued(r) == 1  # put back: a's holder is taken for dead
        c = Proc(server.url)
        procs.append(c)
        assert c.ask("get").split()[1] != "None"  # c runs the step now
        a.p.send_signal(signal.SIGCONT)  # a wakes up, finishes its (duplicate) run and acknowledges
        assert a.ask("ack") == "acked"
        assert r.hlen("unacked") == 1, "a's late acknowledgement removed the copy c holds"
        c.p.kill()  # then c is SIGKILLed mid-step
        c.p.wait()
        deadline = time.time() + 2 * TTL + 2 + 3
        while _queued(r) == 0 and time.time() < deadline:
            time.sleep(0.1)
        assert _queued(r) == 1, "the message c held was never put back: the step is lost"
    finally:
        for p in procs:
            p.stop()
