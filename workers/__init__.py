"""The Celery worker fleet: ``celery -A workers worker|beat|flower``.

Importing this package gives Celery the application (``workers.celery``) with every task
registered and the beat schedule installed.
"""

from workers.celery_app import celery_app
from workers import beat as _beat  # noqa: F401  (installs the beat schedule)
from workers import metrics_server as _metrics  # noqa: F401  (serves /metrics when METRICS_BIND is set)

celery = celery_app
app = celery_app

__all__ = ["celery", "app", "celery_app"]
