"""The providers config is strict and every rejection names the file, the provider and the field."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

from app.wiring import load_config as load
from app.config.validation import ConfigError

KVM_OK = """
  - name: kvm-lab
    type: kvm
    kvm:
      ssh: {user: proxyop, keyFile: /k, knownHostsFile: /kh}
      images:
        debian-12: {url: "http://127.0.0.1/i.qcow2", sha256: "abababababababababababababababababababababababababababababababab", format: qcow2, firmware: uefi}
      machineTypes:
        small: {vcpus: 1, memoryMiB: 512, diskGiB: 8}
      hosts:
        - {name: lab1, address: 127.0.0.1}
"""


def write(tmp_path, body: str):
    path = tmp_path / "providers.yaml"
    path.write_text(textwrap.dedent(body))
    return path


def test_valid_config_with_every_type_loads(tmp_path):
    path = write(tmp_path, """
        providers:
          - name: k8s-local
            type: kubernetes
            checkInterval: 1m
            kubernetes: {namespace: proxies, image: "ubuntu/squid:latest", port: 3128}
          - name: gcp-eu
            type: gcp
            checkInterval: 0
            gcp: {project: demo-project, zones: [europe-west1-b]}
    """ + KVM_OK.replace("\n  ", "\n          "))
    cfg = load(path)
    assert cfg.names() == ["k8s-local", "gcp-eu", "kvm-lab"]
    assert cfg.get("k8s-local").check_interval == 60
    assert cfg.get("gcp-eu").check_interval == 0
    assert cfg.get("kvm-lab").check_timeout == 15
    assert cfg.get("kvm-lab").settings.host("lab1").domain_type == "kvm"
    # a new Pod leaves through its node's address: replacements keep the egress IP; cloud and kvm
    # instances get a new one
    assert cfg.get("k8s-local").replacement_keeps_ip
    assert not cfg.get("gcp-eu").replacement_keeps_ip and not cfg.get("kvm-lab").replacement_keeps_ip


def test_replacement_egress_ip_overrides_the_type_default(tmp_path):
    cfg = load(write(tmp_path, """
        providers:
          - {name: pods-own-ip, type: kubernetes, replacementEgressIP: new}
          - {name: static, type: gcp, replacementEgressIP: same, gcp: {project: demo-project, zones: [europe-west1-b]}}
    """))
    assert not cfg.get("pods-own-ip").replacement_keeps_ip
    assert cfg.get("static").replacement_keeps_ip


@pytest.mark.parametrize("body, provider, field, problem", [
    ("providers:\n  - {name: a, type: kubernetes, colour: red}\n", "a", "colour", "unknown key"),
    ("providers:\n  - {name: a, type: openstack}\n", "a", "type", "not one of"),
    ("providers:\n  - {name: a, type: kubernetes}\n  - {name: a, type: kubernetes}\n", "a", "name", "duplicate"),
    ("providers:\n  - {name: g, type: gcp, gcp: {zones: [x]}}\n", "g", "gcp.project", "required"),
    ("providers:\n  - {name: g, type: gcp}\n", "g", "gcp", "required"),
    ("providers:\n  - {name: a, type: kubernetes, gcp: {project: p}}\n", "a", "gcp", "block for type"),
    ("providers:\n  - {name: a, type: kubernetes, checkInterval: 5s}\n", "a", "checkInterval", "at least 10s"),
    ("providers:\n  - {name: a, type: kubernetes, checkInterval: soon}\n", "a", "checkInterval", "not a duration"),
    ("providers:\n  - {name: Bad_Name, type: kubernetes}\n", "Bad_Name", "name", "plain identifier"),
    ("providers:\n  - {name: a, type: kubernetes, kubernetes: {port: 70000}}\n", "a", "kubernetes.port", "at most"),
    ("providers:\n  - {name: a, type: kubernetes, replacementEgressIP: fresh}\n", "a", "replacementEgressIP",
     "not one of"),
])
def test_bad_config_names_file_provider_and_field(tmp_path, body, provider, field, problem):
    path = write(tmp_path, body)
    with pytest.raises(ConfigError) as err:
        load(path)
    message = str(err.value)
    assert str(path) in message
    assert f'provider "{provider}"' in message
    assert f": {field}:" in message
    assert problem in message


@pytest.mark.parametrize("mutation, field", [
    (("name: lab1", "name: lab/1"), "kvm.hosts[0].name"),
    (("debian-12:", "Debian_12:"), "kvm.images.Debian_12"),
])
def test_kvm_host_and_image_keys_must_be_plain_identifiers(tmp_path, mutation, field):
    path = write(tmp_path, "providers:" + KVM_OK.replace(*mutation))
    with pytest.raises(ConfigError) as err:
        load(path)
    assert f": {field}" in str(err.value) and "plain identifier" in str(err.value)


def test_unreadable_and_malformed_files(tmp_path):
    with pytest.raises(ConfigError, match="cannot read"):
        load(tmp_path / "missing.yaml")
    path = write(tmp_path, "providers: [\n")
    with pytest.raises(ConfigError, match=r"not valid YAML at line \d+"):
        load(path)


def test_check_config_command_exits_non_zero_with_one_clear_line(tmp_path):
    path = write(tmp_path, "providers:\n  - {name: g, type: gcp, gcp: {}}\n")
    out = subprocess.run([sys.executable, "-m", "cli", "check-config", str(path)],
                         capture_output=True, text=True)
    assert out.returncode == 2
    assert f'{path}: provider "g": gcp.project: required' in out.stderr
    good = write(tmp_path, "providers:\n  - {name: k, type: kubernetes}\n")
    ok = subprocess.run([sys.executable, "-m", "cli", "check-config", str(good)], capture_output=True, text=True)
    assert ok.returncode == 0 and "1 provider(s): k" in ok.stdout


def test_worker_refuses_to_start_on_a_bad_config(tmp_path):
    path = write(tmp_path, "providers:\n  - {name: a, type: kubernetes, bogus: 1}\n")
    out = subprocess.run([sys.executable, "-m", "cli", "worker", "--providers-config", str(path)],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 2 and "bogus: unknown key" in out.stderr


def test_squid_policy_per_provider(tmp_path):
    path = write(tmp_path, """
        providers:
          - name: k
            type: kubernetes
            squid: {allowedSourceRanges: [10.20.0.0/16], connectPorts: [443, 8443]}
    """)
    policy = load(path).get("k").squid
    assert policy.allowed_ranges == ("10.20.0.0/16",) and policy.connect_ports == (443, 8443)
    bad = write(tmp_path, "providers:\n  - {name: k, type: kubernetes, squid: {allowedSourceRanges: [nonsense]}}\n")
    with pytest.raises(ConfigError, match=r'provider "k": squid.allowedSourceRanges\[0\]: .*not a CIDR'):
        load(bad)
