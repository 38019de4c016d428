"""The kvm block of the providers config: defaults, overrides and every rejection located."""

from __future__ import annotations

import copy

import pytest

from app.config.validation import ConfigError
from tests.kvm.harness import kvm_entry, provider_config

SHA = "ab" * 32


def entry(**changes):
    e = kvm_entry(user="proxyop", port=22, key_file="/etc/proxy-operator/kvm/id_ed25519",
                  known_hosts_file="/etc/proxy-operator/kvm/known_hosts",
                  hosts=[{"name": "lab1", "address": "lab1.example.internal"}],
                  images={"debian-12": {"url": "https://example.invalid/d.qcow2", "sha256": SHA}})
    e = copy.deepcopy(e)
    for path, value in changes.items():
        node = e["kvm"]
        keys = path.split(".")
        for k in keys[:-1]:
            node = node[int(k)] if k.isdigit() else node[k]
        last = keys[-1]
        if value is None:
            del node[last]
        elif last.isdigit():
            node[int(last)] = value
        else:
            node[last] = value
    return e


def test_defaults():
    e = entry()
    del e["kvm"]["callTimeout"]
    e["kvm"]["ssh"] = {"user": "proxyop", "keyFile": "/k", "knownHostsFile": "/kh"}
    s = provider_config(e).settings
    host = s.host("lab1")
    assert (host.pool, host.network, host.bridge, host.domain_type, host.port) == ("default", "default", None, "kvm", None)
    assert host.libvirt_socket == "/var/run/libvirt/libvirt-sock" and host.libvirt_uri == "qemu:///system"
    assert s.ssh_port(host) == 22
    assert (s.ssh.connect_timeout, s.ssh.handshake_timeout, s.ssh.keepalive_interval) == (10, 15, 30)
    assert (s.call_timeout, s.image_timeout, s.install_guest_agent, s.configure_squid) == (60, 1800, True, True)
    assert s.agent_address_timeout == 300, "5 minutes for the guest agent before the DHCP lease is taken"
    img = s.images["debian-12"]
    assert (img.format, img.firmware, img.sha256) == ("qcow2", "uefi", SHA)


def test_host_overrides_and_bridge():
    s = provider_config(entry(**{"hosts.0": {"name": "lab1", "address": "10.0.0.5", "port": 2222, "bridge": "br0",
                                             "domainType": "qemu", "pool": "vms"}})).settings
    host = s.host("lab1")
    assert s.ssh_port(host) == 2222 and host.bridge == "br0" and host.network is None
    assert host.domain_type == "qemu" and host.pool == "vms"


@pytest.mark.parametrize("changes, field, problem", [
    ({"hosts.0.name": "lab/1"}, "kvm.hosts[0].name", "plain identifier"),
    ({"hosts.0.bridge": "br0", "hosts.0.network": "default"}, "kvm.hosts[0].bridge", "not both"),
    ({"hosts.0.domainType": "xen"}, "kvm.hosts[0].domainType", "not one of"),
    ({"hosts.0.libvirtURI": "qemu+ssh://x/system"}, "kvm.hosts[0].libvirtURI", "local driver URI"),
    ({"hosts.0.libvirtSocket": "run/libvirt-sock"}, "kvm.hosts[0].libvirtSocket", "absolute"),
    ({"hosts.0.pool": "my pool"}, "kvm.hosts[0].pool", "libvirt object name"),
    ({"hosts.0.port": 70000}, "kvm.hosts[0].port", "at most 65535"),
    ({"hosts.0.colour": "blue"}, "kvm.hosts[0].colour", "unknown key"),
    ({"hosts": []}, "kvm.hosts", "at least one host"),
    ({"images.debian-12.sha256": "abc"}, "kvm.images.debian-12.sha256", "64 hexadecimal"),
    ({"images.debian-12.url": "file:///x.qcow2"}, "kvm.images.debian-12.url", "http(s) URL"),
    ({"images.debian-12.firmware": "coreboot"}, "kvm.images.debian-12.firmware", "not one of"),
    ({"ssh.keyFile": "/etc/proxy-operator/kvm/id_ed25519.pub"}, "kvm.ssh.keyFile", "public key"),
    ({"ssh.handshakeTimeout": "0"}, "kvm.ssh.handshakeTimeout", "greater than 0"),
    ({"ssh.user": None}, "kvm.ssh.user", "required"),
    ({"callTimeout": "soon"}, "kvm.callTimeout", "not a duration"),
    ({"installGuestAgent": "yes"}, "kvm.installGuestAgent", "true or false"),
    ({"agentAddressTimeout": "soon"}, "kvm.agentAddressTimeout", "not a duration"),
    ({"agentAddressTimeout": -5}, "kvm.agentAddressTimeout", "negative duration"),
    ({"agentAddressTimeout": "2h"}, "kvm.agentAddressTimeout", "at most 1h"),
])
def test_rejections_name_the_field(changes, field, problem):
    with pytest.raises(ConfigError) as err:
        provider_config(entry(**changes))
    assert err.value.field == field and err.value.provider == "kvm-test"
    assert problem in str(err.value)


