"""Deployment artefacts: samples, the kustomize tree, the Dockerfile and docker-compose.yml.

The kustomize render needs the ``kubectl`` client (offline: ``kubectl kustomize``); those
tests skip when it is absent. No Docker engine runs here, so the Dockerfile and the
compose file are checked by reading them.
"""

from __future__ import annotations

import fnmatch
import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from app import wiring

ROOT = Path(__file__).resolve().parent.parent
DEPLOY = ROOT / "deploy"
SAMPLES = DEPLOY / "samples"
KUBECTL = shutil.which("kubectl")
needs_kubectl = pytest.mark.skipif(KUBECTL is None, reason="kubectl (for `kubectl kustomize`) is not installed")

pytestmark = pytest.mark.timeout(120)

# The process commands, as the Deployments run them.
COMMANDS = {
    "watcher": ["proxy-operator", "watch", "--health-bind", ":8081"],
    "worker": ["celery", "-A", "workers", "worker", "-Q", "proxies,gc", "-E"],
    # probe batches (up to a probe timeout each) never hold the children that start creates
    "health-worker": ["celery", "-A", "workers", "worker", "-Q", "health", "-E"],
    "beat": ["celery", "-A", "workers", "beat", "-S", "workers.beat_scheduler.ResilientRedBeatScheduler"],
    "api": ["proxy-operator", "api", "--bind", "0.0.0.0:8080", "--workers", "2"],
    "flower": ["celery", "-A", "workers", "flower", "--address=0.0.0.0", "--port=5555"],
}


def _without_concurrency(cmd: list[str]) -> list[str]:
    out, skip = [], False
    for arg in cmd:
        if skip:
            skip = False
            continue
        if arg == "--concurrency":
            skip = True
            continue
        if arg.startswith("--concurrency="):
            continue
        out.append(arg)
    return out


def _process_command(container: dict) -> list[str]:
    """The process a container runs: its ``args`` behind an ``sh -c '... exec "$@"'`` wrapper
    (the workers prepare PROMETHEUS_MULTIPROC_DIR that way), else its ``command``."""
    cmd = container["command"]
    if cmd[:2] == ["sh", "-c"] and cmd[2].rstrip().endswith('exec "$@"'):
        return container["args"]
    return cmd


# -- every YAML file parses -----------------------------------------------------------------

@pytest.mark.parametrize("path", sorted(p.relative_to(ROOT).as_posix()
                                        for p in list(DEPLOY.rglob("*.yaml")) + [ROOT / "docker-compose.yml"]))
def test_yaml_parses(path):
    docs = [d for d in yaml.safe_load_all((ROOT / path).read_text()) if d is not None]
    assert docs, f"{path} holds no document"
    for doc in docs:
        assert isinstance(doc, dict), f"{path}: a document is not a mapping"


# -- samples ----------------------------------------------------------------------------------

@pytest.mark.parametrize("path", ["deploy/samples/providers.yaml", "deploy/compose/providers.yaml"])
def test_providers_configs_load(path):
    cfg = wiring.load_config(ROOT / path)
    assert "k8s-local" in cfg.names()


def test_providers_sample_shows_every_type():
    cfg = wiring.load_config(SAMPLES / "providers.yaml")
    assert {p.type for p in cfg.providers} == {"kubernetes", "gcp", "kvm"}
    kvm = cfg.get("kvm-lab")
    assert kvm.settings.host("lab1") is not None
    raw = yaml.safe_load((SAMPLES / "providers.yaml").read_text())
    [kvm_raw] = [p for p in raw["providers"] if p["type"] == "kvm"]
    for key in ("keyFile", "knownHostsFile"):  # where the deployments mount the kvm-ssh Secret
        assert kvm_raw["kvm"]["ssh"][key].startswith("/etc/proxy-operator/kvm/")
    assert cfg.get("gcp-eu").settings.project == "demo-project"


def test_tokens_sample_has_only_marked_placeholders():
    text = (SAMPLES / "tokens.yaml").read_text()
    assert "EXAMPLE ONLY" in text
    clients = yaml.safe_load(text)["clients"]
    assert [c["name"] for c in clients] == ["crawler-a", "crawler-b"]
    for client in clients:
        assert set(client) - {"namespaces", "pools"} in ({"name", "token"}, {"name", "tokenSHA256"})
        if "token" in client:
            assert "PLACEHOLDER" in client["token"]
        else:
            assert re.fullmatch(r"[0-9a-f]{64}", client["tokenSHA256"])


def test_samples_document_skip_cleanup():
    assert "crawl.example.com/skip-cleanup" in (SAMPLES / "proxy_kubernetes.yaml").read_text()


# -- kustomize ------------------------------------------------------------------------------

def render(path: str) -> list[dict]:
    out = subprocess.run([KUBECTL, "kustomize", str(DEPLOY / path)], capture_output=True, text=True,
                         timeout=60)
    assert out.returncode == 0, f"kubectl kustomize {path} failed:\n{out.stderr}"
    return [d for d in yaml.safe_load_all(out.stdout) if d]


