"""Logging setup: one line per event, JSON on demand (``LOG_FORMAT=json``), level from ``LOG_LEVEL``.

Nothing here redacts: secrets are kept out of log calls at the source (task payloads are
references, CreateRequest's repr omits user-data).  The first line of every process is the
version banner.
"""

from __future__ import annotations

import json
import logging
import os
import sys

from app.timefmt import rfc3339
from app.version import banner

#: More verbose than DEBUG: payloads such as libvirt domain XML (``LOG_LEVEL=TRACE``).
TRACE = 5


class JsonFormatter(logging.Formatter):
    """Formats a record as one JSON object: ``time level logger message`` (+ ``exc``)."""

    def format(self, record: logging.LogRecord) -> str:
        return json.dumps(self.fields(record))

    def fields(self, record: logging.LogRecord) -> dict:
        """The object :meth:`format` writes, for subclasses that add fields."""
        out = {
            "time": rfc3339(record.created, millis=True),
            "level": record.levelname.lower(), "logger": record.name, "message": record.getMessage(),
        }
        if record.exc_info:
            out["exc"] = self.formatException(record.exc_info)
        return out


def setup(process: str, level: str | None = None) -> None:
    """Configure the root logger for ``process`` and log the version banner.

    Args:
        process: process name for the banner (``"watch"``, ``"api"``, ...).
        level: level name; default ``LOG_LEVEL`` or ``INFO``.
    """
    logging.addLevelName(TRACE, "TRACE")
    handler = logging.StreamHandler(sys.stderr)
    if os.environ.get("LOG_FORMAT", "").lower() == "json":
        handler.setFormatter(JsonFormatter())
    else:
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s %(message)s"))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    name = (level or os.environ.get("LOG_LEVEL") or "INFO").upper()
    root.setLevel(TRACE if name == "TRACE" else name)
    for noisy in ("urllib3", "kubernetes.client.rest"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
    logging.getLogger("proxy_operator").info(banner(process))
