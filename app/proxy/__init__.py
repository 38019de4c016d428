"""One Proxy's life: the reconcile steps (create, poll, delete, retire), its basic-auth
Secret, and the collection of orphaned and superseded instances.

Owns :mod:`app.proxy.reconcile` (decisions and steps, each returning its followup),
:mod:`app.proxy.credentials` and :mod:`app.proxy.gc`.  Talks to Kubernetes only through
:mod:`app.kube` and to clouds only through the provider interface; must not import Celery or
:mod:`workers`.
"""
