"""The operator environment the pools' real-process tests run under (one place for both stacks)."""

from __future__ import annotations

from pathlib import Path

import yaml

from devcluster.squid import LOOPBACK_SQUID_BLOCK


def pool_operator_env(tmp: Path, cluster, redis_url: str) -> dict[str, str]:
    """Write ``tmp/providers.yaml`` (two kubernetes providers whose Squids may reach loopback
    origins: ``k8s-local`` whose replacements get a new egress IP, ``k8s-snat`` whose keep it) and ``tmp/kubeconfig`` (the fake's), and return the environment of the watcher,
    worker and beat: short resync, poll and pool-resync periods, health sweeps every second."""
    providers = tmp / "providers.yaml"
    # k8s-local: the kubelet stand-in runs each Pod on an address of its own, as a cluster whose
    # Pods leave through their own IPs (no node SNAT): a replacement gets a new egress IP.
    # k8s-snat: the default of the type, Pods behind their node's address (drained in place).
    providers.write_text(yaml.safe_dump({"providers": [
        {"name": "k8s-local", "type": "kubernetes", "checkInterval": "10s", "squid": LOOPBACK_SQUID_BLOCK,
         "replacementEgressIP": "new"},
        {"name": "k8s-snat", "type": "kubernetes", "checkInterval": "10s", "squid": LOOPBACK_SQUID_BLOCK}]}))
    return {
        "KUBECONFIG": cluster.fake.write_kubeconfig(str(tmp / "kubeconfig")), "REDIS_URL": redis_url,
        "PROVIDERS_CONFIG": str(providers), "RESYNC_INTERVAL": "3", "GC_INTERVAL": "3600",
        "POOL_RESYNC_INTERVAL": "2", "POLL_INITIAL": "0.5", "POLL_MAX": "2", "RETRY_INITIAL": "0.5",
        "RETRY_MAX": "2", "TASK_SOFT_TIME_LIMIT": "20", "TASK_TIME_LIMIT": "25",
        "BROKER_VISIBILITY_TIMEOUT": "120", "HEALTH_SWEEP_INTERVAL": "1", "EGRESS_ECHO_URL": "",
        "PROBE_ALLOWED_RANGES": "127.0.0.0/8", "LOG_LEVEL": "INFO",
    }
