"""HTTP front of the fake Kubernetes API (stdlib ``ThreadingHTTPServer``, HTTP/1.1 keep-alive).

Paths follow the API server's layout: ``/api/v1/...`` for core and
``/apis/<group>/<version>/...`` for the rest; collections per namespace
(``/namespaces/<ns>/<plural>``) and across namespaces (``/<plural>``), objects
(``.../<plural>/<name>``), the ``status`` subresource and, for types that have one, the
``scale`` subresource (``autoscaling/v1`` ``Scale``: GET, PUT, PATCH); ``?watch=true`` (or the legacy
``/watch/`` prefix) streams events as newline-delimited JSON over chunked encoding, like the
real server.  Discovery (``/api``, ``/apis``, ``/api/v1``, ``/apis/<g>/<v>``; aggregated
``apidiscovery.k8s.io/v2`` when the client asks for it) and ``/version`` answer too.

For the real ``kubectl`` (see :mod:`devcluster.apiserver.openapi`, :mod:`devcluster.apiserver.tables`,
:mod:`devcluster.apiserver.apply`): OpenAPI v3 (``/openapi/v3``, per group-version) and v2 (JSON or
protobuf, :mod:`devcluster.apiserver.openapi_proto`) built from the CRDs under ``deploy/crd``, which
``GET /apis/apiextensions.k8s.io/v1/customresourcedefinitions`` lists; Table answers for ``Accept: ...;as=Table;g=meta.k8s.io``
(lists, single objects and watches) with the CRDs' printer columns; metadata-only answers
(``as=PartialObjectMetadataList`` for lists, ``as=PartialObjectMetadata`` for an object or a
watch, :mod:`devcluster.apiserver.negotiation`); paged lists (``limit``/``continue`` from one
snapshot, see :meth:`devcluster.apiserver.store.Store.list`); server-side apply
(``PATCH`` with ``application/apply-patch+yaml``, ``fieldManager``, ``force``, managedFields,
409 conflicts); ``fieldValidation`` passed to admission (``Strict``: unknown fields are a 400).

Watch behaviour (k8s "Efficient detection of changes" in the API concepts doc):
``resourceVersion=N`` streams changes after N; unset or ``"0"`` first sends the current
objects as ADDED; ``allowWatchBookmarks=true`` adds BOOKMARK events every
``bookmark_interval`` seconds carrying the newest resourceVersion the stream has passed;
``timeoutSeconds`` ends the stream server-side; a version older than the retained history
gets a single ERROR event holding a 410 Expired ``Status`` (what the real server sends).
"""

from __future__ import annotations

import collections
import json
import logging
import select
import socket
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Iterable
from urllib.parse import parse_qs, urlsplit

import yaml

from devcluster.apiserver import negotiation, openapi, openapi_proto
from devcluster.apiserver import resources as R
from devcluster.apiserver import tables
from devcluster.apiserver.errors import ApiError
from devcluster.apiserver.gc import GarbageCollector
from devcluster.apiserver.resources import ResourceType
from devcluster.apiserver.store import Closed, Store, dumps

log = logging.getLogger("kubefake")

_TRUE = {"1", "t", "true"}
_REASONS = {200: "OK", 201: "Created", 400: "Bad Request", 404: "Not Found", 405: "Method Not Allowed",
            406: "Not Acceptable", 409: "Conflict", 410: "Gone", 415: "Unsupported Media Type", 422: "Unprocessable Entity",
            429: "Too Many Requests", 500: "Internal Server Error", 503: "Service Unavailable",
            504: "Gateway Timeout"}


class _Fault:
    """A scripted failure (the next ``times`` matching requests get ``code``) or delay."""

    def __init__(self, verb: str | None, resource: str | None, code: int, times: int, reason: str,
                 delay: float = 0.0, message: str | None = None, after: int = 0) -> None:
        self.verb, self.resource, self.code, self.times, self.reason = verb, resource, code, times, reason
        self.delay, self.message, self.after = delay, message, after


class _WatchStream:
    """Bookkeeping for one open watch (so tests can hang it)."""

    def __init__(self, resource: str) -> None:
        self.resource = resource
        self.hung = threading.Event()
        self.columns: list | None = None  # Table columns when the client asked for Tables
        self.include = "Metadata"
        self.partial = False  # events carry PartialObjectMetadata (as=PartialObjectMetadata)


