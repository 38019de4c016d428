"""Squid Pods in the operator's own cluster.

* Pod name = the instance name; namespace = the configured one, else the Proxy's own.
* Labels carry the tags (``app.kubernetes.io/managed-by``, ``crawl.example.com/proxy-uid``),
  so GC lists by label across all namespaces (hence a ClusterRole).  That listing reads
  metadata only (``PartialObjectMetadataList``), in pages of :data:`LIST_PAGE_SIZE`: GC needs
  the name, labels and creation time, not the Pod specs (about 2.5 KB of JSON per Pod).
* The Squid config travels in the ``SQUID_CONF`` environment variable; the container writes
  it to /tmp and runs ``squid -N -f`` on it.  With basic auth, the Proxy's credentials Secret
  is mounted as a volume (its ``htpasswd`` key as file ``htpasswd``) on the directory of the
  path the squid.conf names, without ``subPath``: the kubelet updates the file when the Secret
  changes (Kubernetes docs, "Mounted Secrets are updated automatically":
  https://kubernetes.io/docs/concepts/configuration/secret/#using-secrets-as-files-from-a-pod),
  and Squid's ``basic_ncsa_auth`` re-reads it, so a password rotation reaches the running Pod.
* Phase mapping: Running with a Pod IP -> Running; Running without an IP or Pending ->
  Provisioning; Succeeded/Failed/Unknown -> Terminated.  A Pod being deleted is Terminated.
  Never Stopped: a Pod that has ended cannot be started again (Terminated means the
  reconciler deletes and recreates it), and a crashed container is restarted by the kubelet
  (``restartPolicy: Always``) inside a Pod that stays Running/Pending.
* ``abandon`` labels the Pod ``crawl.example.com/abandoned=true`` (tag ``abandoned``), which
  ``to_instance`` maps back, so GC leaves it alone.
* provider ID ``<namespace>/<pod>``.
* What runs is the operator's choice, not the Proxy author's (docs/security.md): the image is
  ``kubernetes.image`` or one of ``kubernetes.images`` (else :class:`SpecNotAllowed` naming
  ``spec.placement.image``), and the Pod is hardened: no service-account token
  (``automountServiceAccountToken: false``), ``RuntimeDefault`` seccomp, no privilege
  escalation, every capability dropped but ``SETUID``/``SETGID`` (Squid starts as root and
  switches to its ``proxy`` user; verified with Debian's squid 5.7 under a bounding set of
  just those two) and ``NET_BIND_SERVICE`` only for a port below 1024.
"""

from __future__ import annotations

import hashlib
import json
import logging
import time
from typing import Any, Callable

import urllib3
from kubernetes import client as k8s

from app.squid import egress

from app.providers import naming
from app.config.providers import ProviderConfig
from app.providers.base import (CheckableProvider, CreateRequest, Instance, InstanceState, ListResult, Provider,
                                TargetVerdict, refuse_spot, require_managed)
from app.errors import NotFound, Permanent, QuotaExceeded, SpecNotAllowed, Transient
from app.providers.kubernetes.config import CHECK_TARGET
from app.squid.conf import DEFAULT_HTPASSWD_PATH, SECRET_HTPASSWD_KEY
from app.timefmt import parse_rfc3339

log = logging.getLogger(__name__)

LABEL_MANAGED_BY = "app.kubernetes.io/managed-by"
LABEL_PROXY_UID = "crawl.example.com/proxy-uid"
LABEL_NAME = "app.kubernetes.io/name"
#: Label of a Pod whose Proxy was released with skip-cleanup (tag :data:`app.providers.naming.TAG_ABANDONED`).
LABEL_ABANDONED = "crawl.example.com/abandoned"
_TAG_TO_LABEL = {naming.TAG_MANAGED_BY: LABEL_MANAGED_BY, naming.TAG_PROXY_UID: LABEL_PROXY_UID,
                 naming.TAG_ABANDONED: LABEL_ABANDONED}
