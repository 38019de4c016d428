"""The test Squid (devcluster/squid.py): a start that fails says why; one that loses its port is retried.

Real Squids on this process's loopback block; every cause of failure is a real one (a port held
by a listener, a shared-memory segment that already exists), never a patched function.
"""

from __future__ import annotations

import glob
import os
import signal
import socket

import pytest

from app.squid import conf as squid_conf
from devcluster import loopback
from devcluster.squid import SquidProcess, SquidStartError, loopback_policy, start_on_free_port

pytestmark = pytest.mark.timeout(60)

NET = loopback.block("squid-process")


def test_a_squid_whose_port_is_held_fails_with_its_exit_code_and_log():
    address = NET.host(1)
    with socket.socket() as holder:  # someone else listens where the Squid is to listen
        holder.bind((address, 0))
        holder.listen()
        port = holder.getsockname()[1]
        squid = SquidProcess(address, port)
        # a connection to address:port succeeds (the holder answers): that is no proof of a running Squid
        with pytest.raises(SquidStartError) as err:
            squid.start(timeout=10)
    exc = err.value
    assert exc.returncode == 1 and exc.bind_failed and exc.elapsed < 10
    assert f"squid on {address}:{port} did not start: exited with code 1" in str(exc)
    assert "Address already in use" in str(exc) and "FATAL: Unable to open HTTP Socket" in str(exc)
    assert not squid.running() and not os.path.exists(squid.workdir)


def test_each_squid_has_its_own_shared_memory_names():
    """Squid 5 creates /dev/shm/<service name>-cf__*.shm exclusively at start (an existing one is
    unlinked and the create tried once more): Squids under one name that start together collide,
    so each test Squid runs under a name of its own, and leaves no segment behind."""
    one, two = SquidProcess(NET.host(2), loopback.free_port(NET.host(2))), SquidProcess(NET.host(3), 3128)
    assert one.service_name != two.service_name
    segment = f"/dev/shm/{two.service_name}-cf__metadata.shm"
    with open(segment, "x"):  # as a Squid of the same name starting at this moment leaves it
        pass
    try:
        with pytest.raises(SquidStartError) as err:
            two.start(timeout=10)
        assert err.value.returncode == 1 and not err.value.bind_failed
        assert f"shm_open(/{two.service_name}-cf__metadata.shm): (17) File exists" in str(err.value)
        with one:  # the other name is untouched
            assert f"Service Name: {one.service_name}" in one.log()
            assert os.path.exists(f"/dev/shm/{one.service_name}-cf__metadata.shm")
        assert not glob.glob(f"/dev/shm/{one.service_name}-*")
    finally:
        if os.path.exists(segment):
            os.unlink(segment)


def test_a_killed_squid_leaves_no_shared_memory_behind():
    squid = SquidProcess(NET.host(6), loopback.free_port(NET.host(6))).start()
    os.kill(squid.proc.pid, signal.SIGKILL)
    squid.proc.wait(timeout=10)
    assert squid.exited() == -signal.SIGKILL and glob.glob(f"/dev/shm/{squid.service_name}-*")
    squid.stop()
    assert squid.exited() is None and not glob.glob(f"/dev/shm/{squid.service_name}-*")


def _hold(address: str, port: int) -> socket.socket:
    """A listening socket on ``address:port``: the port taken by someone else."""
    holder = socket.socket()
    holder.bind((address, port))
    holder.listen()
    return holder


def test_a_squid_that_loses_its_port_is_started_again_on_a_fresh_one():
    address, holders = NET.host(4), []

    def conf(port: int) -> str:
        if not holders:  # another process takes the port between the pick and Squid's bind
            holders.append(_hold(address, port))
        return squid_conf.render(port, loopback_policy())

    try:
        squid = start_on_free_port(address, conf)
        try:
            assert squid.running() and squid.port != holders[0].getsockname()[1]
        finally:
            squid.stop()
    finally:
        for h in holders:
            h.close()


def test_a_squid_that_finds_every_port_taken_says_so():
    address, holders = NET.host(5), []

    def conf(port: int) -> str:
        holders.append(_hold(address, port))
        return squid_conf.render(port, loopback_policy())

    try:
        with pytest.raises(SquidStartError) as err:
            start_on_free_port(address, conf, attempts=2)
        ports = [h.getsockname()[1] for h in holders]
        assert len(ports) == 2 and err.value.bind_failed
        assert f"every port tried on {address} was taken by the time Squid bound it (ports {ports[0]}, {ports[1]})" \
            in str(err.value)
    finally:
        for h in holders:
            h.close()
    with pytest.raises(ValueError, match="attempts must be at least 1"):
        start_on_free_port(address, attempts=0)
