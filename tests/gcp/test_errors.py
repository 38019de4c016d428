"""Error classification from each place the SDK reports one: the HTTP call, and the operation."""

from __future__ import annotations

import socket

import pytest
from google.api_core import exceptions as gexc

from app.providers.naming import MANAGED_BY, instance_name, tags_for
from app.providers.base import CreateRequest
from app.errors import NotFound, Permanent, QuotaExceeded, Transient, describe
from app.config.validation import ConfigError
from tests.gcp.conftest import PROJECT, gcp_config, write_service_account_key

ZONE = "europe-west1-b"
PID = f"projects/{PROJECT}/zones/{ZONE}/instances/proxy-err"


def _create_request(uid: str = "uid-err") -> CreateRequest:
    return CreateRequest(name=instance_name(uid), tags=tags_for(uid), namespace="crawl", zone=ZONE,
                         user_data=b"#cloud-config\n")


# (status, reason, expected class) for an HTTP error on any call.
HTTP_CASES = [
    (403, "QUOTA_EXCEEDED", QuotaExceeded),
    (403, "rateLimitExceeded", QuotaExceeded),
    (429, "RATE_LIMIT_EXCEEDED", QuotaExceeded),
    (429, None, QuotaExceeded),
    (500, None, Transient),
    (503, "backendError", Transient),
    (400, "invalid", Permanent),
    (403, "forbidden", Permanent),
    (400, "resourceNotReady", Transient),
]


def _call(provider, place: str):
    """Run the provider operation that makes the HTTP call ``place``."""
    if place in ("insert", "insert-wait"):
        return provider.create(_create_request())
    if place == "get":
        return provider.get(PID)
    if place in ("delete", "delete-wait"):
        return provider.delete(PID)
    if place == "aggregatedList":
        return provider.list_by_tag(MANAGED_BY)
    raise AssertionError(place)


PLACES = {
    "insert": ("POST", r"/zones/[^/]+/instances$"),
    "insert-wait": ("POST", r"/operations/[^/]+-insert/wait$"),
    "get": ("GET", r"/instances/proxy-err$"),
    "delete": ("DELETE", r"/instances/proxy-err$"),
    "delete-wait": ("POST", r"/operations/[^/]+-delete/wait$"),
    "aggregatedList": ("GET", r"/aggregated/instances$"),
}


@pytest.mark.parametrize("place", list(PLACES))
@pytest.mark.parametrize("status, reason, expected", HTTP_CASES)
def test_http_error_is_classified_with_its_cause(fake, provider, place, status, reason, expected):
    fake.add_instance(PROJECT, ZONE, "proxy-err", tags_for("x"))
    method, path = PLACES[place]
    fake.fail(method, path, status, reason, f"injected {status} at {place}")
    with pytest.raises(expected) as info:
        _call(provider, place)
    cause = info.value.__cause__
    assert isinstance(cause, gexc.GoogleAPICallError) and cause.code == status
    assert f"injected {status} at {place}" in str(info.value)
    assert f"HTTP {status}" in describe(info.value)
    assert fake.calls(method, path), "the fault must have been served by the fake"


def test_http_quota_error_carries_the_error_info_reason(fake, provider):
    fake.fail("POST", r"/instances$", 403, "QUOTA_EXCEEDED", "Quota 'CPUS' exceeded.  Limit: 8.0 in region europe-west1.")
    with pytest.raises(QuotaExceeded) as info:
        provider.create(_create_request())
    assert isinstance(info.value.__cause__, gexc.Forbidden)
    assert info.value.__cause__.reason == "QUOTA_EXCEEDED"
    assert "Quota 'CPUS' exceeded" in str(info.value)
    assert not fake.calls("POST", r"/operations/")  # nothing to wait on