_LABEL_TO_TAG = {v: k for k, v in _TAG_TO_LABEL.items()}
CONTAINER = "squid"
AUTH_VOLUME = "proxy-auth"
START_SCRIPT = 'printf "%s" "$SQUID_CONF" > /tmp/squid.conf && exec squid -N -f /tmp/squid.conf'
#: Capabilities Squid keeps: it starts as root and switches to ``cache_effective_user`` (setgid,
#: initgroups, setuid).  Everything else (CHOWN, DAC_OVERRIDE, NET_RAW, ...) is dropped.
SQUID_CAPABILITIES = ("SETUID", "SETGID")
#: ``limit`` of each page of the GC listing (:meth:`KubernetesProvider.list_by_tag`).
LIST_PAGE_SIZE = 500
#: ``Accept`` of the GC listing: metadata only (``meta.k8s.io/v1`` ``PartialObjectMetadataList``,
#: API concepts, "Receiving resources as PartialObjectMetadata"), else the plain list from a
#: server that cannot transform (its items carry the same ``metadata``).
METADATA_LIST_ACCEPT = "application/json;as=PartialObjectMetadataList;g=meta.k8s.io;v=v1,application/json"
#: (connect, read) timeout of one page of the GC listing, seconds.
LIST_TIMEOUT = (10, 60)
#: Times the GC listing starts over when its continue token expires (410) mid-way.
LIST_RESTARTS = 2


def security_contexts(port: int) -> tuple[k8s.V1PodSecurityContext, k8s.V1SecurityContext]:
    """Return the (Pod, container) security contexts of a Squid Pod listening on ``port``.

    Pod: seccomp ``RuntimeDefault``.  Container: ``allowPrivilegeEscalation: false`` (no_new_privs),
    capabilities ``drop: [ALL]`` and ``add`` :data:`SQUID_CAPABILITIES` (plus ``NET_BIND_SERVICE``
    when ``port`` < 1024: Squid binds after switching users and keeps only that capability).
    See https://kubernetes.io/docs/tasks/configure-pod-container/security-context/.
    """
    add = list(SQUID_CAPABILITIES) + (["NET_BIND_SERVICE"] if port < 1024 else [])
    pod = k8s.V1PodSecurityContext(seccomp_profile=k8s.V1SeccompProfile(type="RuntimeDefault"))
    container = k8s.V1SecurityContext(allow_privilege_escalation=False,
                                      capabilities=k8s.V1Capabilities(drop=["ALL"], add=add))
    return pod, container


def _gone(exc: Exception) -> bool:
    """Whether ``exc`` is the API's 404: the object is already gone (success for a delete)."""
    return isinstance(exc, k8s.ApiException) and exc.status == 404


def _classify(exc: Exception, what: str) -> Exception:
    """Map a kubernetes client error onto the taxonomy (the caller raises it ``from exc``)."""
    if isinstance(exc, k8s.ApiException):
        status, body = exc.status or 0, (exc.body or "") if isinstance(exc.body, str) else ""
        if status == 404:
            return NotFound(f"{what}: not found")
        if status == 403 and "exceeded quota" in body:
            return QuotaExceeded(f"{what}: namespace quota exceeded")
        if status in (429,) or status >= 500:
            return Transient(f"{what}: API server answered {status}")
        if status in (400, 401, 403, 409, 422):
            return Permanent(f"{what}: API server answered {status} {exc.reason}")
        return Transient(f"{what}: API server answered {status}")
    if isinstance(exc, (urllib3.exceptions.HTTPError, OSError)):
        return Transient(f"{what}: {type(exc).__name__}")
    return Transient(f"{what}: {type(exc).__name__}: {exc}")


def split_provider_id(provider_id: str) -> tuple[str, str]:
    """Return ``(namespace, pod)`` of a ``<namespace>/<pod>`` provider ID.

    Raises:
        Permanent: the ID does not have that shape.
    """
    ns, sep, name = provider_id.partition("/")
    if not sep or not ns or not name or "/" in name:
        raise Permanent(f"malformed kubernetes provider ID {provider_id!r} (want <namespace>/<pod>)")
    return ns, name


