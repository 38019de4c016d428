"""The pooled SSH+libvirt link: dial stages, lazy auth, reuse, redial, timeouts, host isolation."""

from __future__ import annotations

import logging
import os
import shutil
import signal
import socket
import subprocess
import threading
import time

import pytest

from app.providers.naming import MANAGED_BY
from app.errors import NotFound, Permanent, Transient
from app.providers.kvm.faults import (STAGE_HANDSHAKE, STAGE_LIBVIRT, STAGE_MATERIAL, STAGE_TCP,
                                      BadSSHMaterial, DialError)
from tests.kvm import harness

pytestmark = pytest.mark.timeout(120)


def _dial_error(provider, host: str = "h1") -> DialError:
    with pytest.raises(DialError) as err:
        provider.link(host).call("virConnectGetLibVersion", lambda c: c.getLibVersion())
    assert isinstance(err.value, Transient)
    return err.value


@pytest.fixture
def spare_sshd(rig, tmp_path):
    """A second sshd (own port) in front of the same daemon, stopped after the test."""
    s = harness.Sshd(tmp_path / "sshd2", rig.keys.host_key, rig.keys.client_pub).start()
    yield s
    s.stop()


def _known_hosts(tmp_path, *entries) -> str:
    path = tmp_path / "known_hosts"
    path.write_text("".join(harness.known_hosts_line("127.0.0.1", port, pub) for port, pub in entries))
    return str(path)


def test_constructor_does_not_dial(rig, make_provider):
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(1)
    listener.settimeout(0.3)
    port = listener.getsockname()[1]
    provider = make_provider(rig.entry(hosts=[rig.host(port=port)]))
    with pytest.raises(socket.timeout):
        listener.accept()
    listener.close()
    assert provider.link("h1").dials == 0


def test_stage_tcp_when_no_sshd_listens(rig, make_provider):
    port = harness.free_port()
    err = _dial_error(make_provider(rig.entry(hosts=[rig.host(port=port)])))
    assert err.stage == STAGE_TCP and "TCP" in str(err) and f"127.0.0.1:{port}" in str(err)


def test_stage_handshake_for_an_unknown_host_and_a_wrong_host_key(rig, make_provider, tmp_path):
    empty = tmp_path / "empty_known_hosts"
    empty.write_text("")
    err = _dial_error(make_provider(rig.entry(known_hosts_file=empty)))
    assert err.stage == STAGE_HANDSHAKE and "not in the known_hosts file" in str(err)

    wrong = _known_hosts(tmp_path, (rig.sshd.port, rig.keys.other_host_pub))
    before = rig.sshd.accepted()
    err = _dial_error(make_provider(rig.entry(known_hosts_file=wrong)))
    assert err.stage == STAGE_HANDSHAKE and "host key mismatch" in str(err)
    assert "SSH handshake" in str(err)
    assert rig.sshd.accepted() == before, "the client stops before authenticating to an impostor"


def test_hashed_known_hosts_entries_are_accepted(rig, make_provider, tmp_path):
    hashed = tmp_path / "hashed_known_hosts"
    hashed.write_text(rig.known_hosts.read_text())
    subprocess.run(["ssh-keygen", "-q", "-H", "-f", str(hashed)], check=True, capture_output=True)
    assert "127.0.0.1" not in hashed.read_text()
    assert make_provider(rig.entry(known_hosts_file=hashed)).check_host("h1").ready


def test_stage_handshake_when_authentication_is_refused(rig, make_provider, tmp_path):
    stranger = harness.make_keys(tmp_path / "stranger").client_key
    err = _dial_error(make_provider(rig.entry(key_file=stranger)))
    assert err.stage == STAGE_HANDSHAKE and "authentication" in str(err)


def test_handshake_deadline_against_a_silent_server(rig, make_provider):
    silent = socket.socket()
    silent.bind(("127.0.0.1", 0))
    silent.listen(4)
    accepted = []
    threading.Thread(target=lambda: accepted.append(silent.accept()), daemon=True).start()
    provider = make_provider(rig.entry(hosts=[rig.host(port=silent.getsockname()[1])],
                                       ssh={"handshakeTimeout": "1s"}))
    started = time.monotonic()
    err = _dial_error(provider)
    assert err.stage == STAGE_HANDSHAKE
    assert time.monotonic() - started < 5
    silent.close()


def test_stage_libvirt_connect_when_the_socket_is_missing(rig, make_provider):
    err = _dial_error(make_provider(rig.entry(hosts=[rig.host(libvirtSocket="/run/nothing/libvirt-sock")])))
    assert err.stage == STAGE_LIBVIRT and "/run/nothing/libvirt-sock" in str(err)