class FakeKube:
    """An in-process fake of kube-apiserver for the official ``kubernetes`` client.

    Args:
        host / port: bind address (port 0 = a free port).
        types: resource types served (default: pods, secrets, events, namespaces, leases,
            events.k8s.io events, proxies, providerhealths).
        history_limit: watch events retained before old ones are compacted (410 after that).
        bookmark_interval: seconds between BOOKMARK events on watches that allow them.
        default_watch_timeout: seconds a watch lasts when the client sends no timeoutSeconds.
        require_namespaces: creates in a missing namespace get 404 (like a real cluster).
        admission: ``{plural: admit}`` hooks, see :meth:`Store.set_admission`.
        crd_dir: directory of the CustomResourceDefinitions whose schemas and printer columns
            the fake publishes (OpenAPI, Tables); default ``deploy/crd``.
        garbage_collector: run the cluster's garbage collector (:mod:`devcluster.apiserver.gc`:
            dependents are deleted or orphaned by their ``ownerReferences``), as every real
            cluster does; ``gc`` is it (``gc.pause()`` / ``gc.resume()``), ``None`` when off.

    Use as a context manager or call :meth:`start` / :meth:`close`.  ``url`` is
    ``http://127.0.0.1:<port>``.
    """

    def __init__(self, *, host: str = "127.0.0.1", port: int = 0,
                 types: Iterable[ResourceType] = R.DEFAULT_TYPES, history_limit: int = 10000,
                 bookmark_interval: float = 1.0, default_watch_timeout: float = 1800.0,
                 require_namespaces: bool = False, admission: dict | None = None,
                 crd_dir: str | None = None, garbage_collector: bool = True) -> None:
        self.store = Store(types, history_limit=history_limit, require_namespaces=require_namespaces)
        self.gc: GarbageCollector | None = GarbageCollector(self.store) if garbage_collector else None
        self.crds = openapi.load_crds(*([crd_dir] if crd_dir else []))
        self._openapi_cache: dict[str, bytes] = {}
        self.bookmark_interval = bookmark_interval
        self.default_watch_timeout = default_watch_timeout
        self.requests: collections.Counter = collections.Counter()
        self.request_log: list[tuple[str, str]] | None = None  # (method, path) in order, see record_requests
        self._audits: dict[str, set] = {}
        self._host, self._port = host, port
        self._faults: list[_Fault] = []
        self._watches: set[_WatchStream] = set()
        self._lock = threading.Lock()
        self._release = threading.Event()
        self._server: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None
        for name, hook in (admission or {}).items():
            self.store.set_admission(name, hook)

    # -- lifecycle -------------------------------------------------------------------------
    def start(self) -> "FakeKube":
        """Bind and serve in a daemon thread; return self."""
        handler = type("Handler", (_Handler,), {"fake": self})
        server = ThreadingHTTPServer((self._host, self._port), handler, bind_and_activate=False)
        server.daemon_threads = True
        server.block_on_close = False
        server.request_queue_size = 256
        server.allow_reuse_address = True
        server.server_bind()
        server.server_activate()
        self._server = server
        self._thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05},
                                        name="kubefake", daemon=True)
        self._thread.start()
        if self.gc is not None:
            self.gc.start()
        return self

    def close(self) -> None:
        """Stop serving; open watches end; the garbage collector stops."""
        if self.gc is not None:
            self.gc.close()
        self.store.close()
        self._release.set()
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None

    def __enter__(self) -> "FakeKube":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.close()

    @property
    def port(self) -> int:
        """The bound TCP port."""
        assert self._server is not None, "not started"
        return self._server.server_address[1]

    @property
    def url(self) -> str:
        """``http://host:port``."""
        return f"http://{self._host}:{self.port}"

    # -- client helpers --------------------------------------------------------------------
    def configuration(self):
        """Return a :class:`kubernetes.client.Configuration` pointing at this server."""
        from kubernetes import client as k8s

        cfg = k8s.Configuration()
        cfg.host = self.url
        cfg.api_key = {"authorization": "Bearer kubefake"}
        return cfg

    def api_client(self):
        """Return a new :class:`kubernetes.client.ApiClient` for this server (close it when done)."""
        from kubernetes import client as k8s

        return k8s.ApiClient(self.configuration())

    def write_kubeconfig(self, path: str, *, token: str = "kubefake") -> str:
        """Write a kubeconfig for this server to ``path`` (see :func:`write_kubeconfig`); a
        ``token`` of the test's choice lets :meth:`audit` tell its requests apart."""
        return write_kubeconfig(path, self.url, token=token)

    def _openapi_v3_docs(self) -> dict[str, bytes]:
        """The OpenAPI v3 documents per group-version path (built once)."""
        with self._lock:
            docs = self._openapi_cache.get("v3")
            if docs is None:
                by_gv: dict[str, list[ResourceType]] = {}
                for t in self.store.types.values():
                    by_gv.setdefault(openapi.gv_path(t), []).append(t)
                docs = {gv: openapi.dumps(openapi.v3_group_version(ts, self.crds)) for gv, ts in by_gv.items()}
                self._openapi_cache["v3"] = docs
            return docs

    # -- test hooks ------------------------------------------------------------------------
    def set_admission(self, resource: str | ResourceType, admit) -> None:
        """Install an admission hook (see :meth:`Store.set_admission`)."""
        self.store.set_admission(resource, admit)

    def compact(self, keep: int = 0) -> int:
        """Compact the watch history (see :meth:`Store.compact`); return the compacted version."""
        return self.store.compact(keep)

    def hang_watches(self, resource: str | None = None) -> int:
        """Make the currently open watch streams (optionally of one plural) go silent.

        They send nothing more (no events, no bookmarks, no end of stream) but keep the
        connection open, as a dead load balancer or a wedged server would.  Watches opened
        later are unaffected.  Returns how many streams were hung.
        """
        with self._lock:
            hung = [w for w in self._watches if resource is None or w.resource == resource]
        for w in hung:
            w.hung.set()
        return len(hung)

    def release_hung_watches(self) -> None:
        """Drop the connections of hung watches (they end without a terminating chunk)."""
        self._release.set()
        self._release = threading.Event()

    def open_watches(self, resource: str | None = None) -> int:
        """Number of open watch streams (optionally of one plural), hung ones included."""
        with self._lock:
            return sum(1 for w in self._watches if resource is None or w.resource == resource)

    def fail_next(self, verb: str | None = None, resource: str | None = None, *, code: int = 500,
                  times: int = 1, reason: str = "InternalError", message: str | None = None,
                  after: int = 0) -> None:
        """Answer the next ``times`` requests matching ``verb``/``resource`` with an error Status.

        Args:
            verb: ``get``, ``list``, ``watch``, ``create``, ``update``, ``patch``, ``delete``
                or ``None`` for any.
            resource: plural, optionally ``plural/status``; ``None`` for any.
            code / reason: HTTP status and ``Status.reason``.
            message: ``Status.message`` (default: names the injected failure), e.g.
                kube-apiserver's ``pods "x" is forbidden: exceeded quota: ...``.
            after: let that many matching requests through first (fail the second write of a
                step, not its first).
        """
        with self._lock:
            self._faults.append(_Fault(verb, resource, code, times, reason, message=message, after=after))

    def delay_next(self, verb: str | None = None, resource: str | None = None, *, seconds: float,
                   times: int = 1) -> None:
        """Hold the next ``times`` matching requests for ``seconds`` before processing them.

        The request is counted on arrival and carried out after the delay even if the client
        has gone meanwhile (a write in flight at the server when its client dies), so a test
        can kill a worker between sending a request and seeing its answer.
        """
        with self._lock:
            self._faults.append(_Fault(verb, resource, 0, times, "", delay=seconds))

    def clear_faults(self) -> None:
        """Forget every scripted failure and delay not used up yet."""
        with self._lock:
            self._faults.clear()

    def request_count(self, verb: str | None = None, resource: str | None = None) -> int:
        """Requests served so far, filtered by verb and/or resource (plural or ``plural/status``)."""
        with self._lock:
            return sum(n for (v, r), n in self.requests.items()
                       if (verb is None or v == verb) and (resource is None or r == resource))

    def record_requests(self) -> list[tuple[str, str]]:
        """Record, from now on, every request as ``(method, path)`` in arrival order (the query
        left out); returns the live list (a new one each call).  Off until first called."""
        with self._lock:
            self.request_log = []
            return self.request_log

    def audit(self, token: str) -> set:
        """Record, from now on, every resource request sent with ``Authorization: Bearer <token>``.

        Returns the live set this fills with ``(verb, group, resource, namespace)``: the RBAC
        verb (``get list watch create update patch delete``), the API group (``""`` for core),
        the resource (``plural`` or ``plural/subresource``) and the namespace (``None`` for a
        cluster-scoped or all-namespaces request), as kube-apiserver's authorizer sees a request
        (Kubernetes docs, "Authorization", request verbs and attributes:
        https://kubernetes.io/docs/reference/access-authn-authz/authorization/#determine-the-request-verb).
        Discovery and ``/version`` are not recorded (every authenticated user may read them).
        Requests with other tokens (a test's own client) are not recorded either.
        """
        with self._lock:
            return self._audits.setdefault(token, set())

    def _audit(self, authorization: str, verb: str, group: str, resource: str, namespace: str | None) -> None:
        scheme, _, token = (authorization or "").partition(" ")
        if scheme.lower() != "bearer":
            return
        with self._lock:
            seen = self._audits.get(token.strip())
            if seen is not None:
                seen.add((verb, group, resource, namespace))

    def _take_fault(self, verb: str, resource: str) -> ApiError | None:
        delay = 0.0
        error = None
        with self._lock:
            self.requests[(verb, resource)] += 1
            for f in list(self._faults):
                if (f.verb in (None, verb)) and (f.resource in (None, resource)):
                    if f.delay and delay:
                        continue
                    if not f.delay and error is not None:
                        continue
                    if f.after > 0:
                        f.after -= 1
                        continue
                    f.times -= 1
                    if f.times <= 0:
                        self._faults.remove(f)
                    if f.delay:
                        delay = f.delay
                    else:
                        error = ApiError(f.code, f.reason,
                                         f.message or f"injected failure ({f.code}) for {verb} {resource}")
        if delay:
            time.sleep(delay)
        return error


