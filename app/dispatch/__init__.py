"""From "something changed" to one de-duplicated message on the right queue, and who runs it.

Owns :mod:`app.dispatch.proxies` (queue routing, de-duplication, the per-Proxy step under its
lock), :mod:`app.dispatch.pools` (the same for ProxyPools) and :mod:`app.dispatch.holders`
(worker processes with heartbeats, the locks that name them, the reap of a dead worker's
messages).  Free of Celery: messages leave through an injected ``send``; must not import
:mod:`workers` or ``celery``.
"""
