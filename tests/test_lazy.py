"""app.lazy.per_process: one value per process, built once, rebuilt after fork."""

from __future__ import annotations

import os
import threading

from app.lazy import per_process


def test_builds_once_for_every_thread_and_keeps_the_docstring():
    calls = []

    @per_process
    def thing() -> object:
        """This process's thing."""
        calls.append(1)
        return object()

    seen = []
    threads = [threading.Thread(target=lambda: seen.append(thing())) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(calls) == 1 and all(v is seen[0] for v in seen)
    assert thing.__doc__ == "This process's thing." and thing.__name__ == "thing"


def test_reset_builds_a_new_one_and_a_failed_build_is_retried():
    fail = [True]

    @per_process
    def thing() -> object:
        if fail[0]:
            fail[0] = False
            raise OSError("not yet")
        return object()

    try:
        thing()
    except OSError:
        pass
    first = thing()
    assert thing() is first
    thing.reset()
    assert thing() is not first


def test_a_forked_child_builds_its_own():
    @per_process
    def pid() -> int:
        return os.getpid()

    assert pid() == os.getpid()
    read, write = os.pipe()
    child = os.fork()
    if child == 0:  # pragma: no cover - runs in the child
        os.write(write, str(pid()).encode())
        os._exit(0)
    os.close(write)
    got = int(os.read(read, 32))
    os.close(read)
    os.waitpid(child, 0)
    assert got == child and pid() == os.getpid()
