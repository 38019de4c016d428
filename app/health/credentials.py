"""Basic-auth credentials for the health probes, read from each Proxy's Secret (cached).

The serving view only names the Secret (``authSecret``); the username and password stay in
Kubernetes, never in Redis, which the API processes also read.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Callable

from app import serving
from app.squid import SECRET_PASSWORD_KEY, SECRET_USERNAME_KEY

log = logging.getLogger(__name__)

ReadSecret = Callable[[str, str], "dict[str, bytes] | None"]


class SecretCredentials:
    """``credentials(record) -> (username, password) | None`` for :func:`app.health.engine.probe_batch`.

    Args:
        read_secret: ``(namespace, name) -> {key: bytes} | None``
            (:meth:`app.kube.Kube.read_secret_data`).
        ttl: seconds a read (or a miss) is reused, so a sweep of many proxies costs one read
            per Secret per ``ttl``.
        clock: monotonic clock, seconds.
    A Secret that cannot be read gives ``None`` (the probe then reports ProxyAuthRequired, which
    is what a crawler without credentials would see); the failure is logged without values.
    """

    def __init__(self, read_secret: ReadSecret, ttl: float = 60.0, clock: Callable[[], float] = time.monotonic):
        self.read_secret, self.ttl, self.clock = read_secret, ttl, clock
        self._cache: dict[tuple[str, str], tuple[float, tuple[str, str] | None]] = {}
        self._lock = threading.Lock()

    def __call__(self, record: dict[str, str]) -> tuple[str, str] | None:
        ref = serving.auth_secret_of(record)
        if ref is None:
            return None
        now = self.clock()
        with self._lock:
            hit = self._cache.get(ref)
        if hit is not None and now - hit[0] < self.ttl:
            return hit[1]
        value = None
        try:
            data = self.read_secret(*ref) or {}
            if SECRET_USERNAME_KEY in data and SECRET_PASSWORD_KEY in data:
                value = (data[SECRET_USERNAME_KEY].decode(), data[SECRET_PASSWORD_KEY].decode())
        except Exception as exc:  # noqa: BLE001 - a probe without credentials reports it itself
            log.warning("health: cannot read credentials Secret %s/%s: %s", *ref, type(exc).__name__)
        with self._lock:
            self._cache[ref] = (now, value)
        return value