def test_lazy_auth_heals_when_the_secret_appears(rig, make_provider, tmp_path, caplog, request_for, image):
    secret = tmp_path / "kvm-ssh"
    key, hosts = secret / "id_ed25519", secret / "known_hosts"
    with caplog.at_level(logging.WARNING, logger="proxy_operator.kvm"):
        provider = make_provider(rig.entry(key_file=key, known_hosts_file=hosts))
    assert f"SSH key file {key} does not exist" in caplog.text
    assert f"known_hosts file {hosts} does not exist" in caplog.text

    with pytest.raises(DialError) as err:
        provider.get("hosts/h1/domains/proxy-missing")
    assert err.value.stage == STAGE_MATERIAL and isinstance(err.value, Transient)

    # The Secret is created (mounted) later; the same provider object heals on its next call.
    secret.mkdir()
    shutil.copy(rig.keys.client_key, key)
    with pytest.raises(DialError) as err:
        provider.get("hosts/h1/domains/proxy-missing")
    assert "known_hosts" in str(err.value) and err.value.stage == STAGE_MATERIAL
    shutil.copy(rig.known_hosts, hosts)
    with pytest.raises(NotFound):
        provider.get("hosts/h1/domains/proxy-missing")
    assert provider.link("h1").dials == 1


def test_unusable_key_is_permanent(rig, make_provider, tmp_path):
    garbage = tmp_path / "garbage"
    garbage.write_text("-----BEGIN OPENSSH PRIVATE KEY-----\nnot a key\n-----END OPENSSH PRIVATE KEY-----\n")
    with pytest.raises(BadSSHMaterial) as err:
        make_provider(rig.entry(key_file=garbage)).get("hosts/h1/domains/x")
    assert isinstance(err.value, Permanent) and err.value.stage == STAGE_MATERIAL

    public_in_disguise = tmp_path / "id_ed25519"
    public_in_disguise.write_bytes(rig.keys.client_pub.read_bytes())
    with pytest.raises(BadSSHMaterial, match="holds a public key"):
        make_provider(rig.entry(key_file=public_in_disguise)).get("hosts/h1/domains/x")


def test_check_reports_the_dial_stage(rig, make_provider):
    port = harness.free_port()
    verdicts = make_provider(rig.entry(hosts=[rig.host("up"), rig.host("down", port=port)])).check()
    by_name = {v.name: v for v in verdicts}
    assert by_name["up"].ready and by_name["up"].reason == "Ready"
    assert by_name["up"].details["libvirtVersion"].count(".") == 2
    assert int(by_name["up"].details["freeBytes"]) > 0
    assert not by_name["down"].ready and by_name["down"].reason == "HostUnreachable"
    assert by_name["down"].details["stage"] == STAGE_TCP


def test_check_reports_a_missing_pool(rig, make_provider):
    verdict = make_provider(rig.entry(hosts=[rig.host(pool="nope")])).check_host("h1")
    assert not verdict.ready and verdict.reason == "PoolNotFound"


def test_one_ssh_connection_for_100_calls_and_a_redial_after_sshd_restarts(rig, make_provider, spare_sshd,
                                                                         tmp_path):
    known = _known_hosts(tmp_path, (spare_sshd.port, rig.keys.host_pub))
    provider = make_provider(rig.entry(hosts=[rig.host(port=spare_sshd.port)], known_hosts_file=known))
    for i in range(100):
        if i % 2:
            with pytest.raises(NotFound):  # classified errors never drop the link
                provider.get("hosts/h1/domains/proxy-none")
        else:
            assert provider.check_host("h1").ready
    assert provider.link("h1").dials == 1
    assert spare_sshd.accepted() == 1

    spare_sshd.stop()
    spare_sshd.start()

    assert provider.check_host("h1").ready
    assert provider.link("h1").dials == 2
    assert spare_sshd.accepted() == 2