def test_agent_address_timeout_accepts_zero_and_durations():
    assert provider_config(entry(agentAddressTimeout="0")).settings.agent_address_timeout == 0
    assert provider_config(entry(agentAddressTimeout="1m30s")).settings.agent_address_timeout == 90
    assert provider_config(entry(agentAddressTimeout="1h")).settings.agent_address_timeout == 3600


def test_duplicate_host_and_bad_image_key():
    with pytest.raises(ConfigError, match="duplicate host name"):
        provider_config(entry(hosts=[{"name": "a", "address": "x"}, {"name": "a", "address": "y"}]))
    e = entry()
    e["kvm"]["images"]["Debian_12"] = e["kvm"]["images"].pop("debian-12")
    with pytest.raises(ConfigError, match="plain identifier"):
        provider_config(e)


def test_allow_image_urls_is_off_by_default_and_parsed_strictly():
    assert provider_config(entry()).settings.image_urls is None
    s = provider_config(entry(allowImageURLs={"hosts": ["Images.Example.com", "10.0.0.5"]})).settings
    assert s.image_urls.hosts == ("images.example.com", "10.0.0.5")
    assert s.image_urls.max_bytes == 10 * 1024 ** 3
    assert provider_config(entry(allowImageURLs={"hosts": ["h"], "maxSize": "512MiB"})).settings \
        .image_urls.max_bytes == 512 * 1024 ** 2
    assert provider_config(entry(allowImageURLs={"hosts": ["h"], "maxSize": 1000})).settings \
        .image_urls.max_bytes == 1000


@pytest.mark.parametrize("value, field, problem", [
    (True, "kvm.allowImageURLs", "must be a mapping"),
    ({}, "kvm.allowImageURLs.hosts", "required"),
    ({"hosts": []}, "kvm.allowImageURLs.hosts", "at least one host"),
    ({"hosts": ["https://images.example.com"]}, "kvm.allowImageURLs.hosts[0]", "not a host name"),
    ({"hosts": ["h"], "maxSize": "lots"}, "kvm.allowImageURLs.maxSize", "must be a size"),
    ({"hosts": ["h"], "maxSize": 0}, "kvm.allowImageURLs.maxSize", "greater than 0"),
    ({"hosts": ["h"], "checksum": False}, "kvm.allowImageURLs.checksum", "unknown key"),
])
def test_bad_allow_image_urls_names_file_provider_and_field(value, field, problem):
    with pytest.raises(ConfigError) as info:
        provider_config(entry(allowImageURLs=value))
    assert (info.value.file, info.value.provider, info.value.field) == ("<kvm-test>", "kvm-test", field)
    assert problem in info.value.problem
