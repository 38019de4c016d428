"""A Proxy's basic-auth credentials: its own Secret, and when it may be used.

Each Proxy whose provider requires basic auth has one Secret, ``<proxy>-proxy-auth`` in the
Proxy's namespace, holding ``username``, ``password`` and ``htpasswd`` (the line baked into or
mounted by the instance; keys in :mod:`app.squid.conf`).  The operator creates it owned by the Proxy
(``ownerReferences`` with the Proxy's UID), so the cluster's garbage collector deletes it with
the Proxy (Kubernetes docs, "Owners and Dependents":
https://kubernetes.io/docs/concepts/overview/working-with-objects/owners-dependents/).

The policy, for every reader (the reconciler creating an instance, the health engine probing,
the rotation check): a Secret of that name is used only when its ``ownerReferences`` name the
Proxy's UID.  One owned by another Proxy (an earlier object of the same name, about to be
collected) is a Transient error; one nobody owns is Permanent: the operator never reads,
overwrites or deletes somebody else's Secret.  Values are user data: never logged.

All API access goes through the :class:`app.kube.gateway.KubeGateway` passed in.
"""

from __future__ import annotations

import logging
from typing import NamedTuple

from kubernetes.client import ApiException

from app.squid import conf as squid
from app.kube.gateway import KubeGateway, OwnerReference, Secret
from app.errors import Permanent, Transient
from app.resources import API_VERSION, KIND, Proxy

log = logging.getLogger(__name__)

#: Labels of the Secrets the operator creates.
SECRET_LABELS = {"app.kubernetes.io/managed-by": "proxy-operator"}


class BasicAuth(NamedTuple):
    """A Proxy's credentials: user name, password and the htpasswd line (bcrypt, with its newline)."""

    username: str
    password: str
    htpasswd: str


def secret_name(proxy: Proxy) -> str:
    """Name of the Proxy's basic-auth Secret: ``<proxy>-proxy-auth`` (in its namespace)."""
    return f"{proxy.name}-proxy-auth"


def owned_secret(kube: KubeGateway, proxy: Proxy) -> Secret | None:
    """Return the Proxy's credentials Secret if it exists and this Proxy owns it.

    Returns:
        the Secret, or ``None`` when it does not exist.
    Raises:
        app.errors.Transient: the Secret belongs to an earlier Proxy of the same
            name (the cluster's garbage collector is about to delete it).
        app.errors.Permanent: a Secret of that name exists that no Proxy owns.
        kubernetes.client.ApiException: the read failed.
    """
    name = secret_name(proxy)
    secret = kube.read_secret(proxy.namespace, name)
    if secret is None:
        return None
    if any(o.uid == proxy.uid for o in secret.owners):
        return secret
    if any(o.kind == KIND for o in secret.owners):
        raise Transient(f"Secret {proxy.namespace}/{name} still belongs to an earlier Proxy of this name")
    raise Permanent(f"Secret {proxy.namespace}/{name} exists and is not owned by this Proxy; "
                    "rename or delete it to let the operator create the basic-auth credentials")


def _decoded(secret: Secret | None) -> BasicAuth | None:
    data = secret.data if secret is not None else {}
    keys = (squid.SECRET_USERNAME_KEY, squid.SECRET_PASSWORD_KEY, squid.SECRET_HTPASSWD_KEY)
    if not all(k in data for k in keys):
        return None
    return BasicAuth(*(data[k].decode() for k in keys))


def read(kube: KubeGateway, proxy: Proxy) -> BasicAuth | None:
    """Return the credentials in the Proxy's own Secret, or ``None`` (no Secret, or a key missing).

    Never creates anything: credentials baked into a running instance must not change under
    it.  Never log the values.

    Raises:
        app.errors.Transient / Permanent: see :func:`owned_secret`.
        kubernetes.client.ApiException: the read failed.
    """
    return _decoded(owned_secret(kube, proxy))


def ensure(kube: KubeGateway, proxy: Proxy) -> BasicAuth:
    """Return the Proxy's credentials, creating its Secret (:func:`secret_name`) if needed.

    The Secret is owned by the Proxy (ownerReferences: controller, not blocking the owner's
    deletion), so the cluster deletes it with the Proxy.  An existing Secret of this Proxy is
    reused, so a recreated instance keeps the credentials crawlers already use.  Called only
    when an instance is about to be created.  Never log the values.

    Raises:
        app.errors.Transient / Permanent: see :func:`owned_secret`; also Transient
            when the existing Secret lacks a key (fix it or delete it), or when another writer
            created it concurrently (409; the retry reads it).
        kubernetes.client.ApiException: the read or the create failed otherwise.
    """
    name = secret_name(proxy)
    existing = owned_secret(kube, proxy)
    if existing is not None:
        found = _decoded(existing)
        if found is None:
            raise Transient(f"Secret {proxy.namespace}/{name} lacks username, password or htpasswd")
        return found
    username, password = squid.generate_credentials()
    auth = BasicAuth(username, password, squid.htpasswd_entry(username, password) + "\n")
    secret = Secret(
        namespace=proxy.namespace, name=name, labels=dict(SECRET_LABELS),
        data={squid.SECRET_USERNAME_KEY: auth.username.encode(), squid.SECRET_PASSWORD_KEY: auth.password.encode(),
              squid.SECRET_HTPASSWD_KEY: auth.htpasswd.encode()},
        owners=(OwnerReference(api_version=API_VERSION, kind=KIND, name=proxy.name, uid=proxy.uid,
                               controller=True, block_owner_deletion=False),))
    try:
        kube.create_secret(secret)
    except ApiException as exc:
        if exc.status != 409:
            raise
        raise Transient(f"Secret {proxy.namespace}/{name} was created concurrently; retrying") from None
    return auth


def delete(kube: KubeGateway, proxy: Proxy) -> None:
    """Delete the Proxy's basic-auth Secret if this Proxy owns it (best effort, never raises).

    The Secret's ownerReference makes the cluster delete it anyway; this only makes that
    immediate.  A Secret of that name that the Proxy does not own is left alone.
    """
    try:
        if owned_secret(kube, proxy) is not None:
            kube.delete_secret(proxy.namespace, secret_name(proxy))
    except Exception as exc:  # noqa: BLE001 - never block the finalizer on this
        log.info("proxy %s: credentials Secret not deleted (%s); garbage collection will",
                 proxy.key, type(exc).__name__)
