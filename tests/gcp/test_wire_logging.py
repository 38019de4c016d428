"""Wire logging: on demand, allow-listed to the compute API, with user-data, tokens and JWTs removed."""

from __future__ import annotations

import json
import logging
import re

import pytest

from app.providers.naming import MANAGED_BY, instance_name, tags_for
from app.providers.base import CreateRequest
from app.errors import QuotaExceeded
from app.providers.gcp import wire
from tests.gcp.conftest import write_service_account_key

MARKER = "user-data-marker-5b9c"
HTPASSWD = "crawler:$2b$10$htpasswdmarkerhtpasswdmarkerhtpas"
USER_DATA = f"#cloud-config\nwrite_files:\n  - path: /etc/secret\n    content: {MARKER}\n".encode()
JWT_RE = re.compile(r"eyJ[A-Za-z0-9_-]{2,}\.")


@pytest.fixture(autouse=True)
def wire_off_afterwards():
    """Wire logging is process-wide: switch it off after each test."""
    yield
    wire.disable()


def _everything(caplog) -> str:
    """Every captured record, formatted and with all its attributes (what any formatter could print)."""
    parts = []
    for rec in caplog.records:
        parts.append(rec.getMessage())
        parts.append(repr(vars(rec)))
    return "\n".join(parts)


def _request(uid: str, **kw) -> CreateRequest:
    kw.setdefault("auth_htpasswd", HTPASSWD)
    return CreateRequest(name=instance_name(uid), tags=tags_for(uid), namespace="crawl", zone="europe-west1-b",
                         user_data=USER_DATA, **kw)


def test_most_verbose_capture_has_records_but_no_user_data_token_or_jwt(fake, make_provider, tmp_path, caplog):
    key = tmp_path / "key.json"
    write_service_account_key(key, fake)
    caplog.set_level(logging.DEBUG)  # the most verbose level, for every logger
    provider = make_provider(anonymous=False, credentialsFile=str(key), wireLogging={"enabled": True})

    inst = provider.create(_request("uid-wire-1"))
    provider.get(inst.provider_id)
    provider.list_by_tag(MANAGED_BY)
    fake.fail("POST", r"/instances$", 403, "QUOTA_EXCEEDED", "Quota 'CPUS' exceeded.")
    with pytest.raises(QuotaExceeded):
        provider.create(_request("uid-wire-2"))
    fake.fail_operation("insert", 403, "QUOTA_EXCEEDED", "Quota 'CPUS' exceeded in operation.")
    with pytest.raises(QuotaExceeded):
        provider.create(_request("uid-wire-3"))
    provider.delete(inst.provider_id)

    # The SDK's request/response records appear, sanitized, on the wire logger.
    wire_records = [r for r in caplog.records if r.name == wire.WIRE_LOGGER and r.levelno == logging.DEBUG]
    entries = [r.gcp_wire for r in wire_records]
    rpcs = {(e["service"], e["rpc"], e["direction"]) for e in entries}
    assert ("google.cloud.compute.v1.Instances", "Insert", "request") in rpcs
    assert ("google.cloud.compute.v1.Instances", "Insert", "response") in rpcs
    assert ("google.cloud.compute.v1.ZoneOperations", "Wait", "request") in rpcs
    assert ("google.cloud.compute.v1.Instances", "AggregatedList", "request") in rpcs
    insert = next(e for e in entries if e["rpc"] == "Insert" and e["direction"] == "request")
    assert insert["url"].startswith(fake.url + "/compute/v1/projects/")
    resource = insert["payload"]["instanceResource"]
    assert resource["labels"] == tags_for("uid-wire-1")
    assert resource["machineType"] == "zones/europe-west1-b/machineTypes/e2-micro"
    assert {"key": "user-data", "value": wire.REDACTED} in resource["metadata"]["items"]

    # The fake really received user-data and bearer tokens that are JWTs ...
    bearers = {r.headers["authorization"].split(" ", 1)[1] for r in fake.requests if "authorization" in r.headers}
    assert bearers and all(JWT_RE.match(b) for b in bearers)
    assert any(MARKER in json.dumps(r.body) for r in fake.calls("POST", r"/instances$"))
    # ... and none of it reached any log record, in any attribute.
    logged = _everything(caplog)
    assert MARKER not in logged
    assert "#cloud-config" not in logged
    assert "htpasswdmarker" not in logged
    for token in bearers | set(fake.tokens_issued) | set(fake.assertions):
        assert token not in logged
        assert token.split(".")[0] not in logged  # not even the JWT header segment
    assert not JWT_RE.search(logged)
    assert not re.search(r"(?i)bearer\s+(?!<redacted>)\S", logged)


def test_wire_records_need_the_opt_in(fake, provider, caplog):
    caplog.set_level(logging.DEBUG)
    provider.create(_request("uid-wire-off"))
    assert not [r for r in caplog.records if r.name == wire.WIRE_LOGGER]
    assert MARKER not in _everything(caplog)
    assert logging.getLogger("google.cloud.compute_v1").getEffectiveLevel() > logging.DEBUG


def test_wire_records_need_the_most_verbose_level(fake, make_provider, caplog):
    caplog.set_level(logging.INFO)
    make_provider(wireLogging={"enabled": True}).create(_request("uid-wire-info"))
    assert not [r for r in caplog.records if r.name == wire.WIRE_LOGGER and r.levelno == logging.DEBUG]
    assert logging.getLogger("google.cloud.compute_v1").getEffectiveLevel() > logging.DEBUG