@pytest.mark.parametrize("place, expected", [("get", NotFound), ("aggregatedList", NotFound), ("insert", Permanent)])
def test_http_404_is_not_found_except_on_create(fake, provider, place, expected):
    fake.add_instance(PROJECT, ZONE, "proxy-err", tags_for("x"))
    method, path = PLACES[place]
    fake.fail(method, path, 404, "notFound", "The resource 'projects/demo-project/global/images/nope' was not found")
    with pytest.raises(expected) as info:
        _call(provider, place)
    assert isinstance(info.value.__cause__, gexc.NotFound)


def test_http_404_on_delete_is_success(fake, provider):
    provider.delete(PID)  # nothing there at all
    fake.add_instance(PROJECT, ZONE, "proxy-err", tags_for("x"))
    fake.fail("POST", r"/operations/[^/]+-delete/wait$", 404, "notFound")
    provider.delete(PID)  # the operation vanished with the instance: still success


# (operation kind, httpErrorStatusCode, error code, expected class) for an operation that
# finishes with an error.
OP_CASES = [
    (403, "QUOTA_EXCEEDED", QuotaExceeded),
    (503, "ZONE_RESOURCE_POOL_EXHAUSTED", QuotaExceeded),
    (400, "INVALID_FIELD_VALUE", Permanent),
    (403, "PERMISSIONS_ERROR", Permanent),
    (500, "INTERNAL_ERROR", Transient),
    (409, "RESOURCE_IN_USE_BY_ANOTHER_RESOURCE", Transient),
    (0, "UNKNOWN_ERROR", Transient),
]


@pytest.mark.parametrize("status, code, expected", OP_CASES)
def test_insert_operation_error_is_classified_with_its_cause(fake, provider, status, code, expected):
    fake.fail_operation("insert", status, code, f"operation failed with {code}")
    with pytest.raises(expected) as info:
        provider.create(_create_request())
    cause = info.value.__cause__
    assert isinstance(cause, gexc.GoogleAPICallError)
    assert [e.code for e in cause.errors] == [code]
    if status:
        assert cause.code == status
        assert cause.reason is None  # how the SDK reports an operation error (ENVIRONMENT.md)
    assert code in str(info.value)
    assert fake.calls("POST", r"/operations/[^/]+-insert/wait$")  # the error came from the waited operation
    assert not fake.instances  # the failed insert left nothing behind


def test_operation_quota_error_is_quota_exceeded_like_the_sdk_reports_it(fake, provider):
    fake.fail_operation("insert", 403, "QUOTA_EXCEEDED", "Quota 'IN_USE_ADDRESSES' exceeded. Limit: 4.0 in region europe-west1.")
    with pytest.raises(QuotaExceeded) as info:
        provider.create(_create_request())
    cause = info.value.__cause__
    assert isinstance(cause, gexc.Forbidden) and cause.reason is None
    assert cause.errors[0].code == "QUOTA_EXCEEDED"
    assert "IN_USE_ADDRESSES" in describe(info.value)


@pytest.mark.parametrize("status, code, expected", [(403, "QUOTA_EXCEEDED", QuotaExceeded),
                                                    (500, "INTERNAL_ERROR", Transient),
                                                    (400, "RESOURCE_NOT_READY", Transient),
                                                    (400, "INVALID_USAGE", Permanent)])
def test_delete_operation_error_is_classified(fake, provider, status, code, expected):
    fake.add_instance(PROJECT, ZONE, "proxy-err", tags_for("x"))
    fake.fail_operation("delete", status, code)
    with pytest.raises(expected) as info:
        provider.delete(PID)
    assert [e.code for e in info.value.__cause__.errors] == [code]


def test_delete_operation_not_found_is_success(fake, provider):
    fake.add_instance(PROJECT, ZONE, "proxy-err", tags_for("x"))
    fake.fail_operation("delete", 404, "RESOURCE_NOT_FOUND")
    provider.delete(PID)


