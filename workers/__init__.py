"""The Celery worker fleet: ``celery -A workers worker|beat|flower``.

``celery -A workers`` reads ``workers.app`` (or ``workers.celery``): that first access loads the
application (``workers.celery_app``) with the beat schedule installed (``workers.beat``, which
validates the providers config) and the /metrics hooks (``workers.metrics_server``); a worker
imports the task modules when it starts (the app's ``include``).  Importing a submodule alone
(``workers.celery_app`` to publish, ``workers.broker``) loads none of that, so the watcher
publishes tasks without loading a task module, the beat schedule or the worker's signal hooks.
"""

__all__ = ["celery", "app"]


def __getattr__(name: str):
    """Return the Celery application for ``celery``/``app``, with the schedule and metrics hooks loaded.

    Raises:
        AttributeError: any other name.
        SystemExit: (2) the providers config is invalid (``workers.beat``).
    """
    if name in ("celery", "app"):
        from workers import beat as _beat  # noqa: F401  (installs the beat schedule)
        from workers import metrics_server as _metrics  # noqa: F401  (serves /metrics when METRICS_BIND is set)
        from workers.celery_app import celery_app

        globals().update(celery=celery_app, app=celery_app)
        return celery_app
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
