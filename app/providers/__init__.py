"""The providers: the contract (``base``), the error taxonomy (``errors``), the registry, the
metrics wrapper, what a type registers (``types``), instance naming (``naming``), the provider
checks (``checks``), the placement refusal the cloud providers share (``placement``), and one
package per provider type (``kubernetes``, ``gcp``, ``kvm``).

A regular package (not a namespace one) so the layout contracts (``lint-imports``) see its modules.
"""
