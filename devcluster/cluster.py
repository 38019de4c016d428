"""A fake cluster for end-to-end tests: the API fake with the CRDs' admission and a kubelet.

``FakeCluster`` = :class:`devcluster.apiserver.server.FakeKube` (with its garbage collector) whose
``proxies`` and ``proxypools`` are admitted by the real CRDs (``deploy/crd/proxy.yaml``,
``deploy/crd/proxypool.yaml``: pruning, defaults, OpenAPI and CEL rules via
:mod:`devcluster.crd_validation`) plus a :class:`devcluster.kubelet.Kubelet` that runs
real Squids for Squid Pods.
"""

from __future__ import annotations

from pathlib import Path

from devcluster import CRD_DIR, crd_validation
from devcluster.apiserver import errors as fake_errors
from devcluster.apiserver.server import FakeKube
from devcluster.kubelet import Kubelet

PROXY_CRD = CRD_DIR / "proxy.yaml"
POOL_CRD = CRD_DIR / "proxypool.yaml"


def proxy_admission(crd_path: Path = PROXY_CRD):
    """Return an admission hook ``admit(obj, old, field_validation=None) -> obj`` enforcing the Proxy CRD
    (``fieldValidation=Strict`` requests get 400 for undeclared fields, as kubectl's apply sends)."""
    return crd_admission(crd_path)


def pool_admission(crd_path: Path = POOL_CRD):
    """Return the admission hook of the ProxyPool CRD (see :func:`crd_admission`)."""
    return crd_admission(crd_path)


def crd_admission(crd_path: Path):
    """Return an admission hook ``admit(obj, old, field_validation=None) -> obj`` enforcing the CRD in
    ``crd_path`` (``fieldValidation=Strict`` requests get 400 for undeclared fields, as kubectl's
    apply sends)."""
    crd = crd_validation.load_crd(crd_path)

    def admit(obj: dict, old: dict | None, field_validation: str | None = None) -> dict:
        try:
            return crd_validation.admit(crd, obj, old, field_validation=field_validation or "Warn")
        except crd_validation.Invalid as exc:
            raise fake_errors.Invalid([{"field": c.field, "message": c.body(), "reason": c.reason}
                                       for c in exc.causes]) from None

    admit.takes_field_validation = True  # the store passes the request's fieldValidation
    return admit


class FakeCluster:
    """API fake + Proxy admission + kubelet stand-in.

    Args:
        start_squid: whether the kubelet starts real Squids (False: Pods go Running with an
            address nothing listens on).
        kubelet: whether to run a kubelet at all (False: Pods stay Pending).
    """

    def __init__(self, *, start_squid: bool = True, kubelet: bool = True, **fake_kwargs) -> None:
        self.fake = FakeKube(**fake_kwargs)
        self.kubelet: Kubelet | None = None
        self._want_kubelet, self._start_squid = kubelet, start_squid

    def start(self) -> "FakeCluster":
        """Start the API fake, install admission, start the kubelet."""
        self.fake.start()
        self.fake.set_admission("proxies", proxy_admission())
        self.fake.set_admission("proxypools", pool_admission())
        if self._want_kubelet:
            self.kubelet = Kubelet(self.fake, start_squid=self._start_squid).start()
        return self

    def close(self) -> None:
        """Stop the kubelet (and its Squids) and the fake."""
        if self.kubelet is not None:
            self.kubelet.close()
        self.fake.close()

    def __enter__(self) -> "FakeCluster":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.close()