def test_insert_operation_already_exists_returns_the_instance(fake, provider):
    """A concurrent create won the race: our insert's operation reports 409, the instance exists."""
    req = _create_request("uid-race")
    fake.fail_operation("insert", 409, "RESOURCE_ALREADY_EXISTS", undo=False)
    inst = provider.create(req)
    assert inst.name == req.name and inst.provider_id.endswith(f"/zones/{ZONE}/instances/{req.name}")
    assert fake.calls("GET", rf"/instances/{req.name}$")


def test_http_401_is_permanent(fake, provider):
    fake.fail("GET", r"/instances/proxy-err$", 401, "authError", "Request had invalid authentication credentials.")
    with pytest.raises(Permanent) as info:
        provider.get(PID)
    # Anonymous credentials cannot be refreshed after a 401; google-auth says so.
    assert info.value.__cause__ is not None


def test_request_timeout_is_transient(fake, make_provider):
    provider = make_provider(requestTimeout=1)
    fake.fail("GET", r"/instances/proxy-err$", 0, delay=2.5)
    with pytest.raises(Transient) as info:
        provider.get(PID)
    assert "Timeout" in type(info.value.__cause__).__name__


def test_connection_refused_is_transient(fake):
    from app.providers.gcp.provider import GcpProvider

    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    pc = gcp_config(fake, apiEndpoint=f"http://127.0.0.1:{port}")
    with pytest.raises(Transient) as info:
        GcpProvider(pc).get(PID)
    assert "ConnectionError" in describe(info.value)


def test_operation_that_never_finishes_is_transient(fake, make_provider):
    fake.op_polls = 10_000
    provider = make_provider(operationTimeout=1)
    with pytest.raises(Transient) as info:
        provider.create(_create_request())
    assert "still RUNNING after 1s" in str(info.value)


@pytest.mark.parametrize("bad", ["proxy-err", "projects/p/zones/z/instances", "projects/demo-project/zones/Z/instances/x",
                                 "projects/demo-project/zones/europe-west1-b/instances/a/b"])
def test_malformed_provider_id_is_permanent(fake, provider, bad):
    with pytest.raises(Permanent):
        provider.get(bad)
    with pytest.raises(Permanent):
        provider.delete(bad)
    assert fake.requests == []


def test_a_config_without_zones_is_refused_and_an_unlisted_zone_is_permanent(fake, make_provider):
    with pytest.raises(ConfigError, match=r'provider "gcp-test": gcp.zones: must list at least one zone'):
        make_provider(zones=[])
    provider = make_provider()
    req = CreateRequest(name=instance_name("u"), tags=tags_for("u"), namespace="crawl", zone="eu/west")
    with pytest.raises(Permanent, match="^spec.placement.zone: 'eu/west' is not allowed"):
        provider.create(req)
    assert fake.requests == []


def test_user_data_that_is_not_utf8_is_permanent(fake, provider):
    req = CreateRequest(name=instance_name("u"), tags=tags_for("u"), namespace="crawl", zone=ZONE,
                        user_data=b"\xff\xfe binary")
    with pytest.raises(Permanent, match="not UTF-8"):
        provider.create(req)
    assert fake.requests == []


def test_missing_credentials_file_is_transient_and_heals(fake, tmp_path):
    """A Secret mounted after start heals without a restart (the KVM lesson, applied here)."""
    from app.providers.gcp.provider import GcpProvider

    key = tmp_path / "key.json"
    provider = GcpProvider(gcp_config(fake, anonymous=False, credentialsFile=str(key)))
    with pytest.raises(Transient, match="does not exist"):
        provider.get(PID)
    key.write_text("{not json")
    with pytest.raises(Permanent, match="not usable"):
        provider.get(PID)
    write_service_account_key(key, fake)
    fake.add_instance(PROJECT, ZONE, "proxy-err", tags_for("x"))
    assert provider.get(PID).name == "proxy-err"
    [call] = fake.calls("GET", r"/instances/proxy-err$")
    # The key signed a bearer token (google-auth uses a self-signed JWT for the compute
    # audience, or trades an assertion at the key's token_uri, which is the fake).
    assert call.headers.get("authorization", "").startswith("Bearer ")
