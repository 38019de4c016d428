"""Python client of proxy-operator's discovery/lease API.

::

    from proxy_operator_client import Client

    client = Client("http://proxy-api:8080", token)
    with client.lease(zone="europe-west1-b", ttl=300) as lease:
        session = lease.requests_session()        # every request through the leased proxy
        if session.get("https://example.org/").status_code == 403:
            lease.report("blocked")               # banned: cool the proxy down for this client

* :class:`Client`, :class:`Lease` (renewed in the background, released on exit),
  :class:`Released`, :class:`ProxyRef`; ``client.requests_session()`` / ``client.httpx_client()``:
  a lease per request for its host as ``target`` (bans per site, one crawler per site and IP);
* :class:`ApiError` (carries the API's ``error`` code), :class:`TransportError`,
  :class:`ClientClosed`, all :class:`ProxyOperatorError`;
* :mod:`proxy_operator_client.scrapy`: ``ProxyLeaseMiddleware`` for Scrapy.

Depends only on ``requests`` (``httpx`` and ``scrapy`` are optional extras).
"""

from proxy_operator_client.client import OUTCOMES, Client, Lease, ProxyRef, Released, TargetedSession, selector_of
from proxy_operator_client.errors import ApiError, ClientClosed, ProxyOperatorError, TransportError

__version__ = "0.1.0"

__all__ = ["OUTCOMES", "ApiError", "Client", "ClientClosed", "Lease", "ProxyOperatorError", "ProxyRef", "Released",
           "TargetedSession", "TransportError", "__version__", "selector_of"]