def to_instance(pod: k8s.V1Pod) -> Instance:
    """Map a Pod onto an :class:`Instance` (see the module docstring for the phase mapping)."""
    meta: Any = pod.metadata  # a Pod read from the API always carries its metadata
    status = pod.status or k8s.V1PodStatus()
    phase = status.phase or "Pending"
    ip = status.pod_ip or None
    if meta.deletion_timestamp or phase in ("Succeeded", "Failed", "Unknown"):
        state = InstanceState.TERMINATED
    elif phase == "Running" and ip:
        state = InstanceState.RUNNING
    else:
        state = InstanceState.PROVISIONING
    labels = meta.labels or {}
    tags = {_LABEL_TO_TAG[k]: v for k, v in labels.items() if k in _LABEL_TO_TAG}
    return Instance(
        provider_id=f"{meta.namespace}/{meta.name}", name=meta.name, state=state,
        address=ip if state == InstanceState.RUNNING else None,
        created=meta.creation_timestamp, tags=tags, zone=meta.namespace,
    )


def instance_from_metadata(meta: dict) -> Instance:
    """Map a Pod's ``metadata`` (an item of a metadata-only list) onto an :class:`Instance`.

    Without the Pod's status the phase is unknown: a Pod being deleted is Terminated, any other
    Provisioning, and there is no address.  Enough for GC, which reads the provider ID, the
    tags and the creation time (``None`` when unparsable: GC keeps such an instance).
    """
    namespace, name = meta.get("namespace") or "", meta.get("name") or ""
    labels = meta.get("labels") or {}
    tags = {_LABEL_TO_TAG[k]: v for k, v in labels.items() if k in _LABEL_TO_TAG}
    try:
        created = parse_rfc3339(str(meta["creationTimestamp"]))
    except (KeyError, ValueError):
        created = None
    state = InstanceState.TERMINATED if meta.get("deletionTimestamp") else InstanceState.PROVISIONING
    return Instance(provider_id=f"{namespace}/{name}", name=name, state=state, address=None, created=created,
                    tags=tags, zone=namespace)


#: Seconds after which a process writes a namespace's egress NetworkPolicy again before a Pod,
#: even with the same config.
EGRESS_RECHECK_SECONDS = 300.0


