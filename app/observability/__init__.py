"""Logs and metrics every process shares.

Owns :mod:`app.observability.logs` (one line per event, JSON on demand),
:mod:`app.observability.metrics` (the shared Prometheus metrics) and
:mod:`app.observability.multiproc` (prometheus-client's multiprocess directory).
"""
