"""Process entry points: the ``proxy-operator`` command (:mod:`cli.main`).

Not domain logic: the subcommands parse flags and the environment, validate the providers
config and start a process (the watcher, a Celery worker, the API) whose logic lives in
``app/``, ``watchers/``, ``workers/`` and ``api/``.  ``python -m cli`` runs the same command.
"""
