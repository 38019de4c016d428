"""The kubernetes client's credential refresh hook runs at most once a second (app/kube/client.py).

The loaders' hook runs before every request and re-reads every proxy variable of the
environment when it copies ``host`` back; :func:`app.kube.client.load_configuration` throttles it.
"""

from __future__ import annotations

import time

from kubernetes import client as k8s

from app.kube import client as kube


def test_the_hook_runs_at_most_once_per_period_and_follows_the_hook_it_reinstalls():
    calls = []

    def loader_hook(configuration):
        calls.append(time.monotonic())
        # as kube_config's hook does: every run installs a new hook of its own
        configuration.refresh_api_key_hook = lambda c: calls.append("stale hook")

    cfg = k8s.Configuration()
    cfg.api_key["BearerToken"] = "t"
    cfg.refresh_api_key_hook = loader_hook
    kube._refresh_at_most_every(cfg, 0.2)
    for _ in range(50):
        cfg.get_api_key_with_prefix("BearerToken")
    assert len(calls) == 1  # once, not per request
    assert cfg.refresh_api_key_hook is not loader_hook  # still the throttled one
    time.sleep(0.25)
    cfg.get_api_key_with_prefix("BearerToken")
    assert calls[1:] == ["stale hook"]  # the hook the loader re-installed ran, through the wrapper
    cfg.get_api_key_with_prefix("BearerToken")
    assert len(calls) == 2


def test_load_configuration_throttles_the_kubeconfig_loaders_hook(tmp_path, monkeypatch):
    from devcluster.apiserver.server import write_kubeconfig

    monkeypatch.setenv("KUBECONFIG", write_kubeconfig(str(tmp_path / "kubeconfig"), "http://127.0.0.1:1"))
    cfg = kube.load_configuration()
    assert cfg.refresh_api_key_hook is not None and cfg.refresh_api_key_hook.__qualname__.endswith("refresh")
    assert cfg.get_api_key_with_prefix("BearerToken") == "Bearer kubefake"
    assert cfg.host == "http://127.0.0.1:1"