class KubernetesProvider(Provider, CheckableProvider):
    """Provider of Squid Pods (with a check of the cluster).

    Args:
        pc: the provider's config entry (settings: :class:`KubernetesSettings`).
        client: a :class:`kubernetes.client.ApiClient` used for every call.
        client_factory: else, ``client_factory() -> ApiClient``, called on every use (never at
            construction), so a provider made before a fork uses the child's client: the
            composition root passes the gateway's per-process client (:func:`app.kube.gateway.api_client`,
            through :mod:`app.wiring`).  This package never imports the gateway.
    Raises:
        TypeError: neither ``client`` nor ``client_factory`` given.
    """

    type = "kubernetes"
    #: The Pod mounts the credentials Secret and follows its changes: nothing is baked in.
    credentials_in_instance = False

    def __init__(self, pc: ProviderConfig, client: k8s.ApiClient | None = None, *,
                 client_factory: Callable[[], k8s.ApiClient] | None = None) -> None:
        if client is None and client_factory is None:
            raise TypeError("KubernetesProvider needs a client or a client_factory")
        self.name = pc.name
        self.settings = pc.settings
        self.squid_policy = pc.squid
        self._client = client
        self._client_factory = client_factory
        #: namespace -> (digest of the egress NetworkPolicy written, when): see _ensure_egress_policy
        self._egress_ensured: dict[str, tuple[str, float]] = {}

    @property
    def core(self) -> k8s.CoreV1Api:
        # The constructor refuses to build a provider with neither a client nor a factory.
        return k8s.CoreV1Api(self._client if self._client is not None
                             else self._client_factory())  # type: ignore[misc]

    def _pod(self, request: CreateRequest, namespace: str) -> k8s.V1Pod:
        port = request.port or self.settings.port
        labels = {_TAG_TO_LABEL.get(k, f"crawl.example.com/{k}"): v for k, v in request.tags.items()}
        labels[LABEL_NAME] = "squid"
        env = [k8s.V1EnvVar(name="SQUID_CONF", value=request.squid_config or "")]
        mounts = [k8s.V1VolumeMount(name="tmp", mount_path="/tmp"),
                  k8s.V1VolumeMount(name="spool", mount_path="/var/spool/squid"),
                  k8s.V1VolumeMount(name="logs", mount_path="/var/log/squid")]
        volumes = [k8s.V1Volume(name=n, empty_dir=k8s.V1EmptyDirVolumeSource()) for n in ("tmp", "spool", "logs")]
        if request.auth_secret:
            # The htpasswd line is mounted from the Proxy's credentials Secret where the squid.conf
            # expects it: nothing secret in the Pod spec, nothing written at start (the root
            # filesystem may be read-only and the image non-root).
            # The directory, not the file (no subPath): a subPath mount never sees an update.
            directory, _, filename = DEFAULT_HTPASSWD_PATH.rpartition("/")
            volumes.append(k8s.V1Volume(name=AUTH_VOLUME, secret=k8s.V1SecretVolumeSource(
                secret_name=request.auth_secret, default_mode=0o444,
                items=[k8s.V1KeyToPath(key=SECRET_HTPASSWD_KEY, path=filename)])))
            mounts.append(k8s.V1VolumeMount(name=AUTH_VOLUME, mount_path=directory, read_only=True))
        pod_security, container_security = security_contexts(port)
        return k8s.V1Pod(
            metadata=k8s.V1ObjectMeta(name=request.name, namespace=namespace, labels=labels),
            spec=k8s.V1PodSpec(
                restart_policy="Always",
                automount_service_account_token=False,
                security_context=pod_security,
                containers=[k8s.V1Container(
                    name=CONTAINER, image=self._image(request),
                    command=["/bin/sh", "-c", START_SCRIPT], env=env,
                    security_context=container_security,
                    ports=[k8s.V1ContainerPort(container_port=port, name="proxy", protocol="TCP")],
                    readiness_probe=k8s.V1Probe(tcp_socket=k8s.V1TCPSocketAction(port=port),
                                                period_seconds=5),
                    volume_mounts=mounts,
                )],
                volumes=volumes,
            ),
        )

    def _ensure_egress_policy(self, namespace: str) -> None:
        """Create, or replace with the current config, the Squid Pods' egress NetworkPolicy in ``namespace``.

        It selects every Squid Pod of the operator in the namespace (labels
        ``app.kubernetes.io/name=squid``, ``app.kubernetes.io/managed-by=proxy-operator``) and is
        labelled ``app.kubernetes.io/managed-by=proxy-operator``; it stays when the last Pod goes.
        Written once per namespace and process while the config is unchanged, again after
        :data:`EGRESS_RECHECK_SECONDS` (one deleted by hand comes back).

        Raises:
            Permanent / Transient: as mapped from the API's answer (a Pod is not created
                without its NetworkPolicy).
        """
        body = egress.squid_network_policy(self.squid_policy, namespace,
                                           {LABEL_NAME: "squid", LABEL_MANAGED_BY: naming.MANAGED_BY})
        digest = hashlib.sha256(json.dumps(body, sort_keys=True, default=str).encode()).hexdigest()
        done = self._egress_ensured.get(namespace)
        if done is not None and done[0] == digest and time.monotonic() - done[1] < EGRESS_RECHECK_SECONDS:
            return  # written by this process lately: one write per namespace, not one per Pod
        api = k8s.NetworkingV1Api(self.core.api_client)
        what = f"NetworkPolicy {namespace}/{egress.NETWORK_POLICY_NAME}"
        try:
            try:
                api.create_namespaced_network_policy(namespace, body)  # type: ignore[arg-type]  # a dict body is sent as is
                log.info("created %s", what)
            except k8s.ApiException as exc:
                if exc.status != 409:
                    raise
                api.replace_namespaced_network_policy(egress.NETWORK_POLICY_NAME, namespace,
                                                      body)  # type: ignore[arg-type]  # a dict body is sent as is
        except Exception as exc:
            raise _classify(exc, f"ensure {what}") from exc
        self._egress_ensured[namespace] = (digest, time.monotonic())

    def _image(self, request: CreateRequest) -> str:
        """Return the container image for ``request``: the configured default or an allowed one.

        Raises:
            SpecNotAllowed: ``spec.placement.image`` is neither ``kubernetes.image`` nor in
                ``kubernetes.images``.
        """
        if not request.image:
            return self.settings.image
        allowed = self.settings.allowed_images()
        if request.image not in allowed:
            raise SpecNotAllowed("spec.placement.image", f"{request.image!r} is not an image provider "
                                 f"{self.name} allows (kubernetes.image/images: {', '.join(allowed)})")
        return request.image

    def instance_ids(self, name: str, namespace: str, zone: str | None = None) -> list[str]:
        """Return ``["<namespace>/<name>"]``: the one provider ID a Pod named ``name`` can have.

        The namespace is the configured one, else the Proxy's ``namespace``; ``zone`` plays
        no part.  This is the ID :meth:`create` returns for the same name.
        """
        return [f"{self.settings.namespace or namespace}/{name}"]

    def create(self, request: CreateRequest) -> Instance:
        """Create the Squid Pod ``request.name``; an existing Pod of that name is returned as is.

        Raises:
            SpecNotAllowed: (Permanent) ``spec.placement.image`` is not allowed by the config,
                or ``spec.placement.capacity`` is Spot; nothing is sent to the API.
            Transient: the existing Pod is still terminating (a replaced instance), or the API
                is unavailable.
            QuotaExceeded / Permanent / NotFound: as mapped from the API's answer.
        """
        refuse_spot(request, self.name, self.type)
        namespace = self.settings.namespace or request.namespace
        body = self._pod(request, namespace)  # refuses a disallowed image before any call
        if self.settings.egress_network_policy:
            self._ensure_egress_policy(namespace)
        try:
            pod = self.core.create_namespaced_pod(namespace, body)
            log.info("created pod %s/%s", namespace, request.name)
            return to_instance(pod)
        except k8s.ApiException as exc:
            if exc.status != 409:
                raise _classify(exc, f"create pod {namespace}/{request.name}") from exc
        except Exception as exc:
            raise _classify(exc, f"create pod {namespace}/{request.name}") from exc
        inst = self.get(f"{namespace}/{request.name}")
        if inst.state == InstanceState.TERMINATED:
            raise Transient(f"pod {namespace}/{request.name} from a previous instance is still terminating")
        return inst

    def get(self, provider_id: str) -> Instance:
        """Return the Pod's state.  Raises :class:`NotFound` when it does not exist."""
        ns, name = split_provider_id(provider_id)
        try:
            return to_instance(self.core.read_namespaced_pod(name, ns))
        except Exception as exc:
            raise _classify(exc, f"get pod {provider_id}") from exc

    def delete(self, provider_id: str) -> None:
        """Delete the Pod if it is ours; a Pod already gone is success.

        Re-reads the Pod and refuses one whose labels lack ``app.kubernetes.io/managed-by=
        proxy-operator`` and a ``crawl.example.com/proxy-uid`` (:func:`app.providers.base.require_managed`);
        the delete then carries the Pod's UID as a precondition, so a Pod replaced between the
        read and the delete is not deleted unread (the API answers 409: Transient, retried).

        Raises:
            NotManaged: (Permanent) the Pod is not ours; it is left in place.
            Permanent: a malformed provider ID, or the API refused (400/401/403/422).
            Transient: the API is unavailable, or the Pod was replaced meanwhile (409).
        """
        ns, name = split_provider_id(provider_id)
        try:
            pod = self.core.read_namespaced_pod(name, ns)
        except Exception as exc:  # classified below
            if _gone(exc):
                return
            raise _classify(exc, f"read pod {provider_id} before deleting it") from exc
        require_managed(to_instance(pod).tags, self.name, provider_id)
        uid = pod.metadata.uid  # type: ignore[union-attr]  # a Pod read from the API carries its metadata
        options = k8s.V1DeleteOptions(preconditions=k8s.V1Preconditions(uid=uid))
        try:
            self.core.delete_namespaced_pod(name, ns, body=options)
            log.info("deleted pod %s", provider_id)
        except k8s.ApiException as exc:
            if exc.status == 404:
                return
            if exc.status == 409:
                raise Transient(f"delete pod {provider_id}: the Pod was replaced since it was read") from exc
            raise _classify(exc, f"delete pod {provider_id}") from exc
        except Exception as exc:
            raise _classify(exc, f"delete pod {provider_id}") from exc

    def abandon(self, provider_id: str) -> None:
        """Label the Pod ``crawl.example.com/abandoned=true`` (merge patch of its labels only).

        A Pod already gone is success.

        Raises:
            Permanent: a malformed provider ID, or the API refused (400/401/403/409/422).
            Transient: the API is unavailable (5xx, 429, connection errors).
        """
        ns, name = split_provider_id(provider_id)
        body = {"metadata": {"labels": {LABEL_ABANDONED: naming.ABANDONED}}}
        try:
            self.core.patch_namespaced_pod(name, ns, body)
            log.info("marked pod %s abandoned", provider_id)
        except Exception as exc:  # classified below
            if _gone(exc):
                return
            raise _classify(exc, f"label pod {provider_id} abandoned") from exc

    def start(self, provider_id: str) -> None:
        """Make the Pod run again, as far as a Pod can.

        A Pod that is pending or running needs nothing (the kubelet restarts its container:
        ``restartPolicy: Always``).  A Pod that has ended (Succeeded/Failed/Unknown, or being
        deleted) can never run again (https://kubernetes.io/docs/concepts/workloads/pods/pod-lifecycle/):
        it is deleted and :class:`NotFound` raised, so the caller recreates it.

        Raises:
            NotFound: the Pod does not exist (or was deleted because it had ended).
            Permanent / Transient: as for :meth:`get` and :meth:`delete`.
        """
        inst = self.get(provider_id)
        if inst.state != InstanceState.TERMINATED:
            return
        self.delete(provider_id)
        raise NotFound(f"pod {provider_id} has ended and cannot be started again; deleted so it is recreated")

    def list_by_tag(self, tag: str) -> ListResult:
        """List every Pod labelled ``app.kubernetes.io/managed-by=<tag>`` in every namespace.

        Metadata only and paged (:data:`METADATA_LIST_ACCEPT`, ``limit`` :data:`LIST_PAGE_SIZE`,
        ``continue``), so neither the Pod specs nor a whole-cluster body are ever held; the
        instances come from :func:`instance_from_metadata` (no phase or address).  Every page
        is read from the first page's snapshot; when the continue token expires (410) the
        listing starts over, at most :data:`LIST_RESTARTS` times.

        Raises:
            Transient / Permanent: as mapped from the API's answer (a 410 beyond the restarts
                is Transient).
        """
        selector = f"{LABEL_MANAGED_BY}={tag}"
        restarts = 0
        while True:
            instances: list[Instance] = []
            token: str | None = None
            try:
                while True:
                    page = self._metadata_page(selector, token)
                    instances.extend(instance_from_metadata(item.get("metadata") or {})
                                     for item in page.get("items") or [])
                    token = (page.get("metadata") or {}).get("continue")
                    if not token:
                        return ListResult(instances)
            except k8s.ApiException as exc:
                if exc.status == 410 and token and restarts < LIST_RESTARTS:
                    restarts += 1
                    log.info("listing managed pods: continue token expired after %d pod(s); starting over",
                             len(instances))
                    continue
                raise _classify(exc, "list managed pods") from exc
            except Exception as exc:
                raise _classify(exc, "list managed pods") from exc

    def _metadata_page(self, selector: str, token: str | None) -> dict:
        """One page of the metadata-only Pod listing, parsed (only the JSON is kept, no models)."""
        # Without preloading the client returns the urllib3 response, not a V1PodList.
        resp: Any = self.core.list_pod_for_all_namespaces(
            label_selector=selector, limit=LIST_PAGE_SIZE, _continue=token, _preload_content=False,
            _headers={"Accept": METADATA_LIST_ACCEPT}, _request_timeout=LIST_TIMEOUT)
        try:
            return json.loads(resp.data)
        finally:
            resp.release_conn()

    def check(self) -> list[TargetVerdict]:
        """List at most one managed Pod cluster-wide: proves the API answers and RBAC allows GC."""
        try:
            self.core.list_pod_for_all_namespaces(label_selector=f"{LABEL_MANAGED_BY}={naming.MANAGED_BY}",
                                                  limit=1, _request_timeout=10)
        except k8s.ApiException as exc:
            reason = "Forbidden" if exc.status == 403 else "APIError"
            return [TargetVerdict(CHECK_TARGET, False, reason, f"listing pods answered {exc.status} {exc.reason}")]
        except Exception as exc:  # noqa: BLE001
            return [TargetVerdict(CHECK_TARGET, False, "Unreachable", f"{type(exc).__name__}: {exc}")]
        return [TargetVerdict(CHECK_TARGET, True, "Ready", "API server answers; pods listable cluster-wide")]