def test_a_dead_host_does_not_stop_the_other_and_listing_is_partial(rig, make_provider, spare_sshd, tmp_path,
                                                                   request_for, image):
    _, url, sha, _ = image()
    known = _known_hosts(tmp_path, (rig.sshd.port, rig.keys.host_pub), (spare_sshd.port, rig.keys.host_pub))
    provider = make_provider(rig.entry(hosts=[rig.host("h1"), rig.host("h2", port=spare_sshd.port)],
                                       known_hosts_file=known, images={"tiny": {"url": url, "sha256": sha}}))
    on_h2 = provider.create(request_for(zone="h2"))
    spare_sshd.stop()

    created = provider.create(request_for(zone="h1"))
    assert provider.get(created.provider_id).zone == "h1"
    listing = provider.list_by_tag(MANAGED_BY)
    assert listing.partial
    assert any("h2" in e and "TCP" in e for e in listing.errors)
    assert {i.zone for i in listing.instances} == {"h1"}
    # A per-host GC sweep (on the host's own queue) sees only its host.
    assert provider.list_by_tag(MANAGED_BY, host="h2").partial
    only_h1 = provider.list_by_tag(MANAGED_BY, host="h1")
    assert not only_h1.partial and created.provider_id in {i.provider_id for i in only_h1.instances}
    verdicts = {v.name: v.ready for v in provider.check()}
    assert verdicts == {"h1": True, "h2": False}
    with pytest.raises(DialError):
        provider.get(on_h2.provider_id)
    provider.delete(created.provider_id)


def test_a_hung_call_times_out_drops_the_link_and_the_next_call_redials(rig, make_provider):
    provider = make_provider(rig.entry(callTimeout="1s", ssh={"keepaliveInterval": "0"}))
    link = provider.link("h1")
    assert provider.check_host("h1").ready
    os.kill(rig.daemon.pid, signal.SIGSTOP)
    try:
        started = time.monotonic()
        with pytest.raises(Transient, match="no answer within 1s"):
            link.call("virConnectGetHostname", lambda c: c.getHostname())
        assert time.monotonic() - started < 5
    finally:
        os.kill(rig.daemon.pid, signal.SIGCONT)
    assert provider.check_host("h1").ready
    assert link.dials == 2


def test_every_libvirt_call_is_traced_at_debug_without_payloads(rig, make_provider, image, request_for, caplog):
    _, url, sha, _ = image()
    provider = make_provider(rig.entry(images={"tiny": {"url": url, "sha256": sha}}))
    secret_marker = "user-data-secret-7f3a9"
    req = request_for(user_data=f"#cloud-config\npassword: {secret_marker}\n".encode(),
                      vendor_data=f"#cloud-config\nx: {secret_marker}\n".encode())
    with caplog.at_level(logging.DEBUG, logger="proxy_operator"):
        with pytest.raises(NotFound):
            provider.get(f"hosts/h1/domains/{req.name}")
        inst = provider.create(req)
    lines = [r.getMessage() for r in caplog.records if r.name == "proxy_operator.kvm.libvirt"]
    miss = next(line for line in lines if "rpc=virDomainLookupByName" in line)
    assert f"domain={req.name}" in miss and "duration=" in miss
    assert "libvirtCode=42" in miss and "libvirtError=VIR_ERR_NO_DOMAIN" in miss
    assert any("rpc=virStorageVolUpload" in line and "bytes=" in line for line in lines)
    assert any("rpc=virDomainDefineXML" in line for line in lines)
    assert not any("<domain" in line for line in lines), "XML only at TRACE"
    provider.delete(inst.provider_id)

    caplog.clear()
    with caplog.at_level(5, logger="proxy_operator"):
        inst = provider.create(request_for(user_data=f"#cloud-config\npassword: {secret_marker}\n".encode()))
    assert any("<domain" in r.getMessage() for r in caplog.records if r.levelno == 5)
    assert secret_marker not in caplog.text
    provider.delete(inst.provider_id)


def test_libvirt_handshake_deadline_when_the_daemon_does_not_answer(rig, make_provider):
    provider = make_provider(rig.entry(ssh={"handshakeTimeout": "1s"}))
    os.kill(rig.daemon.pid, signal.SIGSTOP)
    try:
        started = time.monotonic()
        err = _dial_error(provider)
        elapsed = time.monotonic() - started
    finally:
        os.kill(rig.daemon.pid, signal.SIGCONT)
    assert err.stage == STAGE_LIBVIRT and "did not answer" in str(err)
    assert elapsed < 5
    assert provider.check_host("h1").ready


def test_keepalives_notice_a_silent_daemon_between_calls(rig, make_provider):
    """libvirt keepalives (1 s, 1 miss) close a link whose daemon stopped answering even while
    no call is running, so the next call after it recovers dials afresh."""
    provider = make_provider(rig.entry(ssh={"keepaliveInterval": "1s", "keepaliveCount": 1}))
    assert provider.check_host("h1").ready
    os.kill(rig.daemon.pid, signal.SIGSTOP)
    try:
        time.sleep(3.5)
    finally:
        os.kill(rig.daemon.pid, signal.SIGCONT)
    assert provider.check_host("h1").ready
    assert provider.link("h1").dials == 2
