"""The Kubernetes side: what the product reads and writes through the API server.

Owns the gateway (:mod:`app.kube.gateway`: every API call on Proxies, Secrets, Events and
ProviderHealth objects), the custom resources as dataclasses (:mod:`app.kube.resources`), the
one writer of Proxy status (:mod:`app.kube.status_writer`) and status conditions with
Kubernetes semantics (:mod:`app.kube.conditions`).  Must not import :mod:`app.providers`,
:mod:`app.proxy` or anything that loads Celery: the gateway knows no provider and no step.
"""
