"""ProxyPool: keep N proxies, replace each after an age, grow when crawlers run short.

* :mod:`app.pools.model` — the resource and its members as dataclasses (defaults, template
  hash, age limits with jitter).
* :mod:`app.pools.plan` — the decisions (scale, rollout, age rotation, spread, drain), one
  pure function.
* :mod:`app.pools.status` — the status a pass writes (counts, selector, conditions).
* :mod:`app.pools.zones` — the pool's zones: which may get new members, the skipped ones.
* :mod:`app.pools.autoscale` — the autoscaler's arithmetic (utilization, hysteresis).
* :mod:`app.pools.demand` — the per-pool count of refused lease requests in Redis.
* :mod:`app.pools.controller` — reads a pool and its members through the gateway, runs the
  plan, applies it (the ``pool.reconcile`` task's body; free of Celery).

Guide: docs/pools.md.
"""
