"""One Proxy's life: the reconcile steps (create, poll, delete, retire) and the collection of
orphaned and superseded instances.

Owns :mod:`app.proxy.reconcile` (the names the steps' callers import), :mod:`app.proxy.step`
(what a step is given, shares and returns), :mod:`app.proxy.decide` (what a Proxy needs, and
the step timings), :mod:`app.proxy.failures` (the one error boundary), :mod:`app.proxy.provisioned`
(the status writes the steps share), :mod:`app.proxy.create`, :mod:`app.proxy.poll`,
:mod:`app.proxy.delete`, :mod:`app.proxy.retire` (replaced instances, rotated credentials) and
:mod:`app.proxy.gc`.  Talks to Kubernetes only through :mod:`app.kube` and to clouds only
through the provider interface; must not import Celery or :mod:`workers`.
"""
