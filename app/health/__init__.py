"""The health engine: probes through each published proxy, thresholds, status.

Modules, each with one job:

* :mod:`app.health.probe` — one probe (``GET healthCheck.url`` through the proxy) and a
  concurrent batch of them; failure reasons; the egress IP.
* :mod:`app.health.state` — thresholds: results → health, phase, verdict (pure).
* :mod:`app.health.status` — the verdict → a Proxy status patch (on change only).
* :mod:`app.health.schedule` — the sweep: which proxies are due, in batches (O(due)), by lane.
* :mod:`app.health.engine` — one batch end to end (what the ``health.probe_batch`` task runs).
* :mod:`app.health.origin` — a direct control request to the health URL's origin, so an
  outage of the origin is told from failing proxies before any proxy is marked down.
* :mod:`app.health.destinations` — where a probe may go: endpoints and health URLs in
  denied ranges are refused (``DestinationDenied``), endpoints pinned to the checked address.
* :mod:`app.health.credentials` — basic-auth credentials, only those of the Proxy a record
  names, as read from the Kubernetes API.
* :mod:`app.health.settings` — settings from the environment.
* :mod:`app.health.metrics` — Prometheus metrics.
"""
