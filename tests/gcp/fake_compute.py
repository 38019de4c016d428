"""A local fake of the Compute Engine REST API (v1), for the real google-cloud-compute client.

Serves, on ``127.0.0.1:<free port>``, what the gcp provider uses:

* ``instances``: insert (POST), get, delete, aggregatedList (``filter`` on labels,
  ``maxResults``/``pageToken`` paging with a small server page size), setLabels (with the
  ``labelFingerprint`` check real GCE makes: 412 ``conditionNotMet`` on a stale one), and the
  life-cycle calls stop, suspend, start and resume with GCE's states
  (https://cloud.google.com/compute/docs/instances/instance-life-cycle): stop goes
  STOPPING -> TERMINATED (GCE's word for *stopped*), suspend SUSPENDING -> SUSPENDED, start
  (from TERMINATED) and resume (from SUSPENDED) STAGING -> RUNNING; stopping and suspending
  release the ephemeral external IP, starting assigns a new one; a call in a state that does
  not accept it answers 400 ``resourceNotReady``;
* ``zoneOperations`` and ``globalOperations``: get and wait;
* ``firewalls``: get, insert, patch;
* ``scheduling`` of an insert is kept as sent (a spot VM, ``provisioningModel: SPOT``, must also
  say ``automaticRestart: false``, ``onHostMaintenance: TERMINATE`` and a termination action, as
  GCE requires); :meth:`FakeCompute.preempt` preempts one as GCE does (``TERMINATED``, then
  deleted by :meth:`FakeCompute.finish_preemptions` when its action is DELETE);
* ``POST /token``: an OAuth token endpoint for service-account key files (returns a bearer
  token and records the JWT assertion it was given).

Mutations return an operation that is RUNNING; each get/wait of it advances it by one poll
and after ``op_polls`` polls it is DONE and its effect applies (the instance becomes RUNNING
with addresses, or disappears).  Instances get loopback addresses only, from blocks claimed for
this process (:func:`devcluster.loopback.block`: natIP in :attr:`FakeCompute.external_addresses`,
networkIP in :attr:`FakeCompute.internal_addresses`; nothing listens there, and no other test
run or xdist worker uses them): data never leaves this machine, even when a test connects to them.

Faults are injectable:

* :meth:`FakeCompute.fail`: the next matching HTTP call(s) answer an error status with a
  reason (403 QUOTA_EXCEEDED, 429, 404, 500, 400 ...) or are delayed (timeouts);
* :meth:`FakeCompute.fail_operation`: the next operation of a kind finishes with an error
  (``httpErrorStatusCode`` plus ``error.errors[].code``) instead of applying its effect;
* :attr:`FakeCompute.read_lag`: reads that lag behind an insert (eventual consistency): for
  that many seconds after its insert an instance's ``instances.get`` answers 404, as if it did
  not exist yet (it exists: a second insert answers 409, its operations run).

Every request is recorded in :attr:`FakeCompute.requests` (method, path, query, headers,
JSON body) so tests can assert what the client sent and that operation polls hit the fake.
"""

from __future__ import annotations

import base64
import hashlib
import itertools
import json
import re
import socket
import threading
import time
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Callable
from urllib.parse import parse_qs, urlsplit

from devcluster import loopback

PREFIX = "/compute/v1"
_LABEL_FILTER = re.compile(r'^\s*labels\.([a-z][-_a-z0-9]*)\s*(=|eq)\s*"?([-_a-z0-9]*)"?\s*$')
_NAME = re.compile(r"^[a-z]([-a-z0-9]{0,61}[a-z0-9])?$")


def label_fingerprint(labels: dict[str, str] | None) -> str:
    """Return the ``labelFingerprint`` of a label set (base64 of 8 bytes of a hash, like GCE's)."""
    digest = hashlib.sha256(json.dumps(labels or {}, sort_keys=True).encode()).digest()[:8]
    return base64.b64encode(digest).decode()


@dataclass
class Recorded:
    """One request the fake received (header names lower-cased)."""

    method: str
    path: str
    query: dict[str, list[str]]
    headers: dict[str, str]
    body: Any
    at: float = field(default_factory=time.monotonic)


