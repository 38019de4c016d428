"""Bearer tokens: the tokens file, 401s, open routes."""

from __future__ import annotations

import hashlib
import logging
import os
import time

import pytest

from api import create_app
from api.settings import ApiSettings
from api import tokens
from app.config.validation import ConfigError
from tests.api.helpers import TOKEN_A, TOKEN_B, TOKEN_C, auth


def test_v1_routes_need_a_valid_bearer_token(client):
    for method, path in (("get", "/v1/proxies"), ("post", "/v1/leases"),
                         ("post", "/v1/leases/" + "a" * 32 + "/renew"), ("delete", "/v1/leases/" + "a" * 32)):
        for headers in ({}, {"Authorization": "Bearer "}, {"Authorization": f"Basic {TOKEN_A}"},
                        auth("not-a-valid-token-at-all"), auth(TOKEN_A + "x")):
            resp = getattr(client, method)(path, headers=headers)
            assert resp.status_code == 401, (method, path, headers)
            assert resp.get_json()["error"] == "unauthorized"
            assert resp.headers["WWW-Authenticate"].startswith("Bearer")


def test_each_token_names_its_client_including_sha256_entries(client):
    for token in (TOKEN_A, TOKEN_B, TOKEN_C):
        assert client.get("/v1/proxies", headers=auth(token)).status_code == 200


def test_open_routes(client):
    assert client.get("/healthz").get_json() == {"status": "ok"}
    assert client.get("/openapi.json").get_json()["openapi"].startswith("3.")
    body = client.get("/metrics").get_data(as_text=True)
    assert "proxy_operator_leases_active" in body


def test_unknown_route_and_wrong_method_are_json(client):
    resp = client.get("/v2/nothing", headers=auth())
    assert resp.status_code == 404 and resp.get_json()["error"] == "not_found"
    resp = client.put("/v1/leases", headers=auth())
    assert resp.status_code == 405 and resp.get_json()["error"] == "method_not_allowed"
    assert "POST" in resp.headers["Allow"]


def test_tokens_never_reach_the_logs(client, caplog):
    caplog.set_level(logging.DEBUG)
    client.get("/v1/proxies", headers=auth())
    client.get("/v1/proxies", headers=auth("wrong-token-value-123456"))
    assert TOKEN_A not in caplog.text and "wrong-token-value-123456" not in caplog.text


def test_the_api_refuses_to_start_without_tokens(redis_url):
    with pytest.raises(ConfigError, match="API_TOKENS_FILE"):
        create_app(ApiSettings(redis_url=redis_url, tokens_file=None))


@pytest.mark.parametrize("text,field,problem", [
    ("", "clients", "required"),
    ("clients: []", "clients", "at least one"),
    ("clients: {}", "clients", "must be a list"),
    ("- a", None, "must be a mapping"),
    ("clients:\n  - name: a\n", "clients[0]", "exactly one of token or tokenSHA256"),
    ("clients:\n  - name: a\n    token: short\n", "clients[0].token", "too short"),
    ("clients:\n  - name: a\n    token: 12345\n", "clients[0].token", "must be a string"),
    ("clients:\n  - name: a\n    tokenSHA256: abc\n", "clients[0].tokenSHA256", "64 hexadecimal"),
    ("clients:\n  - name: a\n    token: aaaaaaaaaaaaaaaaaaaa\n    tokenSHA256: " + "0" * 64 + "\n",
     "clients[0]", "exactly one"),
    ("clients:\n  - token: aaaaaaaaaaaaaaaaaaaa\n", "clients[0].name", "required"),
    ("clients:\n  - name: 'bad name'\n    token: aaaaaaaaaaaaaaaaaaaa\n", "clients[0].name", "not a valid"),
    ("clients:\n  - name: a\n    token: aaaaaaaaaaaaaaaaaaaa\n    role: admin\n", "clients[0].role", "unknown key"),
    ("clients:\n  - name: a\n    token: aaaaaaaaaaaaaaaaaaaa\n  - name: a\n    token: bbbbbbbbbbbbbbbbbbbb\n",
     "clients[1].name", "duplicate"),
    ("clients:\n  - name: a\n    token: aaaaaaaaaaaaaaaaaaaa\n  - name: b\n    tokenSHA256: "
     + hashlib.sha256(b"aaaaaaaaaaaaaaaaaaaa").hexdigest() + "\n", "clients[1].tokenSHA256", "same token"),
    ("clients: [\n", None, "not valid YAML at line"),
    ("clients:\n  - name: a\n    token: aaaaaaaaaaaaaaaaaaaa\nextra: 1\n", "extra", "unknown key"),
])
def test_tokens_file_errors_name_the_file_and_field(tmp_path, text, field, problem):
    path = tmp_path / "tokens.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError) as info:
        tokens.load(str(path))
    err = info.value
    assert err.file == str(path)
    assert err.field == field
    assert problem in str(err)
    assert "aaaaaaaaaaaaaaaaaaaa" not in str(err) and "bbbbbbbbbbbbbbbbbbbb" not in str(err)


def test_missing_tokens_file(tmp_path):
    with pytest.raises(ConfigError, match="cannot read tokens file"):
        tokens.load(str(tmp_path / "absent.yaml"))


def test_authenticate_compares_every_client():
    clients = tokens.parse({"clients": [{"name": "a", "token": "a" * 20}, {"name": "b", "token": "b" * 20}]}, "f")
    assert tokens.authenticate(clients, "a" * 20).name == "a"
    assert tokens.authenticate(clients, "b" * 20).name == "b"
    assert tokens.authenticate(clients, "c" * 20) is None
    assert tokens.authenticate(clients, "") is None and tokens.authenticate(clients, None) is None
    assert "aaaa" not in repr(clients)


def test_a_rotated_tokens_file_is_picked_up_and_a_broken_one_ignored(tmp_path):
    path = tmp_path / "tokens.yaml"
    path.write_text("clients:\n  - name: a\n    token: first-token-aaaaaaaa\n")
    store = tokens.TokenStore(str(path), check_every=0)
    assert store.authenticate("first-token-aaaaaaaa").name == "a"
    path.write_text("clients:\n  - name: a\n    token: second-token-bbbbbbb\n")
    os.utime(path, (time.time() + 5, time.time() + 5))
    assert store.authenticate("first-token-aaaaaaaa") is None
    assert store.authenticate("second-token-bbbbbbb").name == "a"
    path.write_text("clients: [\n")
    os.utime(path, (time.time() + 10, time.time() + 10))
    assert store.authenticate("second-token-bbbbbbb").name == "a"  # kept the last good file
