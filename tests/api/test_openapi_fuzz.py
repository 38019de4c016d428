"""schemathesis against /openapi.json: no unexpected 5xx, no response outside the schema.

The API is fuzzed in process (WSGI) with positive and negative inputs, authenticated, with
healthy proxies (real Squids) behind it so leases are granted, renewed and released.  The
only 5xx the document allows is the lease route's 503 ``no_proxy_available`` (a filter that
matches nothing); any other 5xx fails, and every response is checked against its schema,
status code list and content type.
"""

from __future__ import annotations

import pytest
import schemathesis
from hypothesis import HealthCheck, Phase, assume, given, settings
from schemathesis import GenerationMode
from schemathesis.checks import (content_type_conformance, negative_data_rejection, response_schema_conformance,
                                 status_code_conformance)

from tests.api.helpers import TOKEN_A, healthy

pytestmark = [pytest.mark.timeout(600), pytest.mark.slow]


MAX_EXAMPLES = 40


@pytest.fixture()
def api_schema(app, fleet, api_squids, health_settings):
    healthy(fleet, api_squids, health_settings, count=5, max_leases=100_000)
    return schemathesis.openapi.from_wsgi("/openapi.json", app)


def no_unexpected_server_error(ctx, response, case):
    """Only the documented 503 of POST /v1/leases (no proxy fits) may be a 5xx."""
    if response.status_code < 500:
        return None
    try:
        body = response.json()
    except Exception:  # noqa: BLE001 - a non-JSON 5xx is a failure too
        body = {}
    allowed = (case.operation.method.upper(), case.operation.path, response.status_code,
               body.get("error")) == ("POST", "/v1/leases", 503, "no_proxy_available")
    assert allowed, f"unexpected {response.status_code} from {case.operation.label}: {body}"
    return None


CHECKS = [no_unexpected_server_error, status_code_conformance, content_type_conformance,
          response_schema_conformance, negative_data_rejection]


def _negative_in(case, location: str) -> bool:
    """Whether schemathesis made the ``location`` component (``"header"``, ``"query"``...) invalid."""
    components = getattr(getattr(case, "meta", None), "components", None) or {}
    return any(getattr(loc, "value", str(loc)) == location and info.mode is GenerationMode.NEGATIVE
               for loc, info in components.items())


@pytest.mark.parametrize("mode", [GenerationMode.POSITIVE, GenerationMode.NEGATIVE])
def test_api_conforms_to_its_schema(api_schema, mode):
    operations = [result.ok() for result in api_schema.get_all_operations()]
    assert {op.label for op in operations} >= {
        "GET /v1/proxies", "POST /v1/leases", "POST /v1/leases/{leaseId}/renew", "DELETE /v1/leases/{leaseId}",
        "GET /healthz", "GET /metrics"}  # schemathesis skips the document itself
    seen: dict[str, set[int]] = {}
    for op in operations:
        if mode is GenerationMode.NEGATIVE and op.label in ("GET /healthz", "GET /metrics"):
            continue  # no inputs: nothing to make invalid
        @settings(max_examples=MAX_EXAMPLES, deadline=None, database=None,
                  suppress_health_check=list(HealthCheck), phases=[Phase.generate])
        @given(case=op.as_strategy(generation_mode=mode))
        def run(case):
            if mode is GenerationMode.NEGATIVE:
                # The test always sends a valid token, so a case whose only invalidity is in the
                # headers (e.g. Authorization removed) is valid by the time it is sent; and a
                # query key whose value is an empty list is not sent at all.  Neither case tests
                # the API.
                assume(not _negative_in(case, "header"))
                assume(not any(isinstance(v, list) and not v for v in (case.query or {}).values()))
            response = case.call_and_validate(headers={"Authorization": f"Bearer {TOKEN_A}"}, checks=CHECKS)
            seen.setdefault(case.operation.label, set()).add(response.status_code)

        run()
    if mode is GenerationMode.POSITIVE:
        assert 201 in seen["POST /v1/leases"]  # leases were really granted during the run
        assert 200 in seen["GET /v1/proxies"]