@pytest.fixture(scope="module")
def default_render() -> list[dict]:
    if KUBECTL is None:
        pytest.skip("kubectl is not installed")
    return render("default")


def _kind(docs: list[dict], kind: str) -> dict[str, dict]:
    return {d["metadata"]["name"]: d for d in docs if d["kind"] == kind}


def _assert_hardened(deploy: dict) -> None:
    name = deploy["metadata"]["name"]
    pod = deploy["spec"]["template"]["spec"]
    pod_sc = pod.get("securityContext") or {}
    tmp_volumes = {v["name"] for v in pod.get("volumes", []) if "emptyDir" in v}
    for c in pod.get("initContainers", []) + pod["containers"]:
        sc = {**pod_sc, **(c.get("securityContext") or {})}
        where = f"{name}/{c['name']}"
        assert sc.get("runAsNonRoot") is True, f"{where}: runAsNonRoot"
        assert sc.get("runAsUser", 0) != 0, f"{where}: runs as root"
        assert sc.get("readOnlyRootFilesystem") is True, f"{where}: root filesystem is writable"
        assert sc.get("allowPrivilegeEscalation") is False, f"{where}: allowPrivilegeEscalation"
        assert "ALL" in (sc.get("capabilities") or {}).get("drop", []), f"{where}: capabilities not dropped"
        assert not (sc.get("capabilities") or {}).get("add"), f"{where}: adds capabilities"
        mounts = {m["mountPath"]: m["name"] for m in c.get("volumeMounts", [])}
        assert mounts.get("/tmp") in tmp_volumes, f"{where}: no emptyDir on /tmp"
        res = c.get("resources") or {}
        assert {"cpu", "memory"} <= set(res.get("requests", {})), f"{where}: resource requests"
        assert {"cpu", "memory"} <= set(res.get("limits", {})), f"{where}: resource limits"


@needs_kubectl
def test_default_renders_every_process_hardened(default_render):
    deployments = _kind(default_render, "Deployment")
    assert set(deployments) == {"watcher", "worker", "health-worker", "beat", "api", "flower", "redis"}
    for deploy in deployments.values():
        assert deploy["metadata"]["namespace"] == "proxy-operator"
        _assert_hardened(deploy)
    for name, cmd in COMMANDS.items():
        [container] = deployments[name]["spec"]["template"]["spec"]["containers"]
        assert _without_concurrency(_process_command(container)) == cmd, name


