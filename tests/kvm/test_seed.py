"""The NoCloud seed: user-data byte for byte, meta-data, vendor-data with the guest agent."""

from __future__ import annotations

import base64
import email
import io
import subprocess

import pycdlib
import pytest

from app.squid import egress, conf as squid
from app.providers.kvm import seed

pytestmark = pytest.mark.timeout(120)

CLOUD_CONFIG = b"""#cloud-config
# keep this comment; version must stay 1.10, not 1.1
packages: [squid, curl]
runcmd:
  - [systemctl, restart, squid]
write_files:
  - path: /etc/demo
    content: "version: 1.10"
"""
JINJA = b"""## template: jinja
#cloud-config
hostname: {{ v1.local_hostname }}-proxy
packages: [squid]
"""
SHELL = b"#!/bin/bash\nset -e\napt-get install -y squid\necho '\xc3\xa9t\xc3\xa9' > /etc/motd\n"
MIME = (b'Content-Type: multipart/mixed; boundary="==BOUNDARY=="\nMIME-Version: 1.0\n\n'
        b'--==BOUNDARY==\nContent-Type: text/cloud-config; charset="us-ascii"\n\n#cloud-config\npackages: [squid]\n\n'
        b'--==BOUNDARY==\nContent-Type: text/x-shellscript; charset="us-ascii"\n\n#!/bin/sh\necho hi\n\n'
        b'--==BOUNDARY==--\n')
USER_DATA = {"cloud-config": CLOUD_CONFIG, "jinja": JINJA, "shell": SHELL, "mime": MIME}


def read_iso(data: bytes) -> tuple[str, dict[str, bytes]]:
    """Return (volume label, {rock ridge name: bytes}) of an ISO image."""
    iso = pycdlib.PyCdlib()
    iso.open_fp(io.BytesIO(data))
    try:
        files = {}
        for child in iso.list_children(rr_path="/"):
            if child.is_file():
                name = child.rock_ridge.name().decode()
                buf = io.BytesIO()
                iso.get_file_from_iso_fp(buf, rr_path="/" + name)
                files[name] = buf.getvalue()
        # Joliet readers (and Windows) see the same names.
        joliet = {c.file_identifier().decode("utf-16_be").rstrip(";1") for c in iso.list_children(joliet_path="/")
                  if c.is_file()}
        assert joliet == set(files)
        return iso.pvd.volume_identifier.decode().strip(), files
    finally:
        iso.close()


@pytest.mark.parametrize("kind", sorted(USER_DATA))
def test_seed_uploaded_by_create_holds_user_data_byte_for_byte(kind, rig, make_provider, image, request_for):
    _, url, sha, _ = image()
    provider = make_provider(rig.entry(images={"tiny": {"url": url, "sha256": sha}}))
    req = request_for(user_data=USER_DATA[kind])
    inst = provider.create(req)

    label, files = read_iso((rig.daemon.pool_dir / f"{req.name}-seed.iso").read_bytes())

    assert label == "cidata"
    assert files["user-data"] == USER_DATA[kind]
    assert files["meta-data"] == f"instance-id: {req.name}\nlocal-hostname: {req.name}\n".encode()
    assert files["vendor-data"] == seed.GUEST_AGENT_SCRIPT
    provider.delete(inst.provider_id)


def test_vendor_data_is_the_guest_agent_script_by_default():
    vendor = seed.vendor_data(install_guest_agent=True, squid_conf=None, user_vendor_data=None)
    assert vendor == seed.GUEST_AGENT_SCRIPT
    assert vendor.startswith(b"#!/bin/sh\n")
    assert b"pkg_install qemu-guest-agent" in vendor
    assert b"systemctl enable --now qemu-guest-agent" in vendor


def test_guest_agent_and_squid_scripts_are_valid_sh():
    for script in (seed.GUEST_AGENT_SCRIPT, seed.squid_script("http_port 3128\n# 'quotes' and EOF\nEOF\n")):
        subprocess.run(["sh", "-n"], input=script, check=True)


def test_the_squid_script_loads_the_egress_rules_before_squid_restarts():
    rules = egress.nftables_rules(squid.SquidPolicy(denied_destinations=("10.0.0.0/8",)))
    script = seed.squid_script("http_port 3128\n", None, rules)
    subprocess.run(["sh", "-n"], input=script, check=True)
    text = script.decode()
    # The rules travel base64-encoded, exactly as app.squid.egress renders them (the text
    # tests/test_egress_nftables.py loads with the real nft), through the same install function.
    blob = text.split("echo '")[2].split("'", 1)[0]
    assert base64.b64decode(blob).decode() == rules
    assert egress.INSTALL_EGRESS_SH.strip() in text
    assert text.index("install_egress /run/proxy-operator-squid-egress.nft") < text.index("systemctl restart squid")
    failure = text.split("if ! install_egress", 1)[1].split("fi\n", 1)[0]
    assert "systemctl stop squid" in failure and "exit 1" in failure  # fail-closed
    # Without rules (configureSquid off, or an old request) the script is as before.
    assert "install_egress" not in seed.squid_script("http_port 3128\n").decode()


def test_user_vendor_data_travels_beside_the_script_as_mime():
    user = b"#cloud-config\nruncmd: [[touch, /tmp/x]]\n\xff binary-ish tail"
    vendor = seed.vendor_data(install_guest_agent=True, squid_conf="http_port 3128\n", user_vendor_data=user)

    msg = email.message_from_bytes(vendor)
    assert msg.get_content_type() == "multipart/mixed"
    parts = msg.get_payload()
    assert [p.get_content_type() for p in parts] == ["text/x-shellscript", "text/x-shellscript", "text/plain"]
    assert parts[0].get_payload(decode=True) == seed.GUEST_AGENT_SCRIPT
    squid = parts[1].get_payload(decode=True)
    blob = squid.split(b"echo '", 1)[1].split(b"'", 1)[0]
    assert base64.b64decode(blob) == b"http_port 3128\n"
    assert parts[2].get_payload(decode=True) == user, "the user's vendorData survives byte for byte"


def test_install_guest_agent_false():
    assert seed.vendor_data(install_guest_agent=False, squid_conf=None, user_vendor_data=None) is None
    user = b"#cloud-config\npackages: [htop]\n"
    assert seed.vendor_data(install_guest_agent=False, squid_conf=None, user_vendor_data=user) == user
    _, files = read_iso(seed.build_seed("proxy-x", b"", None))
    assert set(files) == {"user-data", "meta-data"}


def test_no_user_data_gives_an_empty_user_data_file():
    _, files = read_iso(seed.build_seed("proxy-x", None, b"#!/bin/sh\n"))
    assert files["user-data"] == b"" and files["vendor-data"] == b"#!/bin/sh\n"


def test_config_switches_reach_the_seed(rig, make_provider, image, request_for):
    _, url, sha, _ = image()
    provider = make_provider(rig.entry(images={"tiny": {"url": url, "sha256": sha}},
                                       installGuestAgent=False, configureSquid=True))
    req = request_for(user_data=CLOUD_CONFIG, vendor_data=b"#cloud-config\n{}\n", squid_config="http_port 3128\n")
    inst = provider.create(req)
    _, files = read_iso((rig.daemon.pool_dir / f"{req.name}-seed.iso").read_bytes())
    parts = email.message_from_bytes(files["vendor-data"]).get_payload()
    assert [p.get_filename() for p in parts] == ["proxy-operator-squid.sh", "vendor-data"]
    assert parts[1].get_payload(decode=True) == b"#cloud-config\n{}\n"
    provider.delete(inst.provider_id)
