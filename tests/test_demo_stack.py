"""``make demo`` (devcluster/demo.py) as a user meets it: started as a command, driven with
the real kubectl and curl exactly as README documents, stopped with Ctrl-C (SIGINT).

Checks: the Proxy from ``deploy/samples/proxy_kubernetes.yaml`` (applied with validation on)
goes Ready offline (its default health URL is pointed at the demo's local origin),
``kubectl get px -w`` shows Phase/Provider/Address/Egress IP/Healthy, ``describe`` shows
conditions and Events, a lease is taken with curl and a page fetched through the leased proxy,
the Proxy is deleted; then the ProxyPool sample (``deploy/samples/proxypool_kubernetes.yaml``,
README's lines run as written) gets 3 leasable members, each a real Squid, ``kubectl scale``
makes 5, a lease naming the pool is served through one of them, and deleting the pool deletes
them all; after SIGINT every process the demo started is gone.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from devcluster import demo as demo_module
from tests.support.waiting import wait_for
from tests.test_ci_commands import readme_demo_block

ROOT = Path(__file__).resolve().parents[1]
pytestmark = [
    pytest.mark.slow,
    pytest.mark.timeout(240),
    pytest.mark.skipif(shutil.which("kubectl") is None,
                       reason="kubectl is not installed (1.27 or newer, from "
                              "https://kubernetes.io/docs/tasks/tools/)"),
    pytest.mark.skipif(shutil.which("curl") is None, reason="curl is not installed (apt-get install curl)"),
]


def _descendants(pid: int) -> set[int]:
    """Every live process whose ancestry leads to ``pid`` (children in new sessions included)."""
    parents: dict[int, int] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                stat = Path(f"/proc/{entry}/stat").read_text()
            except OSError:
                continue
            parents[int(entry)] = int(stat.rsplit(")", 1)[1].split()[1])
    out, frontier = set(), {pid}
    while frontier:
        children = {c for c, p in parents.items() if p in frontier and c not in out}
        out |= children
        frontier = children
    return out


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def test_make_demo_runs_the_documented_steps_and_stops_on_ctrl_c(tmp_path):
    info_file = tmp_path / "demo.json"
    log = open(tmp_path / "demo.out", "wb")
    demo = subprocess.Popen([str(Path(sys.executable).parent / "proxy-operator"), "demo", "--api-port", "0", "--flower-port", "0",
                             "--info-file", str(info_file)], cwd=ROOT, stdout=log, stderr=subprocess.STDOUT)
    started: set[int] = set()
    try:
        wait_for(lambda: info_file.exists() or demo.poll() is not None, 90, "the demo to come up")
        assert demo.poll() is None, (tmp_path / "demo.out").read_text()
        info = json.loads(info_file.read_text())
        banner = (tmp_path / "demo.out").read_text()
        assert "SIMULATED" in banner and f"\n  export KUBECONFIG={info['kubeconfig']}\n" in banner
        variables = f"TOKEN={info['token']} API={info['api']} ORIGIN={info['origin']}"
        assert f"\n  {variables}\n" in banner and info["flower"] in banner
        # The steps it prints are README's, word for word (tests/test_ci_commands.py), in order.
        assert "".join(f"  {line}\n" for line in demo_module.STEPS_LINES) in banner
        assert "proxy-operator demo: warning" not in banner  # this machine's kubectl is new enough
        env = {**os.environ, "KUBECONFIG": info["kubeconfig"], "KUBECACHEDIR": str(tmp_path / "kcache")}

        def sh(*argv: str, check: bool = True) -> str:
            res = subprocess.run(list(argv), env=env, cwd=ROOT, capture_output=True, text=True, timeout=30)
            if check:
                assert res.returncode == 0, f"{argv}: {res.stdout}\n{res.stderr}"
            return res.stdout

        watch = subprocess.Popen(["kubectl", "get", "px", "-w"], env=env, cwd=ROOT, stdout=subprocess.PIPE,
                                 stderr=subprocess.STDOUT, text=True)
        printed: list[str] = []

        def read_watch() -> None:
            for line in watch.stdout:
                printed.append(line)

        reader = threading.Thread(target=read_watch, daemon=True)
        reader.start()
        assert "created" in sh("kubectl", "apply", "-f", "deploy/samples/proxy_kubernetes.yaml")
        sh("kubectl", "wait", "--for=condition=Ready", "px/squid-k8s-1", "--timeout=25s")
        # `kubectl wait` saw Ready on a watch of its own: the `get -w` process prints the same event
        # when it next runs, which on a busy machine may be a while later
        wait_for(lambda: any(line.split()[:2] == ["squid-k8s-1", "Ready"] for line in list(printed)), 30,
                 "kubectl get px -w to print the Ready row", explain=lambda: "".join(printed))
        watch.terminate()
        watch.wait(timeout=10)
        reader.join(timeout=10)
        rows = [line.split() for line in printed if line.strip()]
        assert rows[0][:7] == ["NAME", "PHASE", "PROVIDER", "ADDRESS", "EGRESS", "IP", "HEALTHY"]
        last = rows[-1]
        assert last[:3] == ["squid-k8s-1", "Ready", "k8s-local"] and last[5] == "True"
        assert last[4] == "127.0.0.1"  # the egress IP, learnt from the local echo through the Squid

        described = sh("kubectl", "describe", "px", "squid-k8s-1")
        assert "Conditions:" in described and "Phase:                   Ready" in described
        events = described.split("Events:", 1)[1]
        assert "Provisioning" in events and "Ready" in events and info["healthURL"] in events

        # README's lease and curl lines run as written, in bash, after the line the banner printed.
        steps = readme_demo_block()
        first = next(i for i, line in enumerate(steps) if line.startswith("LEASE="))
        script = "\n".join([variables, *steps[first:first + 6]])
        assert steps[first + 9] == "kubectl delete px squid-k8s-1", steps
        lease_line, rest = sh("bash", "-euo", "pipefail", "-c", script).split("\n", 1)
        page, released = rest.rstrip("\n").rsplit("\n", 1)
        lease = json.loads(lease_line)
        assert json.loads(released)["wasLive"] is True  # released while the Proxy still exists
        assert lease["proxy"]["name"] == "squid-k8s-1"
        assert lease["proxyUrl"].startswith(f"http://{info['podCIDR'].rsplit('.', 1)[0]}.")
        assert "Hello from the proxy-operator demo origin" in page
        # README's targeted lease and the proxy list, as written: a lease for one site, and the
        # proxies the token sees with their per-site state.
        targeted, listed = sh("bash", "-euo", "pipefail", "-c", "\n".join([variables, *steps[first + 6:first + 9]])
                              ).strip().split("\n", 1)
        assert json.loads(targeted)["target"] == "example.org"
        assert [(p["name"], p["bans"]["active"]) for p in json.loads(listed)["items"]] == [("squid-k8s-1", [])]
        flower = subprocess.run(["curl", "-s", "-o", "/dev/null", "-w", "%{http_code}", info["flower"]],
                                capture_output=True, text=True, timeout=30).stdout
        assert flower == "401"  # Flower asks for its basic-auth login

        assert 'proxy.crawl.example.com "squid-k8s-1" deleted' in sh("kubectl", "delete", "px", "squid-k8s-1")
        assert sh("kubectl", "get", "px", "-o", "name").strip() == ""

        # README's ProxyPool lines, run as written in bash: the sample pool's 3 members are real
        # Squids, `kubectl scale` makes 5, a lease names the pool, deleting it deletes them all.
        def step(*lines: str) -> str:
            return sh("bash", "-euo", "pipefail", "-c", "\n".join([variables, *lines]))

        apply_pool = steps.index(next(line for line in steps if "proxypool_kubernetes.yaml" in line))
        get_pxp, scale, get_members, lease_1, lease_2, delete_pool = steps[apply_pool + 1:apply_pool + 7]
        assert (get_pxp.split("#")[0].strip(), scale.split()[:3], delete_pool.split("#")[0].strip()) == (
            "kubectl get pxp", ["kubectl", "scale", "pxp/squid-k8s-pool"], "kubectl delete pxp squid-k8s-pool")
        assert "created" in step(steps[apply_pool])
        # leasable (the serving view) and Ready (the Proxies' phase) are two writes of one probe
        # verdict, counted by the pool's passes as they land: the rows below show both
        for field in ("leasableReplicas", "readyReplicas"):
            sh("kubectl", "wait", f"--for=jsonpath={{.status.{field}}}=3", "pxp/squid-k8s-pool", "--timeout=60s")
        rows = [line.split() for line in step(get_pxp).splitlines()]
        assert rows[0] == ["NAME", "DESIRED", "READY", "LEASABLE", "UPDATED", "BURNED", "RECYCLED", "AGE"]
        assert rows[1][:5] == ["squid-k8s-pool", "3", "3", "3", "3"]
        assert "proxypool.crawl.example.com/squid-k8s-pool scaled" in step(scale)
        for field in ("leasableReplicas", "readyReplicas"):  # the members' rows show their phase
            sh("kubectl", "wait", f"--for=jsonpath={{.status.{field}}}=5", "pxp/squid-k8s-pool", "--timeout=60s")
        members = [line.split() for line in step(get_members).splitlines()[1:]]
        assert len(members) == 5, members
        assert all(m[0].startswith("squid-k8s-pool-") and m[1:3] == ["Ready", "k8s-local"] for m in members), members
        lease = json.loads(step(lease_1, lease_2))
        assert lease["proxy"]["name"] in {m[0] for m in members}
        page = sh("curl", "-s", "--noproxy", "", "-x", lease["proxyUrl"], info["origin"])
        assert "Hello from the proxy-operator demo origin" in page  # a real Squid of the pool
        assert 'proxypool.crawl.example.com "squid-k8s-pool" deleted' in step(delete_pool)
        wait_for(lambda: sh("kubectl", "get", "px", "-o", "name").strip() == "", 30,
                 "the pool's Proxies to be deleted with it")
        started = _descendants(demo.pid)
        assert started  # Redis, the operator's processes, the Squid
    finally:
        started |= _descendants(demo.pid)
        demo.send_signal(signal.SIGINT)
        try:
            rc = demo.wait(45)
        except subprocess.TimeoutExpired:
            demo.kill()
            raise
        finally:
            log.close()
    assert rc == 0, (tmp_path / "demo.out").read_text()
    out = (tmp_path / "demo.out").read_text()
    assert out.rstrip().endswith("stopped.")
    wait_for(lambda: not [p for p in started if _alive(p)], 10, "every process the demo started to exit")
    assert not Path(info["kubeconfig"]).exists()  # its temp directory is gone too
