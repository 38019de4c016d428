"""proxy-operator domain package: nothing in here needs a broker.

Processes (``workers``, ``watchers``, ``api``) are thin shells around these subpackages:

* :mod:`app.kube` — the Kubernetes gateway, the custom resources, the status writer;
* :mod:`app.proxy` — one Proxy's reconcile steps, its credentials, GC;
* :mod:`app.pools` — the ProxyPool controller;
* :mod:`app.dispatch` — events to queued messages, holders and locks;
* :mod:`app.providers` — the provider interface, registry, checks and one package per type;
* :mod:`app.probes` — the health probes through each proxy;
* :mod:`app.serving` — the Redis serving view and leases;
* :mod:`app.store` — Redis client, keys, Lua scripts, ACL users;
* :mod:`app.config` — the providers config, settings, tenancy;
* :mod:`app.squid` — squid.conf and egress rules;
* :mod:`app.observability` — logs and metrics;
* ``app.wiring`` (the composition root), ``app.lazy``, ``app.timefmt``, ``app.version``.
"""
