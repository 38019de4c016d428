"""``proxy-operator demo`` (``make demo``): the whole operator on this machine, without Docker, on a
SIMULATED cluster.

Starts, all on loopback: a private Redis (with a generated password), the dev cluster's HTTP
fake of the Kubernetes API (:mod:`devcluster.apiserver`; Proxies admitted through the real CRD) with
its kubelet stand-in, which runs every Squid Pod as a real Squid on an address of its own
(``--pod-cidr``, default a free ``127.A.B.0/24`` claimed for the demo's lifetime, so two demos
or a demo and the test suite never share one), a local origin (health URL ``/generate_204``, IP
echo ``/ip``, a page at ``/``), and the operator's real processes: watcher, Celery worker, beat,
the discovery API and Flower (basic auth with a generated password).  The cluster is a
simulation: nothing but Squid runs as a "Pod", there are no nodes, no scheduler, no network
policy; it is for trying the operator out and for the test suite, not for running proxies.

The providers config and environment it writes say exactly what the local proxies may reach:
Squid's ``allowedDestinations`` and ``httpPorts`` name the local origin's address and port,
``PROBE_ALLOWED_RANGES`` the origin and the Pod range, ``HEALTH_DEFAULT_URL`` and
``EGRESS_ECHO_URL`` point probes at the origin (the sample Proxy's default health URL is on
the internet), so a Proxy goes Ready offline.

It prints the ``KUBECONFIG`` to export, the API token and the URLs as shell lines to paste
(the same steps as README's), then runs until SIGINT (Ctrl-C) or SIGTERM and stops everything
it started.  Run it as ``proxy-operator demo`` (``make demo``); ``--help``
lists the ports.  At start it warns (and carries on: the stack itself needs no kubectl) when
``kubectl`` is missing or older than :data:`KUBECTL_MINIMUM`.
"""

from __future__ import annotations

import argparse
import http.server
import ipaddress
import json
import os
import re
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import requests
import yaml

from devcluster import loopback
from devcluster.apiserver.server import FakeKube
from devcluster.cluster import pool_admission, proxy_admission
from devcluster.kubelet import Kubelet
from devcluster.processes import BIN, Process, celery_beat, celery_worker
from devcluster.redis_server import RedisServer, free_port

PROVIDER = "k8s-local"
#: The command, as its messages name it.
PROG = "proxy-operator demo"

#: The oldest kubectl tested against the API fake: it validates and explains with OpenAPI v3
#: (kubectl 1.27: KEP-3515, kubernetes/kubernetes#117954).  The fake also serves OpenAPI v2 (JSON
#: and the protobuf kubectl reads for a kind without a v3 schema), but older kubectl is not tested.
KUBECTL_MINIMUM = (1, 27)

#: The steps after the variables, as the banner prints them and README shows them word for word
#: (keep the two in step; the lease lines must run as written, with bash).
STEPS_LINES = (
    "kubectl apply -f deploy/samples/proxy_kubernetes.yaml",
    "kubectl get px -w                 # PHASE PROVIDER ADDRESS EGRESS IP HEALTHY BURNED; Ctrl-C once Ready",
    "kubectl describe px squid-k8s-1   # conditions and Events",
    "LEASE=$(curl -s -X POST -H \"Authorization: Bearer $TOKEN\" -H 'Content-Type: application/json' \\",
    "        -d '{\"ttlSeconds\": 300}' \"$API/v1/leases\"); echo \"$LEASE\"",
    "PROXY=$(printf '%s' \"$LEASE\" | python3 -c 'import json, sys; print(json.load(sys.stdin)[\"proxyUrl\"])')",
    "curl -sS --noproxy '' -x \"$PROXY\" \"$ORIGIN\"   # the local origin, through the leased proxy",
    "ID=$(printf '%s' \"$LEASE\" | python3 -c 'import json, sys; print(json.load(sys.stdin)[\"leaseId\"])')",
    "curl -s -X DELETE -H \"Authorization: Bearer $TOKEN\" \"$API/v1/leases/$ID\"; echo   # release it: \"wasLive\": true",
    "curl -s -X POST -H \"Authorization: Bearer $TOKEN\" -H 'Content-Type: application/json' \\",
    "        -d '{\"target\": \"example.org\", \"ttlSeconds\": 300}' \"$API/v1/leases\"; echo   # a lease for one site",
    "curl -s -H \"Authorization: Bearer $TOKEN\" \"$API/v1/proxies\"; echo   # the proxies your token sees, bans per site",
    "kubectl delete px squid-k8s-1",
    "kubectl apply -f deploy/samples/proxypool_kubernetes.yaml   # a ProxyPool: 3 Proxies made from a template",
    "kubectl get pxp                   # DESIRED READY LEASABLE UPDATED BURNED RECYCLED AGE; again until LEASABLE is 3",
    "kubectl scale pxp/squid-k8s-pool --replicas=5",
    "kubectl get px -l crawl.example.com/pool=squid-k8s-pool   # the pool's Proxies, owned by it",
    "curl -s -X POST -H \"Authorization: Bearer $TOKEN\" -H 'Content-Type: application/json' \\",
    "        -d '{\"pool\": \"squid-k8s-pool\", \"ttlSeconds\": 300}' \"$API/v1/leases\"; echo   # from the pool",
    "kubectl delete pxp squid-k8s-pool # its Proxies go with it, ending their leases",
)


