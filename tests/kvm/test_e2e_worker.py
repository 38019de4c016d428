"""End to end on KVM: watcher + a dedicated host worker on ``kvm.<provider>.<host>``.

The Proxy is applied to the API fake; the watcher routes its tasks to the host's queue; the
worker started with ``proxy-operator worker --kvm-host kvm-lab/h1`` defines and starts a real
domain on the libvirt daemon over SSH.  A fake guest then takes a DHCP lease for the domain's
MAC from the network's real dnsmasq (a disk without an OS never would), the poll reports it,
and the Proxy goes Running; deleting it removes the domain.
"""

from __future__ import annotations


import libvirt
import pytest
import yaml
from kubernetes import client as k8s

from app.providers.kvm import domain as dom_xml
from app.providers.kvm.provider import AGENT_UNAVAILABLE, WAITING_FOR_AGENT
from app.resources import GROUP, PLURAL, VERSION
from tests.kvm import harness
from devcluster.cluster import FakeCluster
from tests.support.waiting import wait_for
from tests.support.processes import BIN, Process, celery_worker, watcher
from tests.test_rbac import granted, grants_of

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

KVM_WORKER_TOKEN = "rbac-audit-kvm-worker-0e6a"

#: Reasons of the Provisioned condition once the domain exists and has no address yet: create's,
#: then the poll's notes (app/providers/kvm/provider.py).
CREATED_REASONS = ("Provisioning", WAITING_FOR_AGENT, AGENT_UNAVAILABLE)


def test_kvm_proxy_goes_running_and_is_deleted_through_its_host_queue(rig, image, tmp_path, redis_url):
    _, url, sha, _ = image()
    # agentAddressTimeout 0: a disk without an OS runs no guest agent; the fake guest's lease is
    # taken at once (tests/kvm/test_address.py covers the wait for the agent).
    entry = rig.entry(name="kvm-lab", hosts=[rig.host("h1")], imageTimeout="60s", agentAddressTimeout="0",
                      images={"tiny": {"url": url, "sha256": sha, "format": "qcow2", "firmware": "bios"}})
    providers = tmp_path / "providers.yaml"
    providers.write_text(yaml.safe_dump({"providers": [{**entry, "checkInterval": 0}],
                                         "tenancy": {"cloudInitNamespaces": ["default"]}}))

    with FakeCluster(kubelet=False) as cluster:
        env = {"KUBECONFIG": cluster.fake.write_kubeconfig(str(tmp_path / "kubeconfig")), "REDIS_URL": redis_url,
               "PROVIDERS_CONFIG": str(providers), "POLL_INITIAL": "0.5", "POLL_MAX": "1",
               "RETRY_INITIAL": "0.5", "RETRY_MAX": "2"}
        general = celery_worker(env, name="general")
        # the host worker talks to the API with a token of its own: what it sends must be what
        # deploy/rbac grants the kvm-worker's ServiceAccount (tests/test_rbac.py does the others)
        sent = cluster.fake.audit(KVM_WORKER_TOKEN)
        host_env = {**env, "KUBECONFIG": cluster.fake.write_kubeconfig(str(tmp_path / "kubeconfig-kvm"),
                                                                       token=KVM_WORKER_TOKEN)}
        host_worker = Process("kvm-worker", [str(BIN / "proxy-operator"), "worker", "--kvm-host", "kvm-lab/h1",
                                             "--concurrency", "1"], host_env)
        procs = [general.start(), host_worker.start(), watcher(env).start()]
        try:
            general.wait_for_log("ready", 60)
            host_worker.wait_for_log("ready", 60)
            assert "kvm.kvm-lab.h1" in host_worker.log()
            # One process owns the host's connection and image cache.
            assert "concurrency: 1 (prefork)" in host_worker.log()
            custom = k8s.CustomObjectsApi(cluster.fake.api_client())
            created = custom.create_namespaced_custom_object(GROUP, VERSION, "default", PLURAL, {
                "apiVersion": f"{GROUP}/{VERSION}", "kind": "Proxy", "metadata": {"name": "squid-kvm-1"},
                "spec": {"provider": "kvm-lab", "placement": {"zone": "h1", "image": "tiny", "machineType": "small"},
                         "cloudInit": {"inline": "#cloud-config\npackages: [squid]\n"}}})

            def status():
                obj = custom.get_namespaced_custom_object(GROUP, VERSION, "default", PLURAL, "squid-kvm-1")
                return obj.get("status") or {}

            def requested(s: dict) -> bool:
                # The provider ID is recorded before the create (write-ahead, reason Creating);
                # the reason turns to Provisioning once the provider has created the domain, and
                # the polls that follow (POLL_INITIAL 0.5 s later) replace it with why the domain
                # has no address yet, so either reason means the domain exists.
                return any(c.get("type") == "Provisioned" and c.get("reason") in CREATED_REASONS
                           for c in s.get("conditions") or [])

            def logs() -> str:
                return "\n".join(f"--- {p.name} (last 4000 chars) ---\n{p.log()[-4000:]}" for p in procs)

            st = wait_for(lambda: requested(s := status()) and s, 120, "the domain to be created", explain=logs)
            assert st["phase"] == "Provisioning"
            name = st["instanceName"]
            assert st["providerID"] == f"hosts/h1/domains/{name}"
            assert "proxy.create[" in host_worker.log() and "proxy.create[" not in general.log()

            conn = libvirt.open(f"qemu+unix:///system?socket={rig.daemon.socket}")
            try:
                dom = conn.lookupByName(name)
                assert dom.isActive()
                [(mac, _network)] = dom_xml.nic_macs(dom.XMLDesc(0))
                with harness.FakeGuest(rig, name) as guest:
                    address = guest.lease(mac, "boot-1")
                    st = wait_for(lambda: (s := status()).get("phase") == "Running" and s, 60, "Proxy Running",
                                  explain=logs)
                assert st["address"] == address
                assert created["metadata"]["uid"] in dom.metadata(libvirt.VIR_DOMAIN_METADATA_ELEMENT,
                                                                  dom_xml.METADATA_NS, 0)

                custom.delete_namespaced_custom_object(GROUP, VERSION, "default", PLURAL, "squid-kvm-1")

                def gone():
                    try:
                        custom.get_namespaced_custom_object(GROUP, VERSION, "default", PLURAL, "squid-kvm-1")
                        return False
                    except k8s.ApiException as exc:
                        return exc.status == 404

                wait_for(gone, 60, "the Proxy to be deleted", explain=logs)
                with pytest.raises(libvirt.libvirtError):
                    conn.lookupByName(name)
                grants = grants_of("proxy-operator-kvm-worker")
                assert ("patch", GROUP, "proxies/status", "default") in sent
                missing = sorted((r for r in sent if not granted(r, grants)), key=str)
                assert missing == [], f"the kvm-worker sent what deploy/rbac does not grant it: {missing}"
            finally:
                conn.close()
        finally:
            for p in procs:
                p.stop()
