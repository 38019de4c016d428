"""Wire logging of the aws provider: on demand, redacted; botocore's own records never get out."""

from __future__ import annotations

import base64
import logging

import pytest

from app.providers.aws import wire
from app.providers.base import CreateRequest
from app.providers.naming import instance_name, tags_for
from tests.aws.conftest import ACCESS_KEY, SECRET_KEY

USER_DATA = b"#cloud-config\nruncmd: [echo user-data-marker-91c4]\n"
HTPASSWD = "crawler:$2b$10$secret-htpasswd-marker"


def _request(uid: str) -> CreateRequest:
    return CreateRequest(name=instance_name(uid), tags=tags_for(uid), namespace="crawl", user_data=USER_DATA,
                         squid_config="http_port 3128\n", egress_rules="table inet t {}\n", auth_htpasswd=HTPASSWD)


class _Root(logging.Handler):
    """What an operator's handler on the root logger receives (pytest's caplog also listens on
    loggers that do not propagate, so it would see records no real handler gets)."""

    def __init__(self) -> None:
        super().__init__(level=logging.DEBUG)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


@pytest.fixture()
def root(caplog):
    caplog.set_level(logging.DEBUG)  # everything, botocore's DEBUG included, as a careless operator would
    handler = _Root()
    logging.getLogger().addHandler(handler)
    yield handler
    logging.getLogger().removeHandler(handler)


def _everything(root) -> str:
    return "\n".join(f"{r.name} {r.getMessage()} {getattr(r, 'aws_wire', '')}" for r in root.records)


def _assert_no_secret(text: str) -> None:
    for secret in (SECRET_KEY, ACCESS_KEY, "user-data-marker-91c4", "secret-htpasswd-marker",
                   base64.b64encode(HTPASSWD.encode()).decode()[:24], "Signature="):
        assert secret not in text, secret


def test_wire_logging_shows_calls_redacted(moto, make_provider, root):
    provider = make_provider(wireLogging={"enabled": True})
    provider.create(_request("0d000000-0000-4000-8000-000000000001"))
    wire_records = [r for r in root.records if r.name == wire.WIRE_LOGGER]
    requests = [r.aws_wire for r in wire_records if r.aws_wire["direction"] == "request"]
    run = next(e for e in requests if e["operation"] == "RunInstances")
    assert run["params"]["UserData"] == wire.REDACTED
    assert run["params"]["InstanceType"] == "t3.micro"
    assert any(r.aws_wire["direction"] == "response" and r.aws_wire["status"] == 200 for r in wire_records)
    assert not [r for r in root.records if r.name.startswith(("botocore", "boto3", "urllib3"))]
    _assert_no_secret(_everything(root))


def test_wire_logging_is_off_by_default(moto, provider, root):
    provider.create(_request("0d000000-0000-4000-8000-000000000002"))
    assert not [r for r in root.records if r.name == wire.WIRE_LOGGER]
    assert any(r.name == "proxy_operator.aws" for r in root.records)  # our own lines are there
    assert not [r for r in root.records if r.name.startswith(("botocore", "boto3", "urllib3"))]
    _assert_no_secret(_everything(root))


def test_redact_removes_keys_tokens_and_signatures():
    out = wire.redact({"UserData": "I2Nsb3VkLWNvbmZpZw==", "Credentials": {"SecretAccessKey": "x"},
                       "note": f"Authorization: AWS4-HMAC-SHA256 Credential={ACCESS_KEY}/x, Signature=abc123",
                       "long": "a" * 2000})
    assert out["UserData"] == wire.REDACTED and out["Credentials"] == wire.REDACTED
    assert "abc123" not in out["note"] and ACCESS_KEY not in out["note"]
    assert out["long"] == "<elided 2000 bytes>"
