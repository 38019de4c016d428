"""The discovery and lease API (Flask), served by granian's WSGI server: ``proxy-operator api``
(:mod:`api.server` says how).

Routes (details in :mod:`api.routes`, the schema at ``/openapi.json``, the guide in
docs/discovery-api.md): ``GET /v1/proxies``, ``POST /v1/leases``,
``POST /v1/leases/<id>/renew``, ``DELETE /v1/leases/<id>``; open: ``/healthz``, ``/metrics``,
``/openapi.json``.  Every ``/v1`` route needs a bearer token from the tokens file.
"""

from __future__ import annotations

import logging

import redis
from flask import Flask

from api import errors, routes
from api.fastpath import FastPath
from api.inputs import MAX_BODY_BYTES
from api.settings import ApiSettings
from app.serving import leases
from app.store.client import client_from_url
from api.tokens import TokenStore
from app.config.validation import ConfigError

log = logging.getLogger(__name__)


def create_app(settings: ApiSettings | None = None, *, rebuild_index: bool = True) -> Flask:
    """Build the Flask application, after rebuilding the lease index from the serving view
    (:func:`app.serving.leases.reindex_all`; skipped with a warning while Redis is unreachable).

    Args:
        settings: :class:`api.settings.ApiSettings` (default: from the environment).
        rebuild_index: rebuild the lease index (``False`` for a configuration check only).
    Returns:
        the Flask app, a WSGI application; its ``wsgi_app`` is :class:`api.fastpath.FastPath`
        in front of Flask's own.
    Raises:
        app.config.validation.ConfigError: no tokens file configured, or the file is invalid (the
            message names the file and field) — the API never starts without client tokens.
        ValueError: a malformed setting in the environment.
    """
    settings = settings or ApiSettings.from_env()
    if not settings.tokens_file:
        raise ConfigError("<env>", None, "API_TOKENS_FILE",
                          problem="required: the path of the clients' tokens file (--tokens-file)")
    store = TokenStore(settings.tokens_file, settings.tokens_check_every)
    r = client_from_url(settings.redis_url, decode_responses=True, socket_timeout=5,
                        socket_connect_timeout=2, health_check_interval=30)
    if rebuild_index:
        try:
            log.info("api: lease index: %d proxies with free capacity", leases.reindex_all(r))
        except redis.RedisError as exc:  # the API still starts; /healthz reports Redis
            log.warning("api: cannot rebuild the lease index now (Redis: %s); the health engine "
                        "rebuilds it within one probe interval", exc)
    app = Flask("proxy_operator_api")
    app.config["MAX_CONTENT_LENGTH"] = MAX_BODY_BYTES
    app.json.sort_keys = False  # type: ignore[attr-defined]  # Flask's DefaultJSONProvider has it
    errors.install(app)
    state = routes.State(redis=r, tokens=store, settings=settings)
    routes.register(app, state)
    # The plain lease and release requests skip Flask's per-request machinery (api/fastpath.py).
    app.wsgi_app = FastPath(app.wsgi_app, state)  # type: ignore[method-assign]  # Flask's documented WSGI middleware hook
    log.info("api: %d clients, Redis %s", len(store.clients), _redacted(settings.redis_url))
    return app


def _redacted(url: str) -> str:
    """The Redis URL without a password."""
    if "@" in url:
        scheme, _, rest = url.partition("://")
        return f"{scheme}://***@{rest.split('@', 1)[1]}"
    return url
