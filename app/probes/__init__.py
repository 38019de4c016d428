"""The health engine: probes through each published proxy, thresholds, status.

Modules, each with one job:

* :mod:`app.probes.probe` — one probe (``GET healthCheck.url`` through the proxy) and a
  concurrent batch of them; failure reasons; the egress IP.
* :mod:`app.probes.state` — thresholds: results → health, phase, verdict (pure).
* :mod:`app.probes.status` — the verdict → a Proxy status patch (on change only).
* :mod:`app.probes.schedule` — the sweep: which proxies are due, in batches (O(due)), by lane.
* :mod:`app.probes.engine` — one batch end to end (what the ``health.probe_batch`` task runs).
* :mod:`app.probes.origin` — a direct control request to the health URL's origin, so an
  outage of the origin is told from failing proxies before any proxy is marked down.
* :mod:`app.probes.destinations` — where a probe may go: endpoints and health URLs in
  denied ranges are refused (``DestinationDenied``), endpoints pinned to the checked address.
* :mod:`app.probes.credentials` — basic-auth credentials, only those of the Proxy a record
  names, as read from the Kubernetes API.
* :mod:`app.probes.settings` — settings from the environment.
* :mod:`app.probes.metrics` — Prometheus metrics.
"""
