"""A private redis-server with the ACL users of deploy/ (:mod:`app.store.acl`), for the tests of
least privilege: each component's client logs in as its own user, the test's own client as
``default`` (every right), and :meth:`AclRedis.denials` reads what Redis refused (``ACL LOG``).
"""

from __future__ import annotations

import secrets

import redis as redis_lib

from app.store import acl as redis_acl
from devcluster.redis_server import RedisServer


class AclRedis:
    """A :class:`RedisServer` started with :func:`app.store.acl.config` of the rendered ACL file.

    Attributes:
        server: the server (``server.url`` has no credentials).
        passwords: user name -> its password (random, letters and digits).
        admin: the ``default`` user's password (the test's own client).
    """

    def __init__(self) -> None:
        self.passwords = {u.name: f"{u.name}-{secrets.token_hex(8)}" for u in redis_acl.USERS}
        self.admin = f"admin-{secrets.token_hex(8)}"
        self.server = RedisServer(password=self.admin, config=redis_acl.config(self.passwords, admin=self.admin))

    def client(self, user: str | None = None) -> redis_lib.Redis:
        """A client (``decode_responses=True``) logged in as ``user``, or as the admin."""
        if user is None:
            return redis_lib.Redis(port=self.server.port, password=self.admin, decode_responses=True)
        return redis_lib.Redis(port=self.server.port, username=user, password=self.passwords[user],
                               decode_responses=True)

    def env(self, user: str) -> dict[str, str]:
        """``REDIS_URL``, ``REDIS_USERNAME`` and ``REDIS_PASSWORD`` of a component logged in as ``user``."""
        return {"REDIS_URL": self.server.url, "REDIS_USERNAME": user, "REDIS_PASSWORD": self.passwords[user]}

    def reset(self) -> None:
        """Flush every key and clear the ACL log."""
        admin = self.client()
        admin.flushall()
        admin.acl_log_reset()
        admin.close()

    def denials(self) -> list[tuple[str, str, str]]:
        """What Redis refused since :meth:`reset`: ``(user, reason, object)`` (``object`` the
        command, key or channel), oldest first."""
        admin = self.client()
        try:
            entries = admin.acl_log(count=1000)
        finally:
            admin.close()
        return [(e["username"], e["reason"], e["object"]) for e in reversed(entries)]

    def stop(self) -> None:
        """Stop the server."""
        self.server.stop()
