"""The Redis Lua scripts (``app/store/lua/*.lua``, shipped as package data) and their loader.

A script is one or more files run as one: ``Lua("now", "lease_index", "lease_acquire")`` is
:func:`app.store.keys.lua_header` (the key names and prefixes, as locals), an optional
``prelude`` (constants from Python), then the files in order.  Shared pieces are files of
their own: ``now.lua`` (``now``, ms by the Redis clock) and ``lease_index.lua`` (``reindex``,
the lease index of :mod:`app.serving.leases`).  Each file's first lines say what it takes (``KEYS``,
``ARGV``) and what it returns.

Scripts are module-level objects, read and hashed once per process; Redis loads one the first
time a process runs it (``NOSCRIPT``), after that a call is one ``EVALSHA``.
"""

from __future__ import annotations

import hashlib
from importlib import resources
from typing import Any, Callable

from redis.exceptions import NoScriptError

from app.store import keys as redis_keys


def source(name: str) -> str:
    """Return the text of ``<name>.lua`` from this package (works from a wheel or a checkout).

    Raises:
        FileNotFoundError: no such script.
    """
    return resources.files(__name__).joinpath(f"{name}.lua").read_text(encoding="utf-8")


def names() -> list[str]:
    """Return the names of every script file of this package (without ``.lua``), sorted."""
    return sorted(entry.name[:-4] for entry in resources.files(__name__).iterdir() if entry.name.endswith(".lua"))


class Lua:
    """A Lua script loaded once per process and run with any client.

    ``Lua(*files, prelude="")(r, keys, args)`` runs ``EVALSHA`` on ``r``, loading the script on
    ``NOSCRIPT``; on a pipeline, redis-py's ``Script`` (the pipeline loads its scripts before
    it executes).  A direct call goes straight to ``EVALSHA``: the lease scripts run on every
    API request.

    Args:
        files: script file names of this package, without ``.lua``, in the order they run.
        prelude: Lua put between the key header and the files (constants from Python).
    """

    def __init__(self, *files: str, prelude: str = "") -> None:
        self.files = files
        self.source = redis_keys.lua_header() + prelude + "".join(source(name) for name in files)
        self.sha = hashlib.sha1(self.source.encode("utf-8")).hexdigest()
        self._script: Callable[..., Any] | None = None  # redis-py's Script, registered on first use

    def __call__(self, r, keys: list, args: list):
        """Run the script on ``r`` (a client or a pipeline) with ``keys`` and ``args``."""
        if getattr(r, "scripts", None) is not None:  # a pipeline
            if self._script is None:
                self._script = r.register_script(self.source)
            return self._script(keys=keys, args=args, client=r)
        try:
            return r.evalsha(self.sha, len(keys), *keys, *args)
        except NoScriptError:
            r.script_load(self.source)
            return r.evalsha(self.sha, len(keys), *keys, *args)
