"""The Python SDK's ``pool=``: the API's real ``pool`` filter now, ``"ns/name"`` naming the
namespace too, ``namespace=`` for what ``pool=`` used to mean, and the old meaning kept against
an API that predates ProxyPools (it refuses the ``pool`` field)."""

from __future__ import annotations

import json
import threading
import warnings
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlsplit

import pytest

from proxy_operator_client import Client

LEASE = {"leaseId": "0" * 32, "proxyUrl": "http://203.0.113.5:3128", "proxyAuth": None, "host": "203.0.113.5",
         "port": 3128, "egressIP": None, "expiresAt": "2030-01-01T00:00:00.000Z", "ttlSeconds": 300,
         "sessionKey": None, "sticky": False, "proxy": {"namespace": "crawl", "name": "w-1", "provider": None,
                                                          "zone": None}, "leases": {"used": 1, "max": 5}}


class _Api:
    """A stand-in API that records what it was sent; ``old=True`` answers like a release before
    ProxyPools (``pool`` is an unknown field / parameter)."""

    def __init__(self, old: bool) -> None:
        self.old, self.seen = old, []
        api = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):  # quiet
                pass

            def _answer(self, status: int, doc: dict) -> None:
                body = json.dumps(doc).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def do_POST(self):
                doc = json.loads(self.rfile.read(int(self.headers.get("Content-Length") or 0)) or b"{}")
                path = urlsplit(self.path).path
                api.seen.append(("POST", path, doc))
                if path.endswith("/renew"):
                    return self._answer(200, LEASE)
                if api.old and "pool" in doc:
                    return self._answer(400, {"error": "unknown_field", "field": "pool",
                                              "message": "unknown field (allowed: provider, zone, namespace, ...)"})
                self._answer(201, LEASE)

            def do_GET(self):
                parts = urlsplit(self.path)
                q = {k: v[0] for k, v in parse_qs(parts.query).items()}
                api.seen.append(("GET", parts.path, q))
                if api.old and "pool" in q:
                    return self._answer(400, {"error": "unknown_parameter", "field": "pool", "message": "unknown"})
                self._answer(200, {"items": []})

            def do_DELETE(self):
                api.seen.append(("DELETE", urlsplit(self.path).path, {}))
                self._answer(200, {"leaseId": "0" * 32, "released": True, "outcome": "ok", "wasLive": True,
                                   "cooldownUntil": None})

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"

    def sent(self, method: str) -> list[dict]:
        return [doc for m, _, doc in self.seen if m == method]


@pytest.fixture(params=[False, True], ids=["api-with-pools", "api-before-pools"])
def api(request):
    server = _Api(old=request.param)
    yield server
    server.server.shutdown()


def _filters(doc: dict) -> dict:
    return {k: v for k, v in doc.items() if k in ("pool", "namespace")}


def test_pool_is_the_pool_filter_and_namespace_is_its_own(api):
    with Client(api.url, "t" * 20, wait=0) as client:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            client.lease(pool="web", renew=False).release()
            client.lease(pool="web", renew=False).release()
        client.lease(namespace="crawl", renew=False).release()
        client.lease(pool="crawl/web", renew=False).release()
        client.proxies(pool="web")
    posts = [_filters(d) for d in api.sent("POST") if d]
    gets = [_filters(d) for d in api.sent("GET")]
    if not api.old:
        assert posts == [{"pool": "web"}, {"pool": "web"}, {"namespace": "crawl"},
                         {"pool": "web", "namespace": "crawl"}]
        assert gets == [{"pool": "web"}]
        assert not [w for w in caught if issubclass(w.category, DeprecationWarning)]
    else:
        # the first request is refused, then pool= is a namespace again, warned once, and asked that way after
        assert posts == [{"pool": "web"}, {"namespace": "web"}, {"namespace": "web"}, {"namespace": "crawl"},
                         {"namespace": "crawl"}]
        assert gets == [{"namespace": "web"}]
        assert len([w for w in caught if issubclass(w.category, DeprecationWarning)]) == 1


def test_a_pool_naming_another_namespace_than_namespace_is_refused(api):
    with Client(api.url, "t" * 20, wait=0) as client:
        with pytest.raises(ValueError, match="disagree"):
            client.lease(pool="a/web", namespace="b")
    assert api.seen == []
