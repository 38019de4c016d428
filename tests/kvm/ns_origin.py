"""A tiny origin run inside the rig's network namespace (``python ns_origin.py ADDRESS PORT``).

``/generate_204`` answers 204 (the health URL); any other path answers 200 with
``{"path": ..., "client": <peer address>}`` so a test sees the request came from the guest.
Each request is printed on stdout as ``<client> <path>``.  The handler is
:class:`tests.support.origin.OriginHandler` (standard library only).
"""

from __future__ import annotations

import http.server
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "support"))  # run by path: tests/support/origin.py
from origin import OriginHandler


class Handler(OriginHandler):
    """Answer GETs as the module docstring says."""

    def seen(self) -> None:
        print(self.client_address[0], self.path, flush=True)

    def payload(self) -> dict[str, Any]:
        return {"path": self.path, "client": self.client_address[0]}


if __name__ == "__main__":
    http.server.ThreadingHTTPServer((sys.argv[1], int(sys.argv[2])), Handler).serve_forever()
