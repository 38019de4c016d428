"""The operator's trust boundary between teams: which namespaces may run what.

A Proxy's author controls its spec, and two parts of a spec put code or an address of the
author's choosing in front of every crawler that leases the proxy: an External Proxy's
``spec.endpoint`` (a listener of the author's own) and a Managed Proxy's ``spec.cloudInit`` /
``spec.vendorData`` (code run on the instance, which can rewrite squid.conf or read the
instance's credentials).  Whether a namespace may use them is the operator's decision, set in
the providers config (the ``tenancy:`` block, read by every process that reconciles)::

    tenancy:
      externalProxyNamespaces: [crawl-ops]     # may create External Proxies; default: none
      cloudInitNamespaces: [crawl-ops]         # may set spec.cloudInit / spec.vendorData; default: none

``"*"`` alone stands for every namespace (the behaviour before these settings existed).  A
Proxy that uses a field its namespace may not is ``Failed`` with reason ``SpecNotAllowed``
naming the field and the setting (:func:`refusal`).  Which proxies a crawler may lease is the
other half of the boundary: the API's tokens file (:mod:`api.tokens`, docs/security.md).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from app.resources import Proxy
from app.config.validation import Reader

#: Every namespace, in a namespace list of the operator's settings.
ANY = "*"
#: A Kubernetes namespace name (an RFC 1123 DNS label, at most 63 characters).
NAMESPACE = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")

EXTERNAL_SETTING = "externalProxyNamespaces"
CLOUD_INIT_SETTING = "cloudInitNamespaces"


@dataclass(frozen=True)
class Tenancy:
    """Which namespaces may use the spec fields that put their author's code in the path.

    Attributes:
        external_namespaces: namespaces whose External Proxies are reconciled (``"*"``: all).
        cloud_init_namespaces: namespaces whose Proxies may set ``spec.cloudInit`` or
            ``spec.vendorData`` (``"*"``: all).
        source: where the settings came from, for messages (``"<file>: tenancy"``).
    Both default to no namespace.
    """

    external_namespaces: frozenset[str] = frozenset()
    cloud_init_namespaces: frozenset[str] = frozenset()
    source: str = "the providers config: tenancy"

    @classmethod
    def open(cls) -> "Tenancy":
        """Every namespace may use every field (``"*"`` in both lists)."""
        return cls(frozenset({ANY}), frozenset({ANY}))

    def allows_external(self, namespace: str) -> bool:
        """Whether ``namespace`` may contribute External Proxies."""
        return ANY in self.external_namespaces or namespace in self.external_namespaces

    def allows_cloud_init(self, namespace: str) -> bool:
        """Whether Proxies of ``namespace`` may set ``spec.cloudInit`` / ``spec.vendorData``."""
        return ANY in self.cloud_init_namespaces or namespace in self.cloud_init_namespaces


def refusal(tenancy: Tenancy, proxy: Proxy) -> tuple[str, str] | None:
    """Why ``proxy``'s spec uses a field its namespace may not, or ``None`` when it may.

    Returns:
        ``(field, message)``: the field (``spec.endpoint``, ``spec.cloudInit``,
        ``spec.vendorData``) and what is wrong, naming the setting that would allow it (the
        reconciler fails the Proxy with ``SpecNotAllowed``).
    """
    spec, ns = proxy.spec, proxy.namespace
    if not spec.managed and not tenancy.allows_external(ns):
        return ("spec.endpoint", f"External Proxies are not allowed in namespace {ns!r}: the operator lists "
                                 f"the namespaces that may add them in {EXTERNAL_SETTING} ({tenancy.source})")
    if spec.managed and not tenancy.allows_cloud_init(ns):
        for field, used in (("spec.cloudInit", spec.cloud_init_inline is not None or bool(spec.cloud_init_secret)),
                            ("spec.vendorData", spec.vendor_data is not None)):
            if used:
                return (field, f"not allowed in namespace {ns!r}: the operator lists the namespaces whose "
                               f"Proxies may run their own code on an instance in {CLOUD_INIT_SETTING} "
                               f"({tenancy.source})")
    return None


def namespace_list(reader: Reader, key: str) -> frozenset[str]:
    """Read a list of namespace names (or ``["*"]``) at ``key`` of ``reader``.

    Raises:
        app.config.validation.ConfigError: not a list of namespace names, or ``"*"`` beside names.
    """
    names = reader.str_list(key)
    for i, name in enumerate(names):
        if name != ANY and not NAMESPACE.match(name):
            raise reader.error(f"{key}[{i}]", f"{name!r} is not a namespace name (a DNS label) or \"*\"")
    if ANY in names and len(names) > 1:
        raise reader.error(key, '"*" (every namespace) stands alone')
    return frozenset(names)


def parse(reader: Reader) -> Tenancy:
    """Read the ``tenancy:`` block of the providers config.

    Args:
        reader: the block (empty when absent: nothing allowed).
    Raises:
        app.config.validation.ConfigError: an unknown key or a bad namespace list, naming the field.
    """
    tenancy = Tenancy(external_namespaces=namespace_list(reader, EXTERNAL_SETTING),
                      cloud_init_namespaces=namespace_list(reader, CLOUD_INIT_SETTING),
                      source=f"{reader.file}: tenancy")
    reader.done()
    return tenancy