def kubectl_warning(path: str | None = None) -> str | None:
    """Return a warning when ``kubectl`` (looked up on ``path``, default ``$PATH``) is missing,
    of unknown version or older than :data:`KUBECTL_MINIMUM`; ``None`` when it will do."""
    minimum = "%d.%d" % KUBECTL_MINIMUM
    get = "get one from https://kubernetes.io/docs/tasks/tools/ (the demo itself runs without it)"
    binary = shutil.which("kubectl", path=path)
    if binary is None:
        return f"kubectl is not on PATH: the steps below need kubectl {minimum} or newer; {get}"
    try:
        res = subprocess.run([binary, "version", "--client", "-o", "json"], capture_output=True, text=True,
                             timeout=20)
        client = json.loads(res.stdout)["clientVersion"]
    except (OSError, subprocess.TimeoutExpired, ValueError, KeyError, TypeError):
        return (f"could not tell the version of {binary} (`kubectl version --client -o json`); "
                f"the steps below need kubectl {minimum} or newer")
    found = client.get("gitVersion") or f"v{client.get('major')}.{client.get('minor')}"
    m = re.match(r"v?(\d+)\.(\d+)", found) or re.match(
        r"(\d+)\D*\.(\d+)", f"{client.get('major')}.{client.get('minor')}")
    if m is None:
        return f"could not tell the version of {binary} ({found!r}); the steps below need kubectl {minimum} or newer"
    if (int(m.group(1)), int(m.group(2))) < KUBECTL_MINIMUM:
        return (f"{binary} is kubectl {found}; the simulated API server needs kubectl {minimum} or newer "
                f"(older kubectl validates and explains without OpenAPI v3, untested against it); {get}")
    return None


class _OriginHandler(http.server.BaseHTTPRequestHandler):
    def do_GET(self):  # http.server API
        if self.path.split("?")[0].endswith("/generate_204"):
            self.send_response(204)
            self.end_headers()
            return
        if self.path.split("?")[0] == "/ip":
            body = (self.client_address[0] + "\n").encode()
        else:
            body = b"<html><body><h1>Hello from the proxy-operator demo origin</h1></body></html>\n"
        self.send_response(200)
        self.send_header("Content-Type", "text/plain" if self.path == "/ip" else "text/html")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


class LocalOrigin:
    """A loopback origin: ``/generate_204`` (204), ``/ip`` (the caller's address), ``/`` (a page)."""

    def __init__(self, host: str = "127.0.0.1", port: int = 0) -> None:
        self.server = http.server.ThreadingHTTPServer((host, port), _OriginHandler)
        self.server.daemon_threads = True
        self.host, self.port = host, self.server.server_port
        threading.Thread(target=self.server.serve_forever, daemon=True, name="origin").start()

    def url(self, path: str = "/") -> str:
        """``http://host:port<path>``."""
        return f"http://{self.host}:{self.port}{path}"

    def close(self) -> None:
        """Stop serving."""
        self.server.shutdown()
        self.server.server_close()


