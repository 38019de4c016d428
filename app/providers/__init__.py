"""The providers: the contract (``base``), the error taxonomy (``errors``), the registry, the
metrics wrapper, and one package per provider type (``pods``, ``gcp``, ``kvm``).

A regular package (not a namespace one) so the layout contracts (``lint-imports``) see its modules.
"""