@needs_kubectl
def test_default_wires_config_secrets_and_probes(default_render):
    deployments = _kind(default_render, "Deployment")
    [configmap] = [n for n in _kind(default_render, "ConfigMap") if n.startswith("proxy-operator-providers")]
    cfg = yaml.safe_load(_kind(default_render, "ConfigMap")[configmap]["data"]["providers.yaml"])
    assert cfg["providers"][0]["name"] == "k8s-local"
    for name in ("watcher", "worker", "health-worker", "beat", "api", "flower"):
        pod = deployments[name]["spec"]["template"]["spec"]
        [c] = pod["containers"]
        env = {e["name"]: e.get("value") for e in c["env"]}
        assert env["REDIS_URL"] == "redis://redis:6379/0"
        assert env["PROVIDERS_CONFIG"] == "/etc/proxy-operator/providers/providers.yaml"
        volumes = {v["name"]: v for v in pod["volumes"]}
        mounts = {m["mountPath"]: m["name"] for m in c["volumeMounts"]}
        assert volumes[mounts["/etc/proxy-operator/providers"]]["configMap"]["name"] == configmap
        # one identity per process, with its own role (tests/test_rbac.py)
        assert pod["serviceAccountName"] == f"proxy-operator-{name}"
        if name in ("watcher", "worker", "health-worker"):
            assert pod.get("automountServiceAccountToken", True) is True
            # the kvm-ssh private key is mounted where KVM work runs only (the per-host workers)
            assert "/etc/proxy-operator/kvm" not in mounts
            assert not any((v.get("secret") or {}).get("secretName") == "kvm-ssh" for v in volumes.values())
        else:  # beat, api and flower never call the Kubernetes API
            assert pod["automountServiceAccountToken"] is False
    api = deployments["api"]["spec"]["template"]["spec"]
    env = {e["name"]: e.get("value") for e in api["containers"][0]["env"]}
    assert env["API_TOKENS_FILE"] == "/etc/proxy-operator/tokens/tokens.yaml"
    tokens = {v["name"]: v for v in api["volumes"]}["tokens"]["secret"]
    assert tokens["optional"] is True
    assert api["containers"][0]["livenessProbe"]["httpGet"]["path"] == "/healthz"
    watcher = deployments["watcher"]["spec"]["template"]["spec"]["containers"][0]
    assert watcher["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "health"}
    assert {"name": "health", "containerPort": 8081} in watcher["ports"]
    services = _kind(default_render, "Service")
    assert {"api", "flower", "redis"} <= set(services)
    assert services["flower"]["spec"]["ports"][0]["port"] == 5555


@needs_kubectl
def test_default_includes_the_crds(default_render):
    crds = _kind(default_render, "CustomResourceDefinition")
    assert set(crds) == {"proxies.crawl.example.com", "providerhealths.crawl.example.com",
                         "proxypools.crawl.example.com"}
    for name, path in (("proxies", "proxy.yaml"), ("proxypools", "proxypool.yaml")):
        on_disk = yaml.safe_load((DEPLOY / "crd" / path).read_text())
        assert crds[f"{name}.crawl.example.com"]["spec"] == on_disk["spec"]


def _rules(doc: dict) -> list[dict]:
    return doc.get("rules") or []


@needs_kubectl
def test_rbac_is_least_privilege(default_render):
    roles = list(_kind(default_render, "ClusterRole").values()) + list(_kind(default_render, "Role").values())
    assert roles
    for role in roles:
        for rule in _rules(role):
            for key in ("apiGroups", "resources", "verbs"):
                assert "*" not in rule.get(key, []), f"{role['metadata']['name']} grants * in {key}"
    def grants(kind: str, name: str) -> set[tuple[str, str, str]]:
        return {(g, r, v) for rule in _rules(_kind(default_render, kind)[name]) for g in rule["apiGroups"]
                for r in rule["resources"] for v in rule["verbs"]}

    components = ("watcher", "worker", "health-worker", "kvm-worker")
    for component in components:
        role = f"proxy-operator-{component}"
        binding = _kind(default_render, "ClusterRoleBinding")[role]
        assert binding["roleRef"]["name"] == role
        assert binding["subjects"] == [{"kind": "ServiceAccount", "name": role, "namespace": "proxy-operator"}]
        held = grants("ClusterRole", role)
        assert not any(r == "proxypools" and v in ("create", "delete", "patch", "update") for _, r, v in held), \
            "the operator never creates, deletes or edits a ProxyPool (spec.replicas only through /scale)"
        assert not any(r == "secrets" and v in ("list", "watch") for _, r, v in held), \
            "listing Secrets would expose every Secret of the cluster"
    # the watcher gets no Pods or Secrets; the health-worker reads Secrets and lists Pods only
    assert not any(r in ("pods", "secrets") for _, r, _ in grants("ClusterRole", "proxy-operator-watcher"))
    health = grants("ClusterRole", "proxy-operator-health-worker")
    assert {(r, v) for _, r, v in health if r in ("pods", "secrets")} == {("pods", "list"), ("secrets", "get")}
    assert not any(r == "pods" for _, r, _ in grants("ClusterRole", "proxy-operator-kvm-worker"))
    # beat, api and flower: an identity without a role and without a token
    accounts = _kind(default_render, "ServiceAccount")
    for component in ("beat", "api", "flower"):
        assert accounts[f"proxy-operator-{component}"]["automountServiceAccountToken"] is False
    bound = {s["name"] for b in list(_kind(default_render, "ClusterRoleBinding").values())
             + list(_kind(default_render, "RoleBinding").values()) for s in b.get("subjects") or []}
    assert not bound & {"proxy-operator-beat", "proxy-operator-api", "proxy-operator-flower", "proxy-operator"}
    lease = _kind(default_render, "Role")["proxy-operator-leader-election"]
    assert lease["metadata"]["namespace"] == "proxy-operator"
    assert _rules(lease)[0]["apiGroups"] == ["coordination.k8s.io"]
    [lease_binding] = [b for b in _kind(default_render, "RoleBinding").values()
                       if b["roleRef"]["name"] == "proxy-operator-leader-election"]
    assert lease_binding["subjects"] == [{"kind": "ServiceAccount", "name": "proxy-operator-watcher",
                                          "namespace": "proxy-operator"}]
    viewer = _kind(default_render, "ClusterRole")["proxy-operator-providerhealth-viewer"]
    assert {v for rule in _rules(viewer) for v in rule["verbs"]} == {"get", "list", "watch"}


@needs_kubectl
def test_kvm_worker_overlay_consumes_one_host_queue():
    docs = render("kvm-worker/kvm-lab-lab1")
    [deploy] = [d for d in docs if d["kind"] == "Deployment"]
    assert deploy["metadata"]["name"] == "kvm-worker-kvm-lab-lab1"
    assert deploy["spec"]["replicas"] == 1
    # its own identity (deploy/rbac: no Pods, no ProxyPools; tests/kvm/test_e2e_worker.py)
    assert deploy["spec"]["template"]["spec"]["serviceAccountName"] == "proxy-operator-kvm-worker"
    _assert_hardened(deploy)
    [c] = deploy["spec"]["template"]["spec"]["containers"]
    cmd = _process_command(c)
    assert cmd[:4] == ["celery", "-A", "workers", "worker"]
    assert cmd[cmd.index("-Q") + 1] == "kvm.kvm-lab.lab1"
    assert cmd[cmd.index("--concurrency") + 1] == "1"
    selector = deploy["spec"]["selector"]["matchLabels"]
    assert selector["crawl.example.com/kvm-queue"] == "kvm.kvm-lab.lab1"
    assert selector.items() <= deploy["spec"]["template"]["metadata"]["labels"].items()
    assert "kvm.kvm-lab.lab1" in (DEPLOY / "kvm-worker" / "README.md").read_text()


def routed_queues() -> set[str]:
    """Every fixed queue the code sends to: the default route of every registered task
    (workers/routing.py, else Celery's default queue), the queues the dispatcher and beat name
    (app/dispatch/proxies.py: proxies, health, gc) and the queues the Celery app declares. The
    kvm.<provider>.<host> queues are served by the per-host workers (checked above)."""
    import workers.probe_tasks  # registers the tasks
    import workers.tasks  # noqa: F401
    from app.store import queues as dispatch
    from workers import routing
    from workers.celery_app import celery_app

    names = [n for n in celery_app.tasks if not n.startswith("celery.")]
    assert {"proxy.create", "health.probe_batch", "gc.sweep", "providers.check"} <= set(names)
    default = celery_app.conf.task_default_queue
    queues = {(routing.route_task(n, [], {}, {}) or {}).get("queue", default) for n in names}
    queues |= {dispatch.PROXIES, dispatch.HEALTH, dispatch.GC}
    queues |= {q.name for q in celery_app.conf.task_queues}
    assert not any(q.startswith(dispatch.HOST_QUEUE_PREFIX) for q in queues)
    return queues


def _consumers(commands: dict[str, list[str]]) -> dict[str, list[str]]:
    """queue -> the Celery worker processes (by name) whose ``-Q`` names it."""
    out: dict[str, list[str]] = {}
    for name, cmd in sorted(commands.items()):
        if cmd[:4] == ["celery", "-A", "workers", "worker"] and "-Q" in cmd:
            for queue in cmd[cmd.index("-Q") + 1].split(","):
                out.setdefault(queue, []).append(name)
    return out


def _assert_queue_layout(consumers: dict[str, list[str]], where: str) -> None:
    routed = routed_queues()
    assert set(consumers) == routed, f"{where}: serves {sorted(consumers)}, the code routes to {sorted(routed)}"
    for queue, names in consumers.items():
        assert len(names) == 1, f"{where}: {queue} is consumed by {names}"
    # probe batches (up to a probe timeout each) never hold a child that should start a create
    assert consumers["health"] == ["health-worker"], where
    assert consumers["proxies"] == consumers["gc"] == ["worker"], where


@needs_kubectl
def test_every_routed_queue_is_served_by_one_deployed_worker(default_render):
    deployments = _kind(default_render, "Deployment")
    commands = {name: _process_command(d["spec"]["template"]["spec"]["containers"][0])
                for name, d in deployments.items() if "command" in d["spec"]["template"]["spec"]["containers"][0]}
    _assert_queue_layout(_consumers(commands), "deploy/default")
    # the health-worker is deployed like the worker: same image, identity, hardening, volumes
    worker, health = (deployments[n]["spec"]["template"]["spec"] for n in ("worker", "health-worker"))
    # ... but with an identity of its own (no Pod writes, no Secret writes: tests/test_rbac.py)
    assert (health["serviceAccountName"], worker["serviceAccountName"]) == (
        "proxy-operator-health-worker", "proxy-operator-worker")
    assert health["securityContext"] == worker["securityContext"]
    assert health["volumes"] == worker["volumes"]
    [wc], [hc] = worker["containers"], health["containers"]
    assert hc["image"] == wc["image"] and hc["command"] == wc["command"]
    # ... but logs in to Redis as its own ACL user (test_every_process_logs_in_as_its_own_redis_user)
    redis_login = {"REDIS_USERNAME", "REDIS_PASSWORD"}
    assert [e for e in hc["env"] if e["name"] not in redis_login] == [e for e in wc["env"] if e["name"] not in redis_login]
    assert hc["securityContext"] == wc["securityContext"]
    assert hc["volumeMounts"] == wc["volumeMounts"] and hc["ports"] == wc["ports"]
    assert _pod_labels(deployments["health-worker"])["app.kubernetes.io/component"] == "health-worker"


def test_every_routed_queue_is_served_by_one_compose_worker(compose):
    commands = {name: svc["command"] for name, svc in compose["services"].items()
                if isinstance(svc.get("command"), list)}
    _assert_queue_layout(_consumers(commands), "docker-compose.yml")
    # the probes go through the Squid Pods, whose IPs only k3s's network namespace reaches
    services = compose["services"]
    assert services["health-worker"]["network_mode"] == services["worker"]["network_mode"] == "service:k3s"


@needs_kubectl
def test_prometheus_service_monitor_selects_metrics_services(default_render):
    [monitor] = [d for d in render("prometheus") if d["kind"] == "ServiceMonitor"]
    assert monitor["kind"] == "ServiceMonitor"
    assert monitor["spec"]["endpoints"][0]["path"] == "/metrics"
    services = _kind(default_render, "Service")
    port = monitor["spec"]["endpoints"][0]["port"]
    assert port in {p["name"] for p in services["api"]["spec"]["ports"]}


# -- Dockerfile, .dockerignore, docker-compose.yml --------------------------------------------

def test_dockerfile_builds_one_non_root_stamped_image():
    text = (ROOT / "Dockerfile").read_text()
    froms = re.findall(r"^FROM\s+(\S+)", text, re.M)
    assert len(froms) == 2 and re.search(r"^ARG PYTHON_IMAGE=python:3\.11-slim@sha256:[0-9a-f]{64}$", text, re.M)
    assert re.search(r"pip install (--\S+ )*\.( |$)", text, re.M)  # the lock first: tests/test_image_pins.py
    assert "libvirt-dev" in text
    assert re.search(r"^ARG GIT_COMMIT", text, re.M)
    assert re.search(r"GIT_COMMIT=\$\{GIT_COMMIT\}", text)
    assert 'org.opencontainers.image.revision="${GIT_COMMIT}"' in text
    users = re.findall(r"^USER\s+(\S+)", text, re.M)
    assert users and users[-1].split(":")[0] == "10001"


def _dockerignored(path: str, patterns: list[str]) -> bool:
    ignored = False
    for pattern in patterns:
        negate = pattern.startswith("!")
        pat = pattern[1:] if negate else pattern
        if fnmatch.fnmatch(path, pat) or path.startswith(pat.rstrip("/") + "/") or path == pat:
            ignored = not negate
    return ignored


def test_dockerignore_keeps_what_the_dockerfile_copies():
    patterns = [line.strip() for line in (ROOT / ".dockerignore").read_text().splitlines()
                if line.strip() and not line.startswith("#")]
    sources = []
    for line in (ROOT / "Dockerfile").read_text().splitlines():
        if line.startswith("COPY ") and "--from" not in line:
            sources += line.split()[1:-1]
    assert sources
    for src in sources:
        assert (ROOT / src).exists(), f"Dockerfile copies {src}, which does not exist"
        assert not _dockerignored(src.rstrip("/"), patterns), f".dockerignore drops {src}"
    for private in (".venv", ".git", "tests"):
        assert _dockerignored(private, patterns), f".dockerignore should drop {private}"


@pytest.fixture(scope="module")
def compose() -> dict:
    return yaml.safe_load((ROOT / "docker-compose.yml").read_text())


def test_compose_runs_the_whole_stack(compose):
    services = compose["services"]
    assert {"redis", "k3s", "crds", "watcher", "worker", "health-worker", "beat", "api", "flower"} <= set(services)
    assert services["k3s"]["image"].startswith("rancher/k3s:")
    assert "127.0.0.1:5555:5555" in services["flower"]["ports"]  # Flower on this machine only
    assert services["api"]["ports"] == ["127.0.0.1:8080:8080"]  # the API on this machine only
    for name, cmd in COMMANDS.items():
        svc = services[name]
        assert _without_concurrency(svc["command"]) == cmd, name
        assert svc["environment"]["REDIS_URL"] == "redis://redis:6379/0"
        assert svc["environment"]["KUBECONFIG"] == "/kube/config"
        assert svc["read_only"] is True and "/tmp" in svc["tmpfs"]
        assert svc["build"]["args"]["GIT_COMMIT"].startswith("${GIT_COMMIT")
        assert svc["depends_on"]["crds"]["condition"] == "service_completed_successfully"
    crds = services["crds"]
    assert "./deploy/crd:/crd:ro" in crds["volumes"] and "-k" in crds["command"]


def test_compose_bind_mounts_exist(compose):
    for name, svc in compose["services"].items():
        for volume in svc.get("volumes", []):
            source = volume.split(":")[0]
            if source.startswith("."):
                assert (ROOT / source).exists(), f"{name} mounts missing {source}"


# -- access: Redis password, Flower auth, NetworkPolicies, the kvm-ssh key (docs/security.md) ---

OPERATOR_PODS = ("watcher", "worker", "health-worker", "beat", "api", "flower")


def _env(container: dict) -> dict[str, dict]:
    return {e["name"]: e for e in container.get("env", [])}


def _secret_ref(env: dict[str, dict], name: str) -> dict | None:
    return ((env.get(name) or {}).get("valueFrom") or {}).get("secretKeyRef")


@pytest.fixture(scope="module")
def kvm_render() -> list[dict]:
    if KUBECTL is None:
        pytest.skip("kubectl is not installed")
    return render("kvm-worker/kvm-lab-lab1")


REDIS_USERS = ("api", "worker", "health-worker", "beat", "watcher", "flower")


def _redis_secret(user: str) -> dict:
    return {"name": f"proxy-operator-redis-{user}", "key": "password"}


@needs_kubectl
def test_redis_gives_each_user_the_password_of_its_secret(default_render):
    from app.store import acl as redis_acl

    redis = _kind(default_render, "Deployment")["redis"]["spec"]["template"]["spec"]
    [c] = redis["containers"]
    env = _env(c)
    for user in REDIS_USERS:
        assert _secret_ref(env, f"REDIS_PASSWORD_{user.upper().replace('-', '_')}") == _redis_secret(user), user
    assert _secret_ref(env, "REDIS_PASSWORD_KEDA") == {**_redis_secret("keda"), "optional": True}
    assert {u.name for u in redis_acl.USERS} == set(REDIS_USERS) | {"keda"}
    script = c["command"][2]
    assert c["command"][:2] == ["sh", "-c"] and "args" not in c
    assert re.search(r"exec redis-server - .*<<EOF\n\$conf\nuser default reset off\nEOF", script)
    assert "--requirepass" not in script and "requirepass" not in script  # never on a command line
    for probe in ("livenessProbe", "readinessProbe"):  # the default user is off: NOAUTH means up
        assert c[probe]["exec"]["command"] == ["sh", "-c", "redis-cli ping | grep -q NOAUTH"]
    # the users file is the ConfigMap generated from deploy/base/redis-users.acl
    [volume] = [v for v in redis["volumes"] if "configMap" in v]
    assert {m["name"]: m["mountPath"] for m in c["volumeMounts"]}[volume["name"]] == "/etc/redis"
    [cm] = [d for d in default_render if d["kind"] == "ConfigMap" and d["metadata"]["name"] == volume["configMap"]["name"]]
    assert cm["data"]["users.acl"] == (DEPLOY / "base" / "redis-users.acl").read_text() == redis_acl.render()
    # created by hand (deploy/README.md), never rendered from the tree with a value in it
    assert not [d for d in default_render if d["kind"] == "Secret"]
    readme = (DEPLOY / "README.md").read_text()
    assert 'create secret generic "proxy-operator-redis-$user"' in readme
    assert "for user in " + " ".join(REDIS_USERS) + "; do" in readme
    assert "create secret generic proxy-operator-flower" in readme


@needs_kubectl
def test_every_process_logs_in_as_its_own_redis_user(default_render, kvm_render):
    deployments = _kind(default_render, "Deployment")
    [kvm] = [d for d in kvm_render if d["kind"] == "Deployment"]
    pods = {name: deployments[name] for name in OPERATOR_PODS} | {"kvm-worker": kvm}
    for name, deploy in pods.items():
        [c] = deploy["spec"]["template"]["spec"]["containers"]
        env = _env(c)
        user = "worker" if name == "kvm-worker" else name
        assert env["REDIS_URL"]["value"] == "redis://redis:6379/0", name  # no password in the URL
        assert env["REDIS_USERNAME"]["value"] == user, name
        assert _secret_ref(env, "REDIS_PASSWORD") == _redis_secret(user), name


@pytest.mark.skipif(shutil.which("redis-server") is None, reason="redis-server is not installed")
@needs_kubectl
def test_the_redis_start_script_refuses_odd_passwords_and_logs_each_user_in(default_render, tmp_path):
    import redis as redis_lib

    from devcluster.redis_server import free_port
    from tests.support.waiting import wait_for

    [c] = _kind(default_render, "Deployment")["redis"]["spec"]["template"]["spec"]["containers"]
    port = free_port()
    (tmp_path / "users.acl").write_text((DEPLOY / "base" / "redis-users.acl").read_text())
    script = c["command"][2].replace("--dir /data", f"--dir {tmp_path}").replace("--port 6379", f"--port {port}")
    script = script.replace("/etc/redis/users.acl", str(tmp_path / "users.acl")).replace("--appendonly yes", "--appendonly no")
    passwords = {u: f"{u}-0123abcd-._~" for u in REDIS_USERS}
    env = {"PATH": "/usr/bin:/bin", **{f"REDIS_PASSWORD_{u.upper().replace('-', '_')}": pw for u, pw in passwords.items()}}
    bad = subprocess.run(["sh", "-c", script], env={**env, "REDIS_PASSWORD_BEAT": "has space"},
                         capture_output=True, text=True, timeout=10)
    assert bad.returncode == 1
    assert "the Secret proxy-operator-redis-beat (key password) must hold a password of letters, digits" in bad.stderr
    proc = subprocess.Popen(["sh", "-c", script], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        def answers(user, pw):
            r = redis_lib.Redis(port=port, username=user, password=pw, socket_timeout=1)
            try:
                return r.ping()
            except redis_lib.AuthenticationError:
                return "refused"
            except redis_lib.ConnectionError:
                return None
            finally:
                r.close()

        assert wait_for(lambda: answers(None, None), 10, "redis-server to start") == "refused"
        for user, pw in passwords.items():
            assert answers(user, pw) is True, user
            assert answers(user, pw + "x") == "refused", user
        assert answers("keda", "") == "refused"  # no Secret for keda: left out
        assert answers("default", "anything") == "refused"
        r = redis_lib.Redis(port=port, username="api", password=passwords["api"], socket_timeout=1)
        with pytest.raises(redis_lib.exceptions.NoPermissionError):
            r.lpush("proxies", "{}")
        r.close()
    finally:
        proc.terminate()
        proc.wait(10)
    assert "no password for the user keda (Secret proxy-operator-redis-keda): left out" in proc.stderr.read().decode()


@needs_kubectl
def test_flower_asks_for_basic_auth_from_its_secret(default_render):
    [c] = _kind(default_render, "Deployment")["flower"]["spec"]["template"]["spec"]["containers"]
    assert _secret_ref(_env(c), "FLOWER_BASIC_AUTH") == {"name": "proxy-operator-flower", "key": "basic-auth"}
    assert c["livenessProbe"]["httpGet"]["path"] == "/healthcheck"  # open in Flower (tests/test_redis_auth.py)


@needs_kubectl
def test_only_the_kvm_workers_mount_the_kvm_ssh_key(default_render, kvm_render):
    for d in _kind(default_render, "Deployment").values():
        volumes = d["spec"]["template"]["spec"].get("volumes", [])
        assert not any((v.get("secret") or {}).get("secretName") == "kvm-ssh" for v in volumes), \
            d["metadata"]["name"]
    [kvm] = [d for d in kvm_render if d["kind"] == "Deployment"]
    pod = kvm["spec"]["template"]["spec"]
    [volume] = [v for v in pod["volumes"] if (v.get("secret") or {}).get("secretName") == "kvm-ssh"]
    assert {m["name"]: m["mountPath"] for m in pod["containers"][0]["volumeMounts"]}[volume["name"]] == \
        "/etc/proxy-operator/kvm"


def test_compose_protects_redis_and_flower(compose):
    services = compose["services"]
    redis = services["redis"]
    assert "user default reset off" in redis["command"][2] and "requirepass" not in redis["command"][2]
    assert "./deploy/base/redis-users.acl:/etc/redis/users.acl:ro" in redis["volumes"]  # the cluster's users
    assert "ports" not in redis, "Redis is reached on the compose network only, never published on the host"
    for name in COMMANDS:
        env = services[name]["environment"]
        user = env["REDIS_USERNAME"]
        assert user == name, name  # its own ACL user
        var = "REDIS_PASSWORD_" + user.upper().replace("-", "_")
        assert env["REDIS_PASSWORD"] == redis["environment"][var], name
        assert "CHANGE-ME" in env["REDIS_PASSWORD"]  # a marked development default
    flower = services["flower"]
    assert flower["environment"]["FLOWER_BASIC_AUTH"].startswith("${FLOWER_BASIC_AUTH:-operator:")
    assert all(p.startswith("127.0.0.1:") for p in flower["ports"])
    readme = (ROOT / "README.md").read_text()
    assert "REDIS_PASSWORD" in readme and "FLOWER_BASIC_AUTH" in readme and "REDIS_USERNAME" in readme


@pytest.mark.skipif(shutil.which("redis-server") is None, reason="redis-server is not installed")
def test_the_compose_redis_logs_each_service_in_as_its_user(compose, tmp_path):
    import redis as redis_lib

    from devcluster.redis_server import free_port
    from tests.support.waiting import wait_for

    redis = compose["services"]["redis"]
    port = free_port()
    script = redis["command"][2].replace("$$", "$").replace("/etc/redis/users.acl", str(DEPLOY / "base" / "redis-users.acl"))
    script = script.replace('--save ""', f'--save "" --port {port} --bind 127.0.0.1 --dir {tmp_path}')
    env = {"PATH": "/usr/bin:/bin"} | {k: v.split(":-", 1)[1].rstrip("}") for k, v in redis["environment"].items()}
    proc = subprocess.Popen(["sh", "-c", script], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        def ping(**kw):
            r = redis_lib.Redis(port=port, socket_timeout=1, **kw)
            try:
                return r.ping()
            except redis_lib.AuthenticationError:
                return "refused"
            except redis_lib.ConnectionError:
                return None
            finally:
                r.close()

        assert wait_for(lambda: ping(), 10, "redis-server to start") == "refused"
        for name in COMMANDS:
            env_of = compose["services"][name]["environment"]
            password = env_of["REDIS_PASSWORD"].split(":-", 1)[1].rstrip("}")
            assert ping(username=env_of["REDIS_USERNAME"], password=password) is True, name
    finally:
        proc.terminate()
        proc.wait(10)


# NetworkPolicy semantics (https://kubernetes.io/docs/concepts/services-networking/network-policies/):
# a peer with only podSelector selects Pods of the policy's namespace; with only
# namespaceSelector every Pod of the selected namespaces; with both, the selected Pods of the
# selected namespaces. A label selector with no terms selects everything.

def _selects(selector: dict | None, labels: dict) -> bool:
    if selector is None:
        return False
    for key, value in (selector.get("matchLabels") or {}).items():
        if labels.get(key) != value:
            return False
    for expr in selector.get("matchExpressions") or ():
        key, op, values = expr["key"], expr["operator"], expr.get("values") or []
        if op == "In" and labels.get(key) not in values:
            return False
        if op == "NotIn" and key in labels and labels[key] in values:
            return False
        if op == "Exists" and key not in labels:
            return False
        if op == "DoesNotExist" and key in labels:
            return False
    return True


def _admits(policy: dict, pod_labels: dict, namespace: str, namespace_labels: dict, port) -> bool:
    """Whether ``policy``'s ingress rules let a Pod (labels, namespace) connect to ``port``
    (a name or a number) of the Pods it selects."""
    own = policy["metadata"]["namespace"]
    namespace_labels = {**namespace_labels, "kubernetes.io/metadata.name": namespace}
    for rule in policy["spec"].get("ingress") or ():
        if rule.get("ports") and not any(p.get("port") == port for p in rule["ports"]):
            continue
        for peer in rule.get("from") or ():
            ns_sel, pod_sel = peer.get("namespaceSelector"), peer.get("podSelector")
            in_namespace = _selects(ns_sel, namespace_labels) if ns_sel is not None else namespace == own
            if in_namespace and (pod_sel is None or _selects(pod_sel, pod_labels)):
                return True
    return False


def _pod_labels(deploy: dict) -> dict:
    return deploy["spec"]["template"]["metadata"]["labels"]


def _port_names(deploy: dict) -> set:
    return {p.get("name") for c in deploy["spec"]["template"]["spec"]["containers"] for p in c.get("ports", [])} | \
        {p["containerPort"] for c in deploy["spec"]["template"]["spec"]["containers"] for p in c.get("ports", [])}


@needs_kubectl
def test_network_policies_select_the_pods_and_ports_they_protect(default_render):
    policies = _kind(default_render, "NetworkPolicy")
    deployments = _kind(default_render, "Deployment")
    assert set(policies) == {"redis", "api", "flower"}
    for name, policy in policies.items():
        assert policy["metadata"]["namespace"] == "proxy-operator"
        assert policy["spec"]["policyTypes"] == ["Ingress"]
        selected = [d for d, dep in deployments.items() if _selects(policy["spec"]["podSelector"], _pod_labels(dep))]
        assert selected == [name], f"NetworkPolicy {name} selects {selected}"
        for rule in policy["spec"]["ingress"]:
            for port in rule["ports"]:
                assert port["port"] in _port_names(deployments[name]), f"{name}: port {port['port']}"
    # the Services send to the ports the policies open
    services = _kind(default_render, "Service")
    for name in ("redis", "api", "flower"):
        target = services[name]["spec"]["ports"][0]["targetPort"]
        assert any(p["port"] == target for rule in policies[name]["spec"]["ingress"] for p in rule["ports"])


@needs_kubectl
def test_only_the_operators_pods_reach_redis(default_render, kvm_render):
    redis = _kind(default_render, "NetworkPolicy")["redis"]
    deployments = _kind(default_render, "Deployment")
    [kvm] = [d for d in kvm_render if d["kind"] == "Deployment"]
    for name in OPERATOR_PODS:
        assert _admits(redis, _pod_labels(deployments[name]), "proxy-operator", {}, "redis"), name
    assert _admits(redis, _pod_labels(kvm), "proxy-operator", {}, "redis")
    # ... and nothing else: a Squid Pod, a crawler, Prometheus, an operator look-alike elsewhere
    squid = {"app.kubernetes.io/managed-by": "proxy-operator", "crawl.example.com/proxy-uid": "u1"}
    strangers = [
        (squid, "default", {}),
        ({"crawl.example.com/api-client": "true"}, "crawlers", {"crawl.example.com/api-clients": "true"}),
        ({"app.kubernetes.io/name": "prometheus"}, "monitoring", {}),
        ({"app.kubernetes.io/name": "proxy-operator", "app.kubernetes.io/component": "worker"}, "elsewhere", {}),
        ({"app.kubernetes.io/name": "proxy-operator", "app.kubernetes.io/component": "health-worker"}, "elsewhere", {}),
        ({"app.kubernetes.io/name": "proxy-operator", "app.kubernetes.io/component": "redis-cli"},
         "proxy-operator", {}),
    ]
    for labels, namespace, ns_labels in strangers:
        assert not _admits(redis, labels, namespace, ns_labels, "redis"), (labels, namespace)


@needs_kubectl
def test_only_intended_clients_reach_the_api_and_flower(default_render):
    policies = _kind(default_render, "NetworkPolicy")
    api, flower = policies["api"], policies["flower"]
    crawler = {"crawl.example.com/api-client": "true"}
    prometheus = {"app.kubernetes.io/name": "prometheus"}
    assert _admits(api, crawler, "crawlers", {}, "http")
    assert _admits(api, {"app": "ingress-nginx"}, "ingress-nginx", {"crawl.example.com/api-clients": "true"}, "http")
    assert _admits(api, prometheus, "monitoring", {}, "http")
    assert not _admits(api, {"app": "something"}, "default", {}, "http")
    assert not _admits(api, crawler, "crawlers", {}, 6379)  # the policy opens the http port only
    assert _admits(flower, {"crawl.example.com/flower-client": "true"}, "ops", {}, "http")
    assert _admits(flower, prometheus, "monitoring", {}, "http")
    assert not _admits(flower, crawler, "crawlers", {"crawl.example.com/api-clients": "true"}, "http")
    assert not _admits(flower, {"app": "something"}, "default", {}, "http")
    # the labels are documented where operators look
    text = (DEPLOY / "README.md").read_text()
    for label in ("crawl.example.com/api-client", "crawl.example.com/api-clients", "crawl.example.com/flower-client"):
        assert label in text, label