class Demo:
    """The local stack (see the module docstring); :meth:`start`, then :meth:`stop`.

    Args:
        api_port / flower_port / kube_port: loopback ports (0: a free one).
        pod_cidr: the loopback range the kubelet stand-in gives Squid Pods (``None``: a free
            ``/24`` claimed with :func:`devcluster.loopback.claim_block`, held until exit).
        workdir: where the kubeconfig, configs and logs go (default: a new temp directory,
            removed by :meth:`stop` unless ``keep`` is set).
        extra_env: more environment for the operator's processes, over the demo's own
            (``bench/chaos.py`` shortens holder and resync periods this way).

    Attributes:
        env: the operator processes' environment once :meth:`start` wrote the configs (to start
            more processes of the same stack).
    """

    def __init__(self, *, api_port: int = 8080, flower_port: int = 5555, kube_port: int = 0,
                 pod_cidr: str | None = None, workdir: str | None = None, keep: bool = False,
                 extra_env: dict[str, str] | None = None) -> None:
        self.api_port = api_port or free_port()
        self.flower_port = flower_port or free_port()
        self.kube_port = kube_port
        self._pod_block = None if pod_cidr else loopback.claim_block()
        self.pod_cidr = ipaddress.ip_network(pod_cidr or self._pod_block.cidr)
        if not self.pod_cidr.is_loopback:
            raise ValueError(f"--pod-cidr {pod_cidr}: must be a loopback range (127.0.0.0/8)")
        self.workdir = Path(workdir or tempfile.mkdtemp(prefix="proxy-operator-demo-"))
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.keep = keep or workdir is not None
        self.token = "demo-" + secrets.token_urlsafe(18)
        self.flower_password = secrets.token_urlsafe(12)
        self.processes: list[Process] = []
        self.extra_env = dict(extra_env or {})
        self.env: dict[str, str] = {}
        self.redis = self.origin = self.fake = self.kubelet = None

    # -- start -------------------------------------------------------------------------------
    def start(self) -> "Demo":
        """Start every part and wait until the worker, the API and Flower answer."""
        for port, what in ((self.api_port, "the API port"), (self.flower_port, "the Flower port")):
            if port != free_port_probe(port):
                raise RuntimeError(f"{what} {port}: something already listens on 127.0.0.1:{port}")
        self.redis = RedisServer(password=secrets.token_hex(16))
        self.origin = LocalOrigin()
        self.fake = FakeKube(port=self.kube_port, bookmark_interval=1.0).start()
        self.fake.set_admission("proxies", proxy_admission())
        self.fake.set_admission("proxypools", pool_admission())
        first = next(self.pod_cidr.hosts())
        self.kubelet = Kubelet(self.fake, first_address=str(first)).start()
        self.kubeconfig = self.fake.write_kubeconfig(str(self.workdir / "kubeconfig"))
        env = self.env = {**self._env(), **self.extra_env}
        logs = str(self.workdir / "logs")
        os.makedirs(logs, exist_ok=True)
        bin_ = str(BIN)
        self.processes = [
            celery_worker(env),
            celery_beat(env, str(self.workdir)),
            Process("watcher", [f"{bin_}/proxy-operator", "watch", "--lease-namespace", "proxy-operator",
                                "--identity", "demo-watcher"], env, logs),
            Process("api", [f"{bin_}/proxy-operator", "api", "--bind", f"127.0.0.1:{self.api_port}",
                            "--workers", "1"], env, logs),
            Process("flower", [f"{bin_}/celery", "-A", "workers", "flower", "--address=127.0.0.1",
                               f"--port={self.flower_port}"], env, logs),
        ]
        for p in self.processes:
            p.logdir, p.log_path = logs, Path(logs) / f"{p.name}.log"
            p.start()
        self.processes[0].wait_for_log("ready", timeout=90)
        self._wait_http(f"{self.api_url}/healthz", "the API")
        self._wait_http(f"{self.flower_url}/healthcheck", "Flower")
        return self

    def _env(self) -> dict[str, str]:
        providers = self.workdir / "providers.yaml"
        providers.write_text(yaml.safe_dump({"providers": [{
            "name": PROVIDER, "type": "kubernetes", "checkInterval": "10s",
            # exactly the local origin: its address, and its port for plain HTTP
            "squid": {"allowedDestinations": [f"{self.origin.host}/32"],
                      "httpPorts": [80, 443, self.origin.port]}}]}, sort_keys=False))
        tokens = self.workdir / "tokens.yaml"
        tokens.write_text(yaml.safe_dump({"sharedNamespaces": ["*"], "clients": [{"name": "demo", "token": self.token}]}))
        os.chmod(tokens, 0o600)
        return {
            "KUBECONFIG": self.kubeconfig, "REDIS_URL": self.redis.url, "REDIS_PASSWORD": self.redis.password,
            "PROVIDERS_CONFIG": str(providers), "API_TOKENS_FILE": str(tokens),
            "FLOWER_BASIC_AUTH": f"operator:{self.flower_password}",
            # probes may reach the Pods (the Squids) and the origin, nothing else on loopback
            "PROBE_ALLOWED_RANGES": f"{self.origin.host}/32,{self.pod_cidr}",
            "HEALTH_DEFAULT_URL": self.origin.url("/generate_204"), "EGRESS_ECHO_URL": self.origin.url("/ip"),
            "HEALTH_SWEEP_INTERVAL": "2", "RESYNC_INTERVAL": "30", "POLL_INITIAL": "0.5", "POLL_MAX": "2",
        }

    def _wait_http(self, url: str, what: str, timeout: float = 60.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                if requests.get(url, timeout=2).status_code < 500:
                    return
            except requests.RequestException:
                pass
            time.sleep(0.3)
        raise RuntimeError(f"{what} did not answer on {url} within {timeout:g}s; logs in {self.workdir / 'logs'}")

    # -- facts -------------------------------------------------------------------------------
    @property
    def api_url(self) -> str:
        """The discovery API."""
        return f"http://127.0.0.1:{self.api_port}"

    @property
    def flower_url(self) -> str:
        """Flower."""
        return f"http://127.0.0.1:{self.flower_port}"

    def info(self) -> dict:
        """What :func:`main` prints, as data (also written to ``<workdir>/demo.json``)."""
        return {"kubeconfig": self.kubeconfig, "kubeApiserver": self.fake.url, "api": self.api_url,
                "token": self.token, "flower": self.flower_url, "flowerUser": "operator",
                "flowerPassword": self.flower_password, "origin": self.origin.url("/"),
                "healthURL": self.origin.url("/generate_204"), "echoURL": self.origin.url("/ip"),
                "podCIDR": str(self.pod_cidr), "logs": str(self.workdir / "logs"), "provider": PROVIDER}

    def banner(self) -> str:
        """The text printed once everything is up."""
        i = self.info()
        STEPS = "".join(f"  {line}\n" for line in STEPS_LINES)  # a template part
        return f"""
proxy-operator demo is up: a SIMULATED Kubernetes cluster (devcluster's API fake; each
Squid "Pod" is a real Squid on {i['podCIDR']}), with the real watcher, worker, beat, API and Flower.

In another shell (bash), from this directory:

  export KUBECONFIG={i['kubeconfig']}
  TOKEN={i['token']} API={i['api']} ORIGIN={i['origin']}
{STEPS}
Discovery API  {i['api']}  (token above)
Flower         {i['flower']}  (user operator, password {i['flowerPassword']})
Local origin   {i['origin']}  (health URL {i['healthURL']}, IP echo {i['echoURL']})
Logs           {i['logs']}

Ctrl-C stops everything.
"""

    # -- stop --------------------------------------------------------------------------------
    def stop(self) -> None:
        """Stop every process and server started, in reverse order; remove the workdir unless kept."""
        for p in reversed(self.processes):
            try:
                p.stop(timeout=15)
            except Exception:  # noqa: BLE001 - keep stopping the rest
                p.kill()
        if self.kubelet is not None:
            self.kubelet.close()
        if self.fake is not None:
            self.fake.close()
        if self.origin is not None:
            self.origin.close()
        if self.redis is not None:
            self.redis.stop()
        if self._pod_block is not None:
            self._pod_block.release()
        if not self.keep:
            shutil.rmtree(self.workdir, ignore_errors=True)


def free_port_probe(port: int) -> int | None:
    """``port`` if nothing listens on 127.0.0.1:port, else ``None``."""
    import socket

    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return None
    return port


#: The demo's ports: (what, flag, environment variable or None, default; 0 is a free port).
PORTS = (("API", "--api-port", "DEMO_API_PORT", 8080), ("Flower", "--flower-port", "DEMO_FLOWER_PORT", 5555),
         ("Kubernetes API fake", "--kube-port", None, 0))


def resolve_ports(flags: dict[str, int | None], environ: dict[str, str]) -> dict[str, tuple[int, str]]:
    """Each port of :data:`PORTS` (keyed by its flag) and the setting it came from, as the user wrote it.

    A flag given (``flags[flag]`` not ``None``) wins, then the environment variable (how ``make
    demo`` passes a port), then the default.  The setting reads ``--api-port 9000``,
    ``DEMO_API_PORT=9000``, or ``the API port 8080 (the default; DEMO_API_PORT or --api-port
    changes it)``.

    Raises:
        ValueError: a flag or variable that is not a port number (0-65535), naming it.
    """
    out = {}
    for what, flag, var, default in PORTS:
        raw, setting = flags.get(flag), None
        if raw is not None:
            port, setting = raw, f"{flag} {raw}"
        elif var and (environ.get(var) or "").strip():
            text = environ[var].strip()
            if not (text.isascii() and text.isdigit()):
                raise ValueError(f"{var}={environ[var]!r}: not a port number (0-65535)")
            port, setting = int(text), f"{var}={text}"
        else:
            how = f"{var} or {flag}" if var else flag
            port, setting = default, f"the {what} port {default} (the default; {how} changes it)"
        if not 0 <= port <= 65535:
            raise ValueError(f"{setting}: not a port number (0-65535)")
        out[flag] = (port, setting)
    return out


def port_problems(ports: dict[str, tuple[int, str]]) -> list[str]:
    """What stops the demo from listening on ``ports`` (from :func:`resolve_ports`): a port
    something already listens on, or one port given twice; each names the user's setting.
    Port 0 (a free one) is never a problem."""
    problems, seen = [], {}
    for port, setting in ports.values():
        if not port:
            continue
        if port in seen:
            problems.append(f"{setting}: the same port as {seen[port]}")
        elif free_port_probe(port) is None:
            problems.append(f"{setting}: something already listens on 127.0.0.1:{port}")
        seen.setdefault(port, setting)
    return problems


def main(argv: list[str] | None = None) -> int:
    """``proxy-operator demo [FLAGS]`` (``argv``: the flags; ``None``: ``sys.argv[1:]``).

    Run the local stack until SIGINT/SIGTERM; return the exit status (2: bad settings or a
    missing program, 1: a port taken or the stack failed).  Nothing starts, and no "stopped."
    is printed, when a check fails."""
    ap = argparse.ArgumentParser(prog=PROG, description="The whole operator on this machine, without Docker, on a "
                                                      "SIMULATED cluster; Ctrl-C stops it.")
    ap.add_argument("--api-port", type=int, default=None,
                    help="the discovery API's port (env DEMO_API_PORT; default 8080; 0: a free one)")
    ap.add_argument("--flower-port", type=int, default=None,
                    help="Flower's port (env DEMO_FLOWER_PORT; default 5555; 0: a free one)")
    ap.add_argument("--kube-port", type=int, default=None, help="the API fake's port (default: a free one)")
    ap.add_argument("--pod-cidr", default=None,
                    help="loopback range of the Squid Pods (default: a free 127.A.B.0/24)")
    ap.add_argument("--workdir", help="keep kubeconfig, configs and logs here (default: a temp dir, removed)")
    ap.add_argument("--info-file", help="also write the connection facts as JSON to this file")
    args = ap.parse_args(argv)
    for tool in ("redis-server", "squid"):
        if shutil.which(tool) is None and not os.path.exists(f"/usr/sbin/{tool}"):
            print(f"{PROG}: {tool} is not installed; install it as root with `sudo bash .ci/install-deps demo` "
                  f"(or `sudo apt-get install {tool}`)", file=sys.stderr)
            return 2
    try:
        ports = resolve_ports({"--api-port": args.api_port, "--flower-port": args.flower_port,
                               "--kube-port": args.kube_port}, dict(os.environ))
    except ValueError as exc:
        print(f"{PROG}: {exc}", file=sys.stderr)
        return 2
    try:
        if args.pod_cidr is not None:
            ipaddress.ip_network(args.pod_cidr)
    except ValueError as exc:
        print(f"{PROG}: --pod-cidr {args.pod_cidr}: {exc}", file=sys.stderr)
        return 2
    warning = kubectl_warning()
    if warning:
        print(f"{PROG}: warning: {warning}", file=sys.stderr, flush=True)
    problems = port_problems(ports)
    if problems:
        for problem in problems:
            print(f"{PROG}: {problem}", file=sys.stderr)
        return 1
    stop = threading.Event()
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    try:
        demo = Demo(api_port=ports["--api-port"][0], flower_port=ports["--flower-port"][0],
                    kube_port=ports["--kube-port"][0], pod_cidr=args.pod_cidr, workdir=args.workdir)
    except ValueError as exc:  # --pod-cidr outside 127.0.0.0/8
        print(f"{PROG}: {exc}", file=sys.stderr)
        return 2
    try:
        try:
            demo.start()
        except (RuntimeError, ValueError, AssertionError) as exc:
            print(f"{PROG}: {exc}", file=sys.stderr)
            return 1
        if args.info_file:
            Path(args.info_file).write_text(json.dumps(demo.info(), indent=2))
        print(demo.banner(), flush=True)
        while not stop.wait(1.0):
            dead = [p.name for p in demo.processes if not p.alive()]
            if dead:
                print(f"{PROG}: {', '.join(dead)} exited; logs in {demo.workdir / 'logs'}", file=sys.stderr)
                return 1
        print("stopping...", flush=True)
        return 0
    finally:
        started = bool(demo.processes) or demo.redis is not None
        demo.stop()
        if started:
            print("stopped.", flush=True)


if __name__ == "__main__":
    sys.exit(main())
