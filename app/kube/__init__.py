"""The Kubernetes side: what the product reads and writes through the API server.

Owns the gateway (:mod:`app.kube.gateway`, every API call, composed of one part per resource
kind: :mod:`~app.kube.proxies`, :mod:`~app.kube.proxypools`, :mod:`~app.kube.events`,
:mod:`~app.kube.secrets`, :mod:`~app.kube.provider_health`, over the process's client,
:mod:`app.kube.client`), owner references (:mod:`app.kube.owners`), the one writer of Proxy
status (:mod:`app.kube.status_writer`), status conditions with Kubernetes semantics
(:mod:`app.kube.conditions`) and who may use a Secret (:mod:`app.kube.credentials`).  Must not
import :mod:`app.providers`, :mod:`app.proxy` or anything that loads Celery: the gateway knows no
provider and no step.
"""
