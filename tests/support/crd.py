"""What the CRD tests share: where the CRDs and samples are, and admission as the API server words it.

The CRDs in deploy/crd are admitted by devcluster/crd_validation.py (the schema, defaults and
the ``x-kubernetes-validations`` rules evaluated with cel-python), as kube-apiserver admits
custom resources.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from devcluster.crd_validation import Invalid, admit, load_crd

ROOT = Path(__file__).resolve().parents[2]
CRD_DIR = ROOT / "deploy" / "crd"
SAMPLES = ROOT / "deploy" / "samples"
#: The error kube-apiserver adds when schema errors kept some rules from being evaluated.
NOT_CHECKED = ('<nil>: Invalid value: "null": some validation rules were not checked because the '
               "object was invalid; correct the existing errors to complete validation")


def errors_of(crd: dict, obj: dict, old: dict | None = None) -> list[str]:
    """Return the API server's error strings for ``obj`` (``[]`` when it is admitted).

    Args:
        crd: the CRD (devcluster.crd_validation.load_crd).
        obj: the object created, or the new object of an update.
        old: the object before an update (transition rules), ``None`` for a create.
    """
    try:
        admit(crd, obj, old)
    except Invalid as exc:
        assert exc.errors, "Invalid raised without errors"
        return exc.errors
    return []


def crd_fixture(filename: str, name: str) -> Any:
    """Return a module-scoped fixture ``name`` that loads deploy/crd/``filename``.

    Use it as a module attribute: ``crd = crd_fixture("proxy.yaml", "crd")``.
    """
    def load() -> dict:
        return load_crd(CRD_DIR / filename)

    return pytest.fixture(scope="module", name=name)(load)
