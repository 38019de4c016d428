"""The proxies' own policy (app/squid/conf.py): config block, credentials, Secret, rendered rules."""

from __future__ import annotations

import base64
import subprocess

import pytest

from app.squid import conf as squid_conf
from app.config.validation import ConfigError, Reader


def policy(block) -> squid_conf.SquidPolicy:
    return squid_conf.parse_policy(Reader(block, "providers.yaml", "kvm-lab", "squid"))


def test_defaults_and_a_full_block():
    assert policy({}) == squid_conf.SquidPolicy()
    p = policy({"allowedSourceRanges": ["10.1.0.0/16"], "connectPorts": [443, 8443], "basicAuth": True})
    assert p.allowed_ranges == ("10.1.0.0/16",) and p.connect_ports == (443, 8443)
    assert p.basic_auth_file == squid_conf.DEFAULT_HTPASSWD_PATH
    conf = squid_conf.render(3128, p)
    assert "acl allowed_src src 10.1.0.0/16" in conf and "acl connect_ports port 443 8443" in conf
    assert f"basic_ncsa_auth {squid_conf.DEFAULT_HTPASSWD_PATH}" in conf
    assert "request_header_access Proxy-Authorization deny all" in conf
    # source ranges are checked before authentication: outsiders get 403, not a 407 challenge
    assert conf.index("http_access deny !allowed_src") < conf.index("http_access deny !authenticated")
    # destination defaults: plain HTTP to 80/443 only; loopback, link-local and metadata denied
    assert p.http_ports == (80, 443) and "acl http_ports port 80 443" in conf
    assert "acl denied_dst dst 127.0.0.0/8 0.0.0.0/8 169.254.0.0/16 ::1/128 ::/128 fe80::/10" in conf
    assert "http_access deny denied_dst" in conf and "allowed_dst" not in conf
    # the address rules resolve names: after authentication, so outsiders cannot make Squid resolve
    assert conf.index("http_access deny !authenticated") < conf.index("http_access deny denied_dst")


def test_destination_keys():
    p = policy({"httpPorts": [80, "8000-8099"], "deniedDestinations": ["10.96.0.0/12", "fd00::/8"],
                "allowedDestinations": ["127.0.0.1/32"]})
    assert p.http_ports == (80, "8000-8099")
    assert p.denied_destinations == ("10.96.0.0/12", "fd00::/8") and p.allowed_destinations == ("127.0.0.1/32",)
    conf = squid_conf.render(3128, p)
    assert "acl http_ports port 80 8000-8099" in conf
    assert "fe80::/10 10.96.0.0/12 fd00::/8" in conf
    assert "acl allowed_dst dst 127.0.0.1/32" in conf and "http_access deny denied_dst !allowed_dst" in conf
    # metadata addresses and names are denied before (and regardless of) the exemptions
    assert conf.index("http_access deny metadata_dst") < conf.index("http_access deny denied_dst !allowed_dst")
    assert squid_conf.SquidPolicy(connect_ports=(443, "8443-8444")).connect_ports == (443, "8443-8444")
    with pytest.raises(ValueError):
        squid_conf.SquidPolicy(http_ports=("9-8",))


@pytest.mark.parametrize("block,field,problem", [
    ({"allowedSourceRanges": ["10.0.0.0/33"]}, "squid.allowedSourceRanges[0]", "not a CIDR"),
    ({"allowedSourceRanges": []}, "squid.allowedSourceRanges", "at least one"),
    ({"connectPorts": [0]}, "squid.connectPorts[0]", "1..65535"),
    ({"connectPorts": "443"}, "squid.connectPorts", "non-empty list"),
    ({"httpPorts": []}, "squid.httpPorts", "non-empty list"),
    ({"httpPorts": [80, "90-80"]}, "squid.httpPorts[1]", "low-high"),
    ({"httpPorts": [80, 70000]}, "squid.httpPorts[1]", "1..65535"),
    ({"deniedDestinations": ["10.0.0.0/8", "cluster"]}, "squid.deniedDestinations[1]", "not a CIDR"),
    ({"allowedDestinations": "127.0.0.1/32"}, "squid.allowedDestinations", "must be a list"),
    ({"basicAuth": "yes"}, "squid.basicAuth", "true or false"),
    ({"colour": "red"}, "squid.colour", "unknown key"),
])
def test_bad_blocks_name_the_field(block, field, problem):
    with pytest.raises(ConfigError) as info:
        policy(block)
    assert (info.value.file, info.value.provider, info.value.field) == ("providers.yaml", "kvm-lab", field)
    assert problem in str(info.value)


def test_generated_credentials_and_their_secret(tmp_path):
    user, password = squid_conf.generate_credentials()
    assert len(password) >= 32 and ":" not in password
    assert squid_conf.generate_credentials()[1] != password
    secret = squid_conf.credentials_secret("px-auth", "proxies", username=user, password=password)
    assert secret["kind"] == "Secret" and secret["metadata"]["namespace"] == "proxies"
    data = {k: base64.b64decode(v).decode() for k, v in secret["data"].items()}
    assert (data["username"], data["password"]) == (user, password)
    # the htpasswd line is what Squid's helper accepts for exactly these credentials
    path = tmp_path / "htpasswd"
    path.write_text(data["htpasswd"])
    out = subprocess.run(["/usr/lib/squid/basic_ncsa_auth", str(path)], input=f"{user} {password}\n{user} nope\n",
                         capture_output=True, text=True, timeout=10).stdout.splitlines()
    assert out[0].startswith("OK") and out[1].startswith("ERR")


def test_htpasswd_entry_rejects_bad_input():
    with pytest.raises(ValueError):
        squid_conf.htpasswd_entry("a:b", "pw")
    with pytest.raises(ValueError):
        squid_conf.htpasswd_entry("a", "x" * 73)
