"""The reconcile steps of one Proxy, free of Celery: the names their callers import.

Each step (:func:`create`, :func:`poll`, :func:`delete`) re-reads the object, does one
idempotent step, and returns a :class:`Followup` telling the caller what to enqueue next (or
``None``); :func:`retire_instance` deletes a replaced instance on its own queue.  The dispatcher
(:mod:`app.dispatch.proxies`, run by the Celery tasks of ``workers.tasks``) turns a followup
into a message on the right queue; tests call the steps directly with real collaborators.

The parts live in their own modules: :mod:`app.proxy.step` (what a step is given, shares and
returns), :mod:`app.proxy.decide` (what a Proxy needs, and the step timings),
:mod:`app.proxy.failures` (the error boundary), :mod:`app.proxy.provisioned` (shared status
writes), :mod:`app.proxy.create`, :mod:`app.proxy.poll`, :mod:`app.proxy.delete` and
:mod:`app.proxy.retire` (replaced instances, rotated credentials).
"""

from __future__ import annotations

from app.proxy.create import create
from app.proxy.decide import LIVE_PHASES, backoff, create_window, decide, drifted, steady, visibility_window
from app.proxy.delete import ABANDONED_KEY, delete
from app.proxy.poll import poll
from app.proxy.retire import ROTATED_SPEC_HASH, credentials_hash, retire_instance
from app.proxy.step import CREATE, DELETE, POLL, Context, Followup, Ref

__all__ = [
    "ABANDONED_KEY", "CREATE", "DELETE", "LIVE_PHASES", "POLL", "ROTATED_SPEC_HASH",
    "Context", "Followup", "Ref",
    "backoff", "create", "create_window", "credentials_hash", "decide", "delete", "drifted", "poll",
    "retire_instance", "steady", "visibility_window",
]
