"""The kvm-ssh Secret helper: the manifest carries the files; a .pub is refused."""

from __future__ import annotations

import argparse
import base64
import io

import pytest
import yaml

from app.providers.kvm import secret_helper
from tests.kvm.harness import known_hosts_line, make_keys


@pytest.fixture(scope="module")
def keys(tmp_path_factory):
    return make_keys(tmp_path_factory.mktemp("keys"))


@pytest.fixture
def known_hosts(tmp_path, keys):
    path = tmp_path / "kvm_known_hosts"
    path.write_text(known_hosts_line("lab1.example.internal", 22, keys.host_pub))
    return path


def test_manifest_holds_key_and_known_hosts(keys, known_hosts):
    doc = yaml.safe_load(secret_helper.render(keys.client_key, known_hosts))
    assert doc["kind"] == "Secret" and doc["metadata"]["name"] == "kvm-ssh"
    assert doc["metadata"]["namespace"] == "proxy-operator"
    assert base64.b64decode(doc["data"]["id_ed25519"]) == keys.client_key.read_bytes()
    assert base64.b64decode(doc["data"]["known_hosts"]) == known_hosts.read_bytes()


def test_refuses_a_pub_file_and_public_key_contents(keys, known_hosts, tmp_path):
    with pytest.raises(secret_helper.SecretInputError, match=r"public key \(.pub\)"):
        secret_helper.secret_manifest(keys.client_pub, known_hosts)
    disguised = tmp_path / "id_ed25519"
    disguised.write_bytes(keys.client_pub.read_bytes())
    with pytest.raises(secret_helper.SecretInputError, match="holds a public key"):
        secret_helper.secret_manifest(disguised, known_hosts)


def test_refuses_empty_known_hosts_and_garbage_key(keys, tmp_path, known_hosts):
    empty = tmp_path / "empty"
    empty.write_text("# nothing\n")
    with pytest.raises(secret_helper.SecretInputError, match="no host entries"):
        secret_helper.secret_manifest(keys.client_key, empty)
    garbage = tmp_path / "garbage"
    garbage.write_text("hello\n")
    with pytest.raises(secret_helper.SecretInputError, match="not a private key"):
        secret_helper.secret_manifest(garbage, known_hosts)


def test_cli_exit_codes(keys, known_hosts):
    parser = argparse.ArgumentParser()
    secret_helper.add_arguments(parser)
    out, err = io.StringIO(), io.StringIO()
    assert secret_helper.run(parser.parse_args(["--key", str(keys.client_pub), "--known-hosts", str(known_hosts)]),
                             out, err) == 2
    assert str(keys.client_pub) in err.getvalue() and out.getvalue() == ""
    out = io.StringIO()
    assert secret_helper.run(parser.parse_args(["--key", str(keys.client_key), "--known-hosts", str(known_hosts),
                                                "--namespace", "ops"]), out, err) == 0
    assert yaml.safe_load(out.getvalue())["metadata"]["namespace"] == "ops"