def test_environment_switches_wire_logging_on(fake, provider, caplog, monkeypatch):
    monkeypatch.setenv(wire.ENV_ENABLE, "1")
    caplog.set_level(logging.DEBUG)
    provider.create(_request("uid-wire-env"))
    assert [r for r in caplog.records if r.name == wire.WIRE_LOGGER and r.levelno == logging.DEBUG]
    assert MARKER not in _everything(caplog)


def test_long_strings_are_elided_unless_full_payloads(fake, make_provider, caplog):
    squid = "# squid.conf\n" + "acl allowed_src src 10.0.0.0/8\n" * 60  # > 1 KiB
    caplog.set_level(logging.DEBUG)
    make_provider(wireLogging={"enabled": True}).create(_request("uid-wire-short", squid_config=squid))
    items = _insert_items(caplog)
    assert items["squid-conf"] == f"<elided {len(squid.encode())} bytes>"
    assert items["user-data"] == wire.REDACTED

    wire.disable()
    caplog.clear()
    make_provider(wireLogging={"enabled": True, "fullPayloads": True}).create(_request("uid-wire-full", squid_config=squid))
    items = _insert_items(caplog)
    assert items["squid-conf"] == squid
    assert items["user-data"] == wire.REDACTED  # full payloads never include user-data
    assert MARKER not in _everything(caplog)


def _insert_items(caplog) -> dict[str, str]:
    [entry] = [r.gcp_wire for r in caplog.records
               if r.name == wire.WIRE_LOGGER and getattr(r, "gcp_wire", {}).get("rpc") == "Insert"
               and r.gcp_wire["direction"] == "request"]
    return {i["key"]: i["value"] for i in entry["payload"]["instanceResource"]["metadata"]["items"]}


def test_other_google_loggers_are_dropped_and_warnings_scrubbed(fake, make_provider, caplog):
    caplog.set_level(logging.DEBUG)
    make_provider(wireLogging={"enabled": True})  # imports the SDK; dials nothing
    wire.configure(enabled=True, full_payloads=False, api_endpoint=fake.url)
    jwt = "eyJhbGciOiJSUzI1NiJ9.eyJpc3MiOiJ4In0.c2lnbmF0dXJl"
    auth = logging.getLogger("google.auth.transport.requests")
    auth.debug("Making request...", extra={"httpRequest": {"method": "POST", "url": "https://oauth2.googleapis.com/token",
                                                           "body": {"assertion": jwt}}})
    logging.getLogger("google.cloud.compute_v1.services.instances.client").debug(
        "Created client", extra={"credentialsInfo": {"client_email": "x@y"}})
    auth.warning("refresh failed for Bearer ya29.secret-token with assertion %s", jwt)
    logged = _everything(caplog)
    assert "Making request" not in logged and "Created client" not in logged
    assert jwt not in logged and "ya29.secret-token" not in logged
    [warning] = [r for r in caplog.records if r.name == wire.SDK_LOGGER]
    assert warning.levelno == logging.WARNING and "refresh failed" in warning.getMessage()


def test_records_for_another_host_are_dropped(fake, caplog):
    import app.providers.gcp.provider  # noqa: F401 - importing the SDK creates its loggers

    caplog.set_level(logging.DEBUG)
    wire.configure(enabled=True, full_payloads=False, api_endpoint=fake.url)
    transport = logging.getLogger("google.cloud.compute_v1.services.instances.transports.rest")
    for url in ("https://evil.example/compute/v1/projects/p", fake.url.replace("127.0.0.1", "127.0.0.2") + "/x",
                fake.url + "/compute/v1/projects/p/zones/z/instances"):
        transport.debug("Sending request", extra={"rpcName": "Get", "serviceName": "s",
                                                  "httpRequest": {"requestUrl": url, "requestMethod": "GET",
                                                                  "headers": {"authorization": "Bearer abc"}}})
    entries = [r.gcp_wire for r in caplog.records if r.name == wire.WIRE_LOGGER and hasattr(r, "gcp_wire")]
    assert [e["url"] for e in entries] == [fake.url + "/compute/v1/projects/p/zones/z/instances"]
    assert entries[0]["headers"] == {"authorization": wire.REDACTED}


def test_sdk_logging_scope_env_is_removed(fake, provider, monkeypatch):
    monkeypatch.setenv(wire.SDK_SCOPE_ENV, "google.cloud.compute_v1")
    wire.bridge()
    import os
    assert wire.SDK_SCOPE_ENV not in os.environ


@pytest.mark.parametrize("payload, expected", [
    ({"metadata": {"items": [{"key": "user-data", "value": "#cloud-config"}, {"key": "k", "value": "v"}]}},
     {"metadata": {"items": [{"key": "user-data", "value": "<redacted>"}, {"key": "k", "value": "v"}]}}),
    ({"access_token": "ya29.x", "nested": [{"assertion": "a.b.c"}]},
     {"access_token": "<redacted>", "nested": [{"assertion": "<redacted>"}]}),
    ({"msg": "token eyJhbGciOi.eyJzdWIiOi.sig and Bearer abc.def"},
     {"msg": "token <redacted-jwt> and Bearer <redacted>"}),
    ({"big": "x" * 1025, "small": "x" * 1024}, {"big": "<elided 1025 bytes>", "small": "x" * 1024}),
])
def test_redact(payload, expected):
    assert wire.redact(payload) == expected
    assert wire.sanitize_payload(json.dumps(payload)) == expected


def test_redact_full_payloads_keeps_long_strings_but_not_secrets():
    payload = {"big": "x" * 5000, "items": [{"key": "startup-script", "value": "echo hi"}], "userData": "u"}
    assert wire.redact(payload, full_payloads=True) == {
        "big": "x" * 5000, "items": [{"key": "startup-script", "value": "<redacted>"}], "userData": "<redacted>"}
