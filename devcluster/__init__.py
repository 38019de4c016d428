"""A simulated Kubernetes cluster on loopback: the operator's local environment.

The parts (docs/devcluster.md says what each simulates and what it does not):

* :mod:`devcluster.apiserver` — ``FakeKube``, an HTTP fake of kube-apiserver for the real
  ``kubernetes`` client and the real ``kubectl``, with fault hooks for tests.
* :mod:`devcluster.crd_validation` — admission of custom resources through a
  CustomResourceDefinition (pruning, defaults, OpenAPI schema, CEL rules).
* :mod:`devcluster.kubelet` — the kubelet stand-in: a Squid Pod becomes a real Squid on a
  loopback address of its own (:mod:`devcluster.squid`, :mod:`devcluster.loopback`).
* :mod:`devcluster.cluster` — ``FakeCluster``: the three together, Proxies and ProxyPools
  admitted through ``deploy/crd``.
* :mod:`devcluster.demo` — ``proxy-operator demo``: the operator's real processes on it.

Importing this package loads nothing else; the parts need the ``demo`` extra (cel-python,
jsonpatch) and, for the kubelet and the demo, Debian's ``squid`` and ``redis-server``.
The parts read the CRDs from the source checkout (:data:`CRD_DIR`).
"""

from __future__ import annotations

from pathlib import Path

#: The source checkout this package belongs to (it runs from one: ``pip install -e``).
ROOT = Path(__file__).resolve().parent.parent
#: The CustomResourceDefinitions the API fake serves and admits with (``deploy/crd``).
CRD_DIR = ROOT / "deploy" / "crd"