def write_kubeconfig(path: str, url: str, *, namespace: str = "default", token: str = "kubefake") -> str:
    """Write a kubeconfig that points ``kubectl``-style clients at ``url``; return ``path``.

    ``KUBECONFIG=path`` then makes :func:`app.kube.gateway.api_client` (and subprocesses using it)
    reach the fake.  The token is a placeholder: the fake does not authenticate, it only
    records requests by token (:meth:`FakeKube.audit`).
    """
    import yaml

    doc = {
        "apiVersion": "v1", "kind": "Config", "current-context": "kubefake", "preferences": {},
        "clusters": [{"name": "kubefake", "cluster": {"server": url}}],
        "users": [{"name": "kubefake", "user": {"token": token}}],
        "contexts": [{"name": "kubefake", "context": {"cluster": "kubefake", "user": "kubefake",
                                                      "namespace": namespace}}],
    }
    with open(path, "w") as fh:
        yaml.safe_dump(doc, fh)
    return path


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    disable_nagle_algorithm = True
    fake: FakeKube  # set on the subclass made by FakeKube.start

    def log_message(self, fmt, *args) -> None:  # quiet; errors are logged explicitly
        pass

    def do_GET(self) -> None:
        self._dispatch("GET")

    def do_POST(self) -> None:
        self._dispatch("POST")

    def do_PUT(self) -> None:
        self._dispatch("PUT")

    def do_PATCH(self) -> None:
        self._dispatch("PATCH")

    def do_DELETE(self) -> None:
        self._dispatch("DELETE")

    # -- plumbing --------------------------------------------------------------------------
    def _send(self, code: int, body: bytes, content_type: str = "application/json") -> None:
        head = (f"HTTP/1.1 {code} {_REASONS.get(code, 'Status')}\r\nContent-Type: {content_type}\r\n"
                f"Content-Length: {len(body)}\r\n\r\n").encode()
        self.wfile.write(head + body)

    def _body(self):
        length = int(self.headers.get("Content-Length") or 0)
        if not length:
            return None
        raw = self.rfile.read(length)
        ctype = (self.headers.get("Content-Type") or "").split(";")[0].strip().lower()
        if ctype == "application/apply-patch+yaml":  # YAML (JSON is YAML too)
            try:
                return yaml.safe_load(raw)
            except yaml.YAMLError as exc:
                raise ApiError.bad_request(f"error decoding YAML: {exc}") from None
        try:
            return json.loads(raw)
        except ValueError as exc:
            raise ApiError.bad_request(f"the request body is not valid JSON: {exc}") from None

    def _dispatch(self, method: str) -> None:
        try:
            url = urlsplit(self.path)
            if self.fake.request_log is not None:
                self.fake.request_log.append((method, url.path))
            query = {k: v[-1] for k, v in parse_qs(url.query, keep_blank_values=True).items()}
            body = self._body() if method in ("POST", "PUT", "PATCH", "DELETE") else None
            self._content_type = "application/json"
            code, out = self._route(method, [p for p in url.path.split("/") if p], query, body)
        except ApiError as exc:
            code, out = exc.code, dumps(exc.status())
        except (BrokenPipeError, ConnectionResetError):
            self.close_connection = True
            return
        except Exception as exc:  # a bug in the fake: answer like an apiserver panic would
            log.exception("kubefake: %s %s failed", method, self.path)
            code, out = 500, dumps(ApiError(500, "InternalError", f"kubefake: {exc!r}").status())
        if code is None:
            return  # a watch stream wrote its own response
        try:
            self._send(code, out, getattr(self, "_content_type", "application/json"))
        except (BrokenPipeError, ConnectionResetError):
            self.close_connection = True

    def _route(self, method: str, parts: list[str], query: dict, body):
        fake = self.fake
        store = fake.store
        if parts == ["version"]:
            return 200, dumps({"major": "1", "minor": "31", "gitVersion": "v1.31.0-kubefake",
                               "platform": "linux/amd64"})
        if parts and parts[0] == "openapi" and method == "GET":
            return self._openapi(parts[1:])
        if parts in (["api"], ["apis"]) and method == "GET" and self._wants_aggregated():
            self._content_type = "application/json;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList"
            return 200, openapi.dumps(openapi.aggregated_discovery(list(store.types.values()), fake.crds,
                                                                   legacy=parts == ["api"]))
        if parts[:4] == ["apis", "apiextensions.k8s.io", "v1", "customresourcedefinitions"] and method == "GET" \
                and len(parts) <= 5 and store.resource("apiextensions.k8s.io", "v1", "customresourcedefinitions") is None:
            return 200, self._crds(parts[4] if len(parts) == 5 else None)
        if parts and parts[0] == "api":
            group, rest = "", parts[1:]
            if not rest:
                return 200, dumps({"kind": "APIVersions", "versions": ["v1"]})
            version, rest = rest[0], rest[1:]
        elif parts and parts[0] == "apis":
            if len(parts) == 1:
                return 200, self._group_list()
            if len(parts) < 3:
                raise ApiError(404, "NotFound", "the server could not find the requested resource")
            group, version, rest = parts[1], parts[2], parts[3:]
        else:
            raise ApiError(404, "NotFound", "the server could not find the requested resource")
        if not rest:
            return 200, self._resource_list(group, version)
        watch = query.get("watch", "").lower() in _TRUE
        if rest[0] == "watch":
            watch, rest = True, rest[1:]
        namespace: str | None = None
        if (len(rest) >= 3 and rest[0] == "namespaces"
                and store.resource(group, version, rest[2]) is not None
                and store.resource(group, version, rest[2]).namespaced):
            namespace, rest = rest[1], rest[2:]
        self._request_scope = (group, namespace)  # for the audit (FakeKube.audit)
        rt = store.resource(group, version, rest[0]) if rest else None
        if rt is None or len(rest) > 3:
            raise ApiError(404, "NotFound", "the server could not find the requested resource")
        if not rt.namespaced and namespace is not None:
            raise ApiError(404, "NotFound", "the server could not find the requested resource")
        name = rest[1] if len(rest) > 1 else None
        sub = rest[2] if len(rest) > 2 else None
        if rt.namespaced and name is not None and namespace is None:
            raise ApiError(404, "NotFound", "the server could not find the requested resource")
        dry_run = query.get("dryRun") == "All"
        if name is None:
            if method == "GET":
                verb = "watch" if watch else "list"
                self._fault(verb, rt.plural)
                if watch:
                    self._watch(rt, namespace, query)
                    return None, b""
                limit = query.get("limit")
                form = negotiation.requested_form(self.headers.get("Accept"))
                negotiation.check_fits(form, is_list=True)
                try:
                    limit_n = int(limit) if limit else None
                except ValueError:
                    raise ApiError.bad_request(f"invalid limit {limit!r}") from None
                out = store.list(rt, namespace, label_selector=query.get("labelSelector"),
                                 field_selector=query.get("fieldSelector"),
                                 limit=limit_n if limit_n and limit_n > 0 else None,
                                 continue_token=query.get("continue") or None,
                                 metadata_only=form == negotiation.PARTIAL_LIST)
                return 200, out if form == negotiation.PARTIAL_LIST else self._maybe_table(rt, out, query, is_list=True)
            if method == "POST":
                if rt.namespaced and namespace is None:
                    raise ApiError.method_not_allowed()
                self._fault("create", rt.plural)
                return 201, store.create(rt, namespace or "", body, dry_run=dry_run,
                                         field_validation=query.get("fieldValidation"), manager=self._manager(query))
            raise ApiError.method_not_allowed()
        if method == "GET" and watch and sub is None:
            # a watch on one object: the collection watch narrowed to that name
            self._fault("watch", rt.plural)
            selector = f"metadata.name={name}"
            query = {**query, "fieldSelector": ",".join(filter(None, [query.get("fieldSelector"), selector]))}
            self._watch(rt, namespace, query)
            return None, b""
        resource = rt.plural + (f"/{sub}" if sub else "")
        if sub == "scale" and rt.scale is not None:
            return self._scale(rt, namespace or "", name, method, query, body, resource)
        if sub not in (None, "status") or (sub == "status" and not rt.status_subresource):
            raise ApiError(404, "NotFound", "the server could not find the requested resource")
        ns = namespace or ""
        options = {"field_validation": query.get("fieldValidation"), "manager": self._manager(query)}
        if method == "GET":
            self._fault("get", resource)
            return 200, self._maybe_table(rt, store.get(rt, ns, name).raw, query, is_list=False)
        if method == "PUT":
            self._fault("update", resource)
            return 200, store.update(rt, ns, name, body, subresource=sub, dry_run=dry_run, **options)
        if method == "PATCH":
            self._fault("patch", resource)
            ctype = self.headers.get("Content-Type", "")
            if ctype.split(";")[0].strip().lower() == "application/apply-patch+yaml":
                return store.apply(rt, ns, name, body, manager=query.get("fieldManager"),
                                   force=query.get("force", "").lower() in _TRUE, subresource=sub,
                                   dry_run=dry_run, field_validation=query.get("fieldValidation"))
            return 200, store.patch(rt, ns, name, ctype, body, subresource=sub, dry_run=dry_run, **options)
        if method == "DELETE" and sub is None:
            self._fault("delete", resource)
            options = body if isinstance(body, dict) else {}
            for key in ("propagationPolicy", "orphanDependents", "gracePeriodSeconds"):
                if key in query:
                    options.setdefault(key, query[key])
            return 200, store.delete(rt, ns, name, options, dry_run=dry_run)
        raise ApiError.method_not_allowed()

    def _scale(self, rt: ResourceType, ns: str, name: str, method: str, query: dict, body, resource: str):
        """``.../<name>/scale``: the ``autoscaling/v1`` ``Scale`` of the object (GET, PUT, PATCH)."""
        store = self.fake.store
        dry_run = query.get("dryRun") == "All"
        if method == "GET":
            self._fault("get", resource)
            return 200, store.get_scale(rt, ns, name)
        if method == "PUT":
            self._fault("update", resource)
            return 200, store.update_scale(rt, ns, name, body, dry_run=dry_run, manager=self._manager(query))
        if method == "PATCH":
            self._fault("patch", resource)
            return 200, store.patch_scale(rt, ns, name, self.headers.get("Content-Type", ""), body, dry_run=dry_run,
                                          manager=self._manager(query))
        raise ApiError.method_not_allowed()

    def _fault(self, verb: str, resource: str) -> None:
        """Record the request for :meth:`FakeKube.audit`, then apply any scripted fault."""
        group, namespace = self._request_scope
        self.fake._audit(self.headers.get("Authorization", ""), verb, group, resource, namespace)
        err = self.fake._take_fault(verb, resource)
        if err is not None:
            raise err

    def _manager(self, query: dict) -> str:
        """The request's field manager: ``fieldManager``, else the User-Agent's product (as upstream)."""
        return query.get("fieldManager") or (self.headers.get("User-Agent") or "unknown").split("/")[0] or "unknown"

    def _maybe_table(self, rt: ResourceType, raw: bytes, query: dict, *, is_list: bool) -> bytes:
        """``raw`` (a list or an object), or its Table or PartialObjectMetadata when the client asked for one."""
        form = negotiation.requested_form(self.headers.get("Accept"))
        negotiation.check_fits(form, is_list=is_list)
        if form == negotiation.PARTIAL:
            return dumps(negotiation.partial(json.loads(raw)))
        if not tables.wants_table(self.headers.get("Accept", "")):
            return raw
        doc = json.loads(raw)
        columns = tables.columns_for(rt.group, rt.plural, self.fake.crds.get((rt.group, rt.version, rt.plural)))
        include = query.get("includeObject") or "Metadata"
        if is_list:
            meta = doc.get("metadata") or {}
            return dumps(tables.table(columns, doc.get("items") or [], meta, include))
        return dumps(tables.table(columns, [doc], {"resourceVersion": doc["metadata"].get("resourceVersion", "")},
                                  include))

    # -- OpenAPI and aggregated discovery ----------------------------------------------------
    def _wants_aggregated(self) -> bool:
        first = (self.headers.get("Accept") or "").split(",")[0]
        return "as=APIGroupDiscoveryList" in first and "v=v2;" in first + ";" and "v2beta1" not in first

    def _openapi(self, rest: list[str]):
        """``/openapi/v2`` (JSON or protobuf, by ``Accept``) and ``/openapi/v3[/<gv>]``."""
        fake = self.fake
        accept = self.headers.get("Accept") or "*/*"
        if rest == ["v2"]:
            # the first media type of Accept the server can produce: JSON, or gnostic's protobuf
            wanted = [a.split(";")[0].strip() for a in accept.split(",")]
            form = next((w for w in wanted if w in ("application/json", "*/*", "application/*",
                                                     *openapi_proto.ACCEPTED)), None)
            if form is None:
                raise ApiError(406, "NotAcceptable", "only the following media types are accepted: application/json, "
                                                     + ", ".join(openapi_proto.ACCEPTED))
            if "v2" not in fake._openapi_cache:
                doc = openapi.v2_document(list(fake.store.types.values()), fake.crds)
                fake._openapi_cache["v2"] = openapi.dumps(doc)
                fake._openapi_cache["v2-protobuf"] = openapi_proto.document(doc)
            if form in openapi_proto.ACCEPTED:
                self._content_type = openapi_proto.MEDIA_TYPE
                return 200, fake._openapi_cache["v2-protobuf"]
            return 200, fake._openapi_cache["v2"]
        if rest[:1] == ["v3"]:
            docs = fake._openapi_v3_docs()
            if len(rest) == 1:
                return 200, openapi.dumps(openapi.v3_root(docs))
            body = docs.get("/".join(rest[1:]))
            if body is not None:
                return 200, body
        raise ApiError(404, "NotFound", "the server could not find the requested resource")

    def _crds(self, name: str | None) -> bytes:
        """``GET .../customresourcedefinitions[/<name>]``: the CRDs the fake admits objects
        through (read only: they come from ``deploy/crd``)."""
        items = openapi.crd_objects(self.fake.crds)
        if name is None:
            return dumps({"kind": "CustomResourceDefinitionList", "apiVersion": "apiextensions.k8s.io/v1",
                          "metadata": {"resourceVersion": "1"}, "items": items})
        for item in items:
            if item["metadata"]["name"] == name:
                return dumps(item)
        raise ApiError(404, "NotFound", f'customresourcedefinitions.apiextensions.k8s.io "{name}" not found')

    # -- discovery -------------------------------------------------------------------------
    def _group_list(self) -> bytes:
        groups: dict[str, list[str]] = {}
        for t in self.fake.store.types.values():
            if t.group:
                groups.setdefault(t.group, [])
                if t.version not in groups[t.group]:
                    groups[t.group].append(t.version)
        return dumps({"kind": "APIGroupList", "apiVersion": "v1", "groups": [
            {"name": g, "versions": [{"groupVersion": f"{g}/{v}", "version": v} for v in vs],
             "preferredVersion": {"groupVersion": f"{g}/{vs[0]}", "version": vs[0]}}
            for g, vs in sorted(groups.items())]})

    def _resource_list(self, group: str, version: str) -> bytes:
        types = [t for t in self.fake.store.types.values() if t.group == group and t.version == version]
        if not types:
            raise ApiError(404, "NotFound", "the server could not find the requested resource")
        verbs = ["create", "delete", "get", "list", "patch", "update", "watch"]
        resources = []
        for t in types:
            resources.append({"name": t.plural, "singularName": t.kind.lower(), "namespaced": t.namespaced,
                              "kind": t.kind, "verbs": verbs, "shortNames": list(t.short_names)})
            if t.status_subresource:
                resources.append({"name": f"{t.plural}/status", "singularName": "", "namespaced": t.namespaced,
                                  "kind": t.kind, "verbs": ["get", "patch", "update"]})
            if t.scale is not None:  # what client-go's scale client looks for (group, version, kind)
                resources.append({"name": f"{t.plural}/scale", "singularName": "", "namespaced": t.namespaced,
                                  "group": "autoscaling", "version": "v1", "kind": "Scale",
                                  "verbs": ["get", "patch", "update"]})
        return dumps({"kind": "APIResourceList", "apiVersion": "v1",
                      "groupVersion": f"{group}/{version}" if group else version, "resources": resources})

    # -- watch -----------------------------------------------------------------------------
    def _client_gone(self) -> bool:
        """Whether the client closed its end (readable with EOF); never blocks."""
        try:
            readable, _, _ = select.select([self.connection], [], [], 0)
            return bool(readable) and self.connection.recv(1, socket.MSG_PEEK) == b""
        except OSError:
            return True

    def _chunk(self, data: bytes) -> None:
        self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))

    def _watch(self, rt: ResourceType, namespace: str | None, query: dict) -> None:
        fake = self.fake
        bookmarks = query.get("allowWatchBookmarks", "").lower() in _TRUE
        timeout = float(query["timeoutSeconds"]) if query.get("timeoutSeconds") else fake.default_watch_timeout
        form = negotiation.requested_form(self.headers.get("Accept"))
        negotiation.check_fits(form, is_list=False)  # each event carries one object
        try:
            sub = fake.store.subscribe(rt, namespace, label_selector=query.get("labelSelector"),
                                       field_selector=query.get("fieldSelector"),
                                       resource_version=query.get("resourceVersion"))
            gone = None
        except ApiError as exc:
            if exc.code != 410:
                raise
            sub, gone = None, exc
        self.wfile.write(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
                         b"Transfer-Encoding: chunked\r\n\r\n")
        if gone is not None:
            self._chunk(dumps({"type": "ERROR", "object": gone.status()}) + b"\n")
            self.wfile.write(b"0\r\n\r\n")
            return
        stream = _WatchStream(rt.plural)
        if tables.wants_table(self.headers.get("Accept", "")):  # kubectl get -w: one-row Tables
            stream.columns = tables.columns_for(rt.group, rt.plural, fake.crds.get((rt.group, rt.version, rt.plural)))
            stream.include = query.get("includeObject") or "Metadata"
        stream.partial = form == negotiation.PARTIAL
        with fake._lock:
            fake._watches.add(stream)
        release = fake._release
        try:
            self._stream(sub, stream, rt, bookmarks, timeout, release)
        except (BrokenPipeError, ConnectionResetError, socket.timeout, OSError):
            self.close_connection = True
        finally:
            with fake._lock:
                fake._watches.discard(stream)

    def _stream(self, sub, stream: _WatchStream, rt: ResourceType, bookmarks: bool, timeout: float,
                release: threading.Event) -> None:
        fake = self.fake
        now = time.monotonic()
        deadline = now + timeout
        next_bookmark = now + fake.bookmark_interval
        while True:
            if stream.hung.is_set():
                # Say nothing, keep the socket open, until released, the client goes away or
                # the server closes.
                while not release.wait(0.5) and not self._client_gone():
                    pass
                self.close_connection = True
                return
            now = time.monotonic()
            if now >= deadline:
                self.wfile.write(b"0\r\n\r\n")
                return
            wait = deadline - now
            if bookmarks:
                wait = min(wait, max(0.0, next_bookmark - now))
            try:
                events = sub.next(min(wait, 0.5))
            except ApiError as exc:  # history compacted under a slow watcher
                self._chunk(dumps({"type": "ERROR", "object": exc.status()}) + b"\n")
                self.wfile.write(b"0\r\n\r\n")
                return
            except Closed:
                self.close_connection = True
                return
            if stream.hung.is_set():
                continue
            if not events and self._client_gone():
                self.close_connection = True
                return
            if stream.columns is not None:
                out = [b'{"type":"%s","object":%s}\n' % (ev.type.encode(), dumps(tables.table(
                    stream.columns, [ev.obj], {"resourceVersion": str(ev.rv)}, stream.include))) for ev in events]
            elif stream.partial:
                out = [b'{"type":"%s","object":%s}\n' % (ev.type.encode(), dumps(negotiation.partial(ev.obj)))
                       for ev in events]
            else:
                out = [b'{"type":"%s","object":%s}\n' % (ev.type.encode(), ev.raw) for ev in events]
            if bookmarks and time.monotonic() >= next_bookmark:
                out.append(dumps({"type": "BOOKMARK", "object": {
                    "kind": rt.kind, "apiVersion": rt.api_version,
                    "metadata": {"resourceVersion": str(sub.rv)}}}) + b"\n")
                next_bookmark = time.monotonic() + fake.bookmark_interval
            if out:
                self._chunk(b"".join(out))
