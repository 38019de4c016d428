"""The watcher: list+watch Proxies cluster-wide and hand each change to a callback.

Modules: :mod:`watchers.stream` (the list+watch loop), :mod:`watchers.leader` (Lease-based
leader election), :mod:`watchers.liveness` (``/healthz``), :mod:`watchers.main` (the process:
:func:`watchers.main.run`), :mod:`watchers.events` (the callback: :mod:`app.dispatch.proxies` wired for the
watcher).
"""