@dataclass
class Fault:
    """An injected HTTP failure (see :meth:`FakeCompute.fail`)."""

    method: str
    pattern: re.Pattern[str]
    status: int
    reason: str | None
    message: str
    times: int
    delay: float = 0.0


@dataclass
class OpFault:
    """An injected operation failure (see :meth:`FakeCompute.fail_operation`)."""

    kind: str
    status: int
    code: str
    message: str
    times: int
    undo: bool = True


@dataclass
class Operation:
    """A pending or finished operation."""

    body: dict[str, Any]
    polls_left: int
    effect: Callable[[], None] | None
    failure: OpFault | None = None
    polls: int = 0


@dataclass
class FakeCompute:
    """The fake server; use as a context manager or call :meth:`start`/:meth:`stop`.

    Attributes:
        page_size: most items one aggregatedList page returns (whatever ``maxResults`` asks).
        op_polls: polls (get or wait) before an operation is DONE.
        unreachable_zones: zones the aggregated list reports unreachable (their instances
            are left out).
        requests: every request received, in order.
        external_addresses / internal_addresses: the loopback blocks natIP / networkIP come
            from (``address in fake.external_addresses``).
        read_lag: seconds after its insert during which ``GET`` of an instance answers 404
            (``lagged_reads`` counts them); 0: reads see an insert at once.
    """

    page_size: int = 2
    op_polls: int = 1
    read_lag: float = 0.0
    unreachable_zones: set[str] = field(default_factory=set)
    requests: list[Recorded] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.instances: dict[tuple[str, str, str], dict[str, Any]] = {}
        self.inserted_at: dict[tuple[str, str, str], float] = {}  # monotonic time of each insert
        self.lagged_reads = 0
        self.firewalls: dict[tuple[str, str], dict[str, Any]] = {}
        self.operations: dict[str, Operation] = {}
        self.faults: list[Fault] = []
        self.op_faults: list[OpFault] = []
        self._preempted: list[tuple[str, str, str]] = []
        self.tokens_issued: list[str] = []
        self.assertions: list[str] = []
        self._ids = itertools.count(1000)
        self._addr = itertools.count(2)
        self.external_addresses = loopback.block("gcp-external")
        self.internal_addresses = loopback.block("gcp-internal")
        self._lock = threading.RLock()
        self._server: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None

    # -- lifecycle ---------------------------------------------------------------------
    @property
    def url(self) -> str:
        """``http://127.0.0.1:<port>``: the apiEndpoint to configure."""
        assert self._server is not None, "fake not started"
        host, port = self._server.server_address[:2]
        return f"http://{host}:{port}"

    def start(self) -> "FakeCompute":
        """Bind 127.0.0.1 on a free port and serve in a daemon thread."""
        fake = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def setup(self) -> None:
                super().setup()
                # Headers and body are separate writes: without TCP_NODELAY every response
                # waits ~40 ms for the client's delayed ACK.
                self.connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

            def log_message(self, *args: Any) -> None:  # keep test output quiet
                pass

            def _handle(self) -> None:
                fake._dispatch(self)

            do_GET = do_POST = do_DELETE = do_PATCH = _handle

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self._server.block_on_close = False
        self._thread = threading.Thread(target=self._server.serve_forever, kwargs={"poll_interval": 0.05},
                                        daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop serving and close the socket."""
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None

    def __enter__(self) -> "FakeCompute":
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop()

    # -- fault injection ---------------------------------------------------------------
    def fail(self, method: str, path_regex: str, status: int, reason: str | None = None,
             message: str | None = None, *, times: int = 1, delay: float = 0.0) -> None:
        """Make the next ``times`` requests whose method and path (after ``/compute/v1``)
        match answer ``status`` with ``reason`` (an ErrorInfo reason such as
        ``QUOTA_EXCEEDED``, or a legacy reason such as ``rateLimitExceeded``).

        ``delay`` seconds are slept first (a delay longer than the client's timeout makes a
        timeout; ``status=0`` then means "answer normally after the delay").
        """
        with self._lock:
            self.faults.append(Fault(method.upper(), re.compile(path_regex), status, reason,
                                     message or f"injected {status} {reason or ''}".strip(), times, delay))

    def fail_operation(self, kind: str, status: int, code: str, message: str | None = None,
                       *, times: int = 1, undo: bool = True) -> None:
        """Make the next ``times`` operations of ``kind`` (``insert``, ``delete``, ``setLabels``,
        ``stop``, ``suspend``, ``start``, ``resume``, ``firewall.insert`` ...) finish DONE with
        ``httpErrorStatusCode=status`` and ``error.errors[0].code=code``, without applying their
        effect (for an insert, removing the instance again unless ``undo`` is false; for a
        life-cycle call, restoring the status it had before)."""
        with self._lock:
            self.op_faults.append(OpFault(kind, status, code, message or f"injected {code}", times, undo))

    # -- queries for tests -------------------------------------------------------------
    def calls(self, method: str | None = None, path_regex: str | None = None) -> list[Recorded]:
        """Return recorded requests matching ``method`` and ``path_regex`` (``re.search`` on the path)."""
        with self._lock:
            return [r for r in self.requests
                    if (method is None or r.method == method.upper())
                    and (path_regex is None or re.search(path_regex, r.path))]

    def preempt(self, project: str, zone: str, name: str) -> None:
        """Preempt the spot VM ``name`` as GCE does: it stops (``TERMINATED``) and, with
        ``instanceTerminationAction: DELETE``, is deleted after the next :meth:`finish_preemptions`.

        Raises:
            ValueError: the instance is not a spot VM (``scheduling.provisioningModel: SPOT``).
        """
        with self._lock:
            inst = self.instances[(project, zone, name)]
            if (inst.get("scheduling") or {}).get("provisioningModel") != "SPOT":
                raise ValueError(f"{name} is not a spot VM: GCE preempts only those")
            inst["status"] = "TERMINATED"
            inst["statusMessage"] = "Instance was preempted."
            for nic in inst.get("networkInterfaces", []):
                for ac in nic.get("accessConfigs", []):
                    ac.pop("natIP", None)
            self._preempted.append((project, zone, name))

    def finish_preemptions(self) -> None:
        """Delete the preempted spot VMs whose termination action is DELETE (GCE does it shortly after)."""
        with self._lock:
            for key in self._preempted:
                inst = self.instances.get(key)
                if inst is not None and (inst.get("scheduling") or {}).get("instanceTerminationAction") == "DELETE":
                    self.instances.pop(key, None)
            self._preempted.clear()

    def add_instance(self, project: str, zone: str, name: str, labels: dict[str, str],
                     status: str = "RUNNING") -> dict[str, Any]:
        """Put an instance straight into the fake (for listing tests)."""
        with self._lock:
            inst = self._new_instance(project, zone, {"name": name, "labels": labels,
                                                      "machineType": f"zones/{zone}/machineTypes/e2-micro"})
            inst["status"] = status
            self._assign_addresses(inst)
            self.instances[(project, zone, name)] = inst
            return inst

    # -- HTTP plumbing -----------------------------------------------------------------
    def _dispatch(self, h: BaseHTTPRequestHandler) -> None:
        parts = urlsplit(h.path)
        length = int(h.headers.get("Content-Length") or 0)
        raw = h.rfile.read(length) if length else b""
        ctype = h.headers.get("Content-Type", "")
        body: Any = None
        if raw:
            if "json" in ctype or raw[:1] in (b"{", b"["):
                try:
                    body = json.loads(raw)
                except ValueError:
                    body = raw.decode("utf-8", "replace")
            else:
                body = {k: v[0] for k, v in parse_qs(raw.decode("utf-8", "replace")).items()}
        rec = Recorded(h.command, parts.path, parse_qs(parts.query),
                       {k.lower(): v for k, v in h.headers.items()}, body)
        with self._lock:
            self.requests.append(rec)
            fault = self._take_fault(h.command, parts.path)
        if fault is not None and fault.delay:
            time.sleep(fault.delay)
        if fault is not None and fault.status:
            status, payload = self._error(fault.status, fault.reason, fault.message)
        else:
            try:
                with self._lock:
                    status, payload = self._route(h.command, parts.path, rec)
            except _HttpError as exc:
                status, payload = self._error(exc.status, exc.reason, exc.message)
        data = json.dumps(payload).encode()
        try:
            h.send_response(status)
            h.send_header("Content-Type", "application/json; charset=UTF-8")
            h.send_header("Content-Length", str(len(data)))
            h.end_headers()
            h.wfile.write(data)
        except (BrokenPipeError, ConnectionResetError):  # the client timed out and left
            pass

    def _take_fault(self, method: str, path: str) -> Fault | None:
        rel = path[len(PREFIX):] if path.startswith(PREFIX) else path
        for fault in self.faults:
            if fault.times > 0 and fault.method == method and fault.pattern.search(rel):
                fault.times -= 1
                return fault
        return None

    @staticmethod
    def _error(status: int, reason: str | None, message: str) -> tuple[int, dict[str, Any]]:
        """Build a Compute API error body (legacy ``errors[]`` plus a ``google.rpc.ErrorInfo``)."""
        legacy = {"QUOTA_EXCEEDED": "quotaExceeded", "RATE_LIMIT_EXCEEDED": "rateLimitExceeded",
                  "NOT_FOUND": "notFound", "ALREADY_EXISTS": "alreadyExists"}
        status_name = {400: "INVALID_ARGUMENT", 403: "PERMISSION_DENIED", 404: "NOT_FOUND",
                       409: "ALREADY_EXISTS", 412: "FAILED_PRECONDITION", 429: "RESOURCE_EXHAUSTED",
                       500: "INTERNAL", 503: "UNAVAILABLE"}.get(status, "UNKNOWN")
        error: dict[str, Any] = {"code": status, "message": message, "status": status_name,
                                 "errors": [{"message": message, "domain": "global",
                                             "reason": legacy.get(reason or "", reason or "backendError")}]}
        if reason and reason.isupper():
            error["details"] = [{"@type": "type.googleapis.com/google.rpc.ErrorInfo", "reason": reason,
                                 "domain": "compute.googleapis.com", "metadata": {}}]
        return status, {"error": error}

    # -- routes ------------------------------------------------------------------------
    def _route(self, method: str, path: str, rec: Recorded) -> tuple[int, Any]:
        if method == "POST" and path == "/token":
            return self._token(rec)
        if not path.startswith(PREFIX + "/projects/"):
            raise _HttpError(404, "NOT_FOUND", f"no route {method} {path}")
        seg = path[len(PREFIX) + 1:].split("/")
        project = seg[1]
        rest = seg[2:]
        match (method, rest):
            case ("POST", ["zones", zone, "instances"]):
                return self._insert_instance(project, zone, rec.body)
            case ("GET", ["zones", zone, "instances", name]):
                if time.monotonic() - self.inserted_at.get((project, zone, name), float("-inf")) < self.read_lag:
                    self.lagged_reads += 1
                    raise _HttpError(404, "NOT_FOUND",
                                     f"The resource 'projects/{project}/zones/{zone}/instances/{name}' was not found")
                return 200, self._instance(project, zone, name)
            case ("DELETE", ["zones", zone, "instances", name]):
                return self._delete_instance(project, zone, name)
            case ("POST", ["zones", zone, "instances", name, "setLabels"]):
                return self._set_labels(project, zone, name, rec.body)
            case ("POST", ["zones", zone, "instances", name, ("stop" | "suspend" | "start" | "resume") as verb]):
                return self._life_cycle(project, zone, name, verb)
            case ("GET", ["aggregated", "instances"]):
                return 200, self._aggregated(project, rec.query)
            case ("GET", ["zones", zone, "operations", name]) | ("POST", ["zones", zone, "operations", name, "wait"]):
                return 200, self._poll(name)
            case ("GET", ["global", "operations", name]) | ("POST", ["global", "operations", name, "wait"]):
                return 200, self._poll(name)
            case ("GET", ["global", "firewalls", name]):
                fw = self.firewalls.get((project, name))
                if fw is None:
                    raise _HttpError(404, "NOT_FOUND", f"The resource 'projects/{project}/global/firewalls/{name}' was not found")
                return 200, fw
            case ("POST", ["global", "firewalls"]):
                return self._insert_firewall(project, rec.body)
            case ("PATCH", ["global", "firewalls", name]):
                return self._patch_firewall(project, name, rec.body)
        raise _HttpError(404, "NOT_FOUND", f"no route {method} {path}")

    def _token(self, rec: Recorded) -> tuple[int, Any]:
        body = rec.body if isinstance(rec.body, dict) else {}
        assertion = body.get("assertion")
        if not assertion:
            raise _HttpError(400, "invalid_request", "missing assertion")
        self.assertions.append(assertion)
        token = "ya29.fake-" + base64.urlsafe_b64encode(str(next(self._ids)).encode()).decode().rstrip("=")
        self.tokens_issued.append(token)
        return 200, {"access_token": token, "token_type": "Bearer", "expires_in": 3600}

    def _self_link(self, path: str) -> str:
        return f"{self.url}{PREFIX}/{path}"

    def _new_instance(self, project: str, zone: str, body: dict[str, Any]) -> dict[str, Any]:
        name = body.get("name", "")
        inst = json.loads(json.dumps(body))
        inst.update({
            "kind": "compute#instance", "id": str(next(self._ids)), "status": "PROVISIONING",
            "zone": self._self_link(f"projects/{project}/zones/{zone}"),
            "selfLink": self._self_link(f"projects/{project}/zones/{zone}/instances/{name}"),
            # GCE answers in US Pacific time with an offset, e.g. 2024-05-01T03:04:05.678-07:00.
            "creationTimestamp": datetime.now(timezone(timedelta(hours=-7))).isoformat(timespec="milliseconds"),
        })
        inst["labelFingerprint"] = label_fingerprint(inst.get("labels"))
        inst.setdefault("networkInterfaces", [{"network": f"projects/{project}/global/networks/default"}])
        return inst

    def _assign_addresses(self, inst: dict[str, Any]) -> None:
        n = next(self._addr) % 250 + 2
        for nic in inst.get("networkInterfaces", []):
            nic["networkIP"] = self.internal_addresses.host(n)
            for ac in nic.get("accessConfigs", []):
                ac["natIP"] = self.external_addresses.host(n)

    def _instance(self, project: str, zone: str, name: str) -> dict[str, Any]:
        inst = self.instances.get((project, zone, name))
        if inst is None:
            raise _HttpError(404, "NOT_FOUND",
                             f"The resource 'projects/{project}/zones/{zone}/instances/{name}' was not found")
        return inst

    def _insert_instance(self, project: str, zone: str, body: Any) -> tuple[int, Any]:
        if not isinstance(body, dict):
            raise _HttpError(400, "INVALID", "Invalid JSON payload")
        name = body.get("name", "")
        if not _NAME.match(name):
            raise _HttpError(400, "INVALID", f"Invalid value for field 'resource.name': '{name}'")
        if not str(body.get("machineType", "")).startswith(f"zones/{zone}/machineTypes/"):
            raise _HttpError(400, "INVALID", "Invalid value for field 'resource.machineType'")
        if not body.get("disks"):
            raise _HttpError(400, "INVALID", "At least one disk is required")
        for key, value in (body.get("labels") or {}).items():
            if not re.match(r"^[a-z][-_a-z0-9]{0,62}$", key) or not re.match(r"^[-_a-z0-9]{0,63}$", value):
                raise _HttpError(400, "INVALID", f"Invalid value for field 'resource.labels': '{key}'")
        scheduling = body.get("scheduling") or {}
        if scheduling.get("provisioningModel") == "SPOT" and (
                scheduling.get("automaticRestart") is not False or scheduling.get("onHostMaintenance") != "TERMINATE"
                or scheduling.get("instanceTerminationAction") not in ("STOP", "DELETE")):
            # GCE's rule for spot VMs: no automatic restart, terminate on host maintenance, and a
            # termination action.
            raise _HttpError(400, "INVALID", "Invalid value for field 'resource.scheduling': spot VMs need "
                                             "automaticRestart false, onHostMaintenance TERMINATE and an "
                                             "instanceTerminationAction")
        if (project, zone, name) in self.instances:
            raise _HttpError(409, "ALREADY_EXISTS",
                             f"The resource 'projects/{project}/zones/{zone}/instances/{name}' already exists")
        inst = self._new_instance(project, zone, body)
        self.instances[(project, zone, name)] = inst
        self.inserted_at[(project, zone, name)] = time.monotonic()

        def effect() -> None:
            inst["status"] = "RUNNING"
            self._assign_addresses(inst)

        return 200, self._operation("insert", project, zone, inst["selfLink"], effect,
                                    undo=lambda: self.instances.pop((project, zone, name), None))

    def _set_labels(self, project: str, zone: str, name: str, body: Any) -> tuple[int, Any]:
        inst = self._instance(project, zone, name)
        body = body if isinstance(body, dict) else {}
        labels = body.get("labels") or {}
        for key, value in labels.items():
            if not re.match(r"^[a-z][-_a-z0-9]{0,62}$", key) or not re.match(r"^[-_a-z0-9]{0,63}$", value):
                raise _HttpError(400, "INVALID", f"Invalid value for field 'labels': '{key}'")
        if not body.get("labelFingerprint"):
            raise _HttpError(400, "INVALID", "Required field 'labelFingerprint' not specified")
        if body["labelFingerprint"] != inst.get("labelFingerprint"):
            raise _HttpError(412, "conditionNotMet",
                             "Labels fingerprint either invalid or resource labels have changed")

        def effect() -> None:
            inst["labels"] = dict(labels)
            inst["labelFingerprint"] = label_fingerprint(labels)

        return 200, self._operation("setLabels", project, zone, inst["selfLink"], effect)

    #: verb -> (statuses that accept it, status while the operation runs, status after it,
    #: whether the external IP is released).
    _LIFE_CYCLE = {
        "stop": ({"RUNNING", "STAGING", "PROVISIONING", "SUSPENDED", "TERMINATED"}, "STOPPING", "TERMINATED", True),
        "suspend": ({"RUNNING"}, "SUSPENDING", "SUSPENDED", True),
        "start": ({"TERMINATED", "STOPPED", "RUNNING", "STAGING", "PROVISIONING"}, "STAGING", "RUNNING", False),
        "resume": ({"SUSPENDED"}, "STAGING", "RUNNING", False),
    }

    def _life_cycle(self, project: str, zone: str, name: str, verb: str) -> tuple[int, Any]:
        inst = self._instance(project, zone, name)
        accepted, during, after, release_ip = self._LIFE_CYCLE[verb]
        status = inst.get("status")
        if status not in accepted:
            raise _HttpError(400, "resourceNotReady",
                             f"The resource 'projects/{project}/zones/{zone}/instances/{name}' is not ready "
                             f"(status {status}; {verb} is not possible)")
        if (verb == "start" and status in ("RUNNING", "STAGING", "PROVISIONING")) or \
                (verb == "stop" and status == "TERMINATED"):
            return 200, self._operation(verb, project, zone, inst["selfLink"], lambda: None)  # a no-op, like GCE
        inst["status"] = during

        def effect() -> None:
            inst["status"] = after
            for nic in inst.get("networkInterfaces", []):
                for ac in nic.get("accessConfigs", []):
                    if release_ip:
                        ac.pop("natIP", None)
                    elif not ac.get("natIP"):
                        ac["natIP"] = self.external_addresses.host(next(self._addr) % 250 + 2)

        # A failed operation (fail_operation) leaves the instance as it found it.
        return 200, self._operation(verb, project, zone, inst["selfLink"], effect,
                                    undo=lambda: inst.__setitem__("status", status))

    def _delete_instance(self, project: str, zone: str, name: str) -> tuple[int, Any]:
        inst = self._instance(project, zone, name)
        inst["status"] = "STOPPING"
        return 200, self._operation("delete", project, zone, inst["selfLink"],
                                    lambda: self.instances.pop((project, zone, name), None))

    def _insert_firewall(self, project: str, body: Any) -> tuple[int, Any]:
        name = body.get("name", "") if isinstance(body, dict) else ""
        if not _NAME.match(name):
            raise _HttpError(400, "INVALID", f"Invalid value for field 'resource.name': '{name}'")
        if (project, name) in self.firewalls:
            raise _HttpError(409, "ALREADY_EXISTS", f"The resource 'projects/{project}/global/firewalls/{name}' already exists")
        fw = dict(body, kind="compute#firewall", selfLink=self._self_link(f"projects/{project}/global/firewalls/{name}"))
        return 200, self._operation("firewall.insert", project, None, fw["selfLink"],
                                    lambda: self.firewalls.__setitem__((project, name), fw))

    def _patch_firewall(self, project: str, name: str, body: Any) -> tuple[int, Any]:
        fw = self.firewalls.get((project, name))
        if fw is None:
            raise _HttpError(404, "NOT_FOUND", f"The resource 'projects/{project}/global/firewalls/{name}' was not found")
        return 200, self._operation("firewall.patch", project, None, fw["selfLink"], lambda: fw.update(body))

    def _operation(self, kind: str, project: str, zone: str | None, target: str,
                   effect: Callable[[], None], undo: Callable[[], Any] | None = None) -> dict[str, Any]:
        name = f"operation-{next(self._ids)}-{kind.replace('.', '-')}"
        scope = f"projects/{project}/zones/{zone}" if zone else f"projects/{project}/global"
        body = {"kind": "compute#operation", "id": str(next(self._ids)), "name": name,
                "operationType": kind.split(".")[-1], "status": "RUNNING", "targetLink": target,
                "selfLink": self._self_link(f"{scope}/operations/{name}"), "progress": 0}
        if zone:
            body["zone"] = self._self_link(f"projects/{project}/zones/{zone}")
        failure = None
        for f in self.op_faults:
            if f.kind == kind and f.times > 0:
                f.times -= 1
                failure = f
                break
        if failure is not None:
            # A failed operation has no effect; a failed insert leaves nothing behind.
            effect = undo if (undo is not None and failure.undo) else None
        self.operations[name] = Operation(body, self.op_polls, effect, failure)
        return body

    def _poll(self, name: str) -> dict[str, Any]:
        op = self.operations.get(name)
        if op is None:
            raise _HttpError(404, "NOT_FOUND", f"The resource 'operation {name}' was not found")
        op.polls += 1
        if op.body["status"] != "DONE":
            op.polls_left -= 1
            if op.polls_left <= 0:
                op.body.update(status="DONE", progress=100)
                if op.effect:
                    op.effect()
                if op.failure is not None:
                    op.body["httpErrorStatusCode"] = op.failure.status
                    op.body["httpErrorMessage"] = {403: "FORBIDDEN", 400: "BAD REQUEST", 404: "NOT FOUND",
                                                   409: "CONFLICT", 500: "INTERNAL SERVER ERROR",
                                                   503: "SERVICE UNAVAILABLE"}.get(op.failure.status, "ERROR")
                    op.body["error"] = {"errors": [{"code": op.failure.code, "message": op.failure.message}]}
        return op.body

    def _aggregated(self, project: str, query: dict[str, list[str]]) -> dict[str, Any]:
        flt = (query.get("filter") or [""])[0]
        selected = []
        m = _LABEL_FILTER.match(flt) if flt else None
        if flt and not m:
            raise _HttpError(400, "INVALID", f"Invalid value for field 'filter': '{flt}'")
        for (p, zone, _name), inst in sorted(self.instances.items()):
            if p != project or zone in self.unreachable_zones:
                continue
            if m and (inst.get("labels") or {}).get(m.group(1)) != m.group(3):
                continue
            selected.append((zone, inst))
        max_results = int((query.get("maxResults") or ["500"])[0])
        size = max(1, min(max_results, self.page_size))
        token = (query.get("pageToken") or [""])[0]
        start = int(base64.urlsafe_b64decode(token.encode()).decode()) if token else 0
        page = selected[start:start + size]
        items: dict[str, Any] = {}
        for zone, inst in page:
            items.setdefault(f"zones/{zone}", {"instances": []})["instances"].append(inst)
        body: dict[str, Any] = {"kind": "compute#instanceAggregatedList", "id": f"projects/{project}/aggregated/instances",
                                "items": items}
        if start + size < len(selected):
            body["nextPageToken"] = base64.urlsafe_b64encode(str(start + size).encode()).decode()
        if self.unreachable_zones and start == 0:
            body["unreachables"] = [f"zones/{z}" for z in sorted(self.unreachable_zones)]
            for z in sorted(self.unreachable_zones):
                items[f"zones/{z}"] = {"warning": {"code": "UNREACHABLE", "message": f"zone {z} unreachable"}}
        return body


class _HttpError(Exception):
    def __init__(self, status: int, reason: str | None, message: str) -> None:
        super().__init__(message)
        self.status, self.reason, self.message = status, reason, message
