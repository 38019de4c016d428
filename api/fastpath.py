"""The two routes every lease goes through, answered without Flask's per-request machinery.

``POST /v1/leases`` and ``DELETE /v1/leases/<id>`` are what a crawler calls for every
proxy it uses; everything else is rare.  Flask spends about as much CPU building and tearing
down its request context, matching the URL and wrapping the response as the lease itself
costs in Redis and redis-py (docs/performance.md), so :class:`FastPath`, a WSGI layer in
front of the Flask app, answers those two routes directly with the very same functions
(:func:`api.routes.authenticate`, :func:`api.inputs.body`, :func:`api.routes.acquire`,
:func:`api.routes.release`, :func:`api.routes.lease_json`) and the same error rendering
(:class:`api.errors.ApiError`), so status, headers and body are byte for byte what the Flask
routes give.  Any other request, and any variant of these two that is not the plain form
(another method, a trailing slash, a query string other than ``outcome=ok|blocked|failed``),
goes to Flask untouched.
"""

from __future__ import annotations

import logging
import re
from typing import Callable, Iterable

import redis

from api import inputs, routes
from api.errors import ApiError, internal_error, plain_json_bytes, redis_error

log = logging.getLogger(__name__)

WSGIApp = Callable[[dict, Callable], Iterable[bytes]]

_RELEASE_PATH = re.compile(r"^/v1/leases/([0-9a-f]{32})$")
_OUTCOMES = {"": "ok", "outcome=ok": "ok", "outcome=blocked": "blocked", "outcome=failed": "failed"}


class FastPath:
    """WSGI application: the plain lease and release requests here, the rest to ``flask``.

    Args:
        flask: the Flask app's WSGI callable (``app.wsgi_app``).
        state: the routes' :class:`api.routes.State`.
    """

    def __init__(self, flask: WSGIApp, state: routes.State) -> None:
        self.flask, self.state = flask, state

    def __call__(self, environ: dict, start_response) -> Iterable[bytes]:
        method = environ.get("REQUEST_METHOD")
        if method == "POST" and environ.get("PATH_INFO") == "/v1/leases" and not environ.get("QUERY_STRING"):
            return self._answer(environ, start_response, self._acquire)
        if method == "DELETE":
            m = _RELEASE_PATH.match(environ.get("PATH_INFO", ""))
            outcome = _OUTCOMES.get(environ.get("QUERY_STRING", ""))
            if m and outcome:
                return self._answer(environ, start_response,
                                    lambda env, client: self._release(client, m.group(1), outcome))
        return self.flask(environ, start_response)

    def _acquire(self, environ: dict, client) -> tuple[int, dict, dict]:
        lease = routes.acquire(self.state, client, inputs.body(environ, routes.ACQUIRE_FIELDS))
        return 201, routes.lease_json(lease), {"Location": f"/v1/leases/{lease.id}", **routes.NO_STORE}

    def _release(self, client, lease_id: str, outcome: str) -> tuple[int, dict, dict]:
        return 200, routes.release(self.state, client, lease_id, outcome=outcome), {}

    def _answer(self, environ: dict, start_response, handler) -> list[bytes]:
        """Authenticate, run ``handler(environ, client) -> (status, doc, headers)`` and
        answer it as JSON; errors as the Flask app's error handlers answer them."""
        try:
            client = routes.authenticate(self.state.tokens, environ.get("HTTP_AUTHORIZATION", ""))
            status, doc, headers = handler(environ, client)
        except ApiError as exc:
            return exc.wsgi(start_response)
        except redis.RedisError as exc:
            return redis_error(exc).wsgi(start_response)
        except Exception:  # noqa: BLE001 - a bug: logged with its traceback, answered 500
            return internal_error().wsgi(start_response)
        body = plain_json_bytes(doc)
        start_response("201 CREATED" if status == 201 else "200 OK",
                       [("Content-Type", "application/json"), ("Content-Length", str(len(body))),
                        *headers.items()])
        return [body]
