"""Redis plumbing every process shares: the client, its retry, the key table, the Lua scripts.

Owns :mod:`app.store.client` (``client_from_url``: URLs, Sentinel, credentials),
:mod:`app.store.retry` (one retry after a connection error), :mod:`app.store.keys` (the one
table of key names, documented in docs/redis.md), :mod:`app.store.lua` (the scripts, package
data), :mod:`app.store.acl` (each component's ACL user, from the key table) and
:mod:`app.store.check` (the start-up credential check).  Knows no domain object.
"""
