"""What crawlers are served: the Redis serving view, leases and the selectors that pick them.

Owns :mod:`app.serving.records` (the serving record's schema), :mod:`app.serving.view`
(publish, withdraw, reindex: written by the reconciler and the probe engine),
:mod:`app.serving.leases` (where a lease is chosen and reserved, in one Lua script; client
scopes) and :mod:`app.serving.selectors` (the discovery API's label selectors).  Reads and
writes Redis only: must not import :mod:`app.kube` or :mod:`app.providers`.
"""
