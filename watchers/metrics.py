"""Prometheus metrics of the watcher (served on ``METRICS_BIND`` by ``proxy-operator watch``).

Defined here, not in :mod:`app.observability.metrics`, so that only the watcher process has them: an
unlabelled gauge defined in a shared module would read 0 in every other process.  Meanings and
labels: docs/observability.md.
"""

from __future__ import annotations

from prometheus_client import Counter, Gauge, Histogram

#: Every series below carries ``resource``: the plural of the stream (or hand-off) it counts,
#: ``proxies`` or ``proxypools``; the two streams run the same loop side by side.
WATCH_EVENTS = Counter(
    "proxy_operator_watch_events_total",
    "Events the watcher received from the API, by resource (proxies, proxypools) and type (SYNC from "
    "a list, ADDED, MODIFIED, DELETED, BOOKMARK).", ["resource", "type"])
WATCH_RESTARTS = Counter(
    "proxy_operator_watch_restarts_total",
    "Watch requests reopened, by resource and why the previous one ended (ended: the server closed "
    "it, e.g. at timeoutSeconds; gone: 410; error: anything else).", ["resource", "reason"])
WATCH_GONE = Counter("proxy_operator_watch_gone_total",
                     "410 Gone answers to a watch, by resource (its resourceVersion left the server's history).",
                     ["resource"])
WATCH_RELISTS = Counter("proxy_operator_watch_relists_total",
                        "Complete lists of every object of a resource (at start, after a 410).", ["resource"])
WATCHER_LEADER = Gauge("proxy_operator_watcher_leader", "1 while this watcher holds the leader Lease, else 0.",
                       multiprocess_mode="livemax")
EVENT_TO_ENQUEUE = Histogram(
    "proxy_operator_watch_event_to_enqueue_seconds",
    "Seconds from an event's arrival from the API to its hand-off done (task queued, or nothing to do), "
    "by resource.", ["resource"],
    buckets=(0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300))
HANDOFF_BACKLOG = Gauge("proxy_operator_watch_handoff_backlog",
                        "Events waiting for the dispatcher, by resource (one per object; grows while Redis "
                        "is down).", ["resource"], multiprocess_mode="livemax")
