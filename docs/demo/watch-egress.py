#!/usr/bin/env python3
"""Live table of the healthy proxies and their egress IPs, read from the discovery API.

    docs/demo/watch-egress.py --api http://127.0.0.1:8080 --token-file crawler-a.token

Every ``--interval`` seconds (default 2) it sends ``GET /v1/proxies?healthy=true`` with the
bearer token read from ``--token-file`` (a file holding just the token), clears the screen
and prints one line per proxy: name, namespace, provider, zone, address:port, egress IP and
leases used/max (docs/discovery-api.md describes the response).  ``--once`` prints one table
and exits (status 1 when the API could not be read).  Ctrl-C stops it.

Needs only ``requests`` (installed with proxy-operator; else ``pip install requests``).
"""

from __future__ import annotations

import argparse
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

import requests

HEADERS = ("NAME", "NAMESPACE", "PROVIDER", "ZONE", "ADDRESS", "EGRESS IP", "LEASES")
CLEAR = "\033[H\033[2J"


class FetchError(Exception):
    """The API could not be read; the message says where and why (never the token)."""


def row(item: dict) -> tuple[str, ...]:
    """One table row of a ``/v1/proxies`` item.

    Args:
        item: ``{name, namespace, provider, zone, address, port, egressIP, leases: {used, max}, ...}``;
            ``provider``, ``zone`` and ``egressIP`` may be null (shown as ``-``).
    """
    def text(value) -> str:
        return "-" if value in (None, "") else str(value)

    leases = item.get("leases") or {}
    address = item.get("address") or "-"
    if item.get("port"):
        address = f"[{address}]:{item['port']}" if ":" in address else f"{address}:{item['port']}"
    return (text(item.get("name")), text(item.get("namespace")), text(item.get("provider")),
            text(item.get("zone")), address, text(item.get("egressIP")),
            f"{text(leases.get('used'))}/{text(leases.get('max'))}")


def render_table(items: list[dict]) -> str:
    """Render ``items`` (the ``items`` of ``GET /v1/proxies``) as an aligned text table.

    Returns:
        The header line and one line per item, columns separated by at least two spaces,
        trailing spaces stripped, ending with a newline; ``(no healthy proxies)`` under the
        header when ``items`` is empty.
    """
    rows = [HEADERS] + [row(i) for i in items]
    widths = [max(len(r[c]) for r in rows) for c in range(len(HEADERS))]
    lines = ["  ".join(cell.ljust(w) for cell, w in zip(r, widths)).rstrip() for r in rows]
    if not items:
        lines.append("(no healthy proxies)")
    return "\n".join(lines) + "\n"


def summary(items: list[dict], now: datetime | None = None) -> str:
    """The line above the table: proxy count, distinct egress IPs, time (UTC)."""
    now = now or datetime.now(timezone.utc)
    egress = {i.get("egressIP") for i in items if i.get("egressIP")}
    return (f"{len(items)} healthy {'proxy' if len(items) == 1 else 'proxies'}, "
            f"{len(egress)} distinct egress IP{'' if len(egress) == 1 else 's'}  "
            f"{now:%Y-%m-%d %H:%M:%S} UTC")


def read_token(path: str) -> str:
    """Return the bearer token stored in ``path`` (surrounding whitespace removed).

    Raises:
        FetchError: the file cannot be read or is empty.
    """
    try:
        token = Path(path).read_text().strip()
    except OSError as exc:
        raise FetchError(f"--token-file {path}: cannot read it ({exc.strerror or exc})") from None
    if not token:
        raise FetchError(f"--token-file {path}: the file is empty (it must hold the bearer token)")
    if any(c.isspace() for c in token):
        raise FetchError(f"--token-file {path}: expected one token, found whitespace inside")
    return token


def fetch(session: requests.Session, api: str, token: str, filters: dict[str, str],
          timeout: float = 5.0) -> list[dict]:
    """``GET <api>/v1/proxies?healthy=true&<filters>`` and return its ``items``.

    Raises:
        FetchError: the API is unreachable, answers an error (its ``error`` code and
            ``message`` are quoted) or something that is not a proxy list.
    """
    url = api.rstrip("/") + "/v1/proxies"
    try:
        resp = session.get(url, params={"healthy": "true", **filters}, timeout=timeout,
                           headers={"Authorization": f"Bearer {token}", "Accept": "application/json"})
    except requests.RequestException as exc:
        raise FetchError(f"cannot reach {url}: {type(exc).__name__}") from None
    try:
        body = resp.json()
    except ValueError:
        body = None
    if resp.status_code != 200:
        detail = ""
        if isinstance(body, dict) and "error" in body:
            detail = f": {body['error']}: {body.get('message', '')}"
        hint = " (check --token-file)" if resp.status_code == 401 else ""
        raise FetchError(f"{url}: HTTP {resp.status_code}{detail}{hint}")
    if not isinstance(body, dict) or not isinstance(body.get("items"), list):
        raise FetchError(f"{url}: the answer is not a proxy list (no 'items' array)")
    return body["items"]


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--api", required=True, help="base URL of the discovery API, e.g. http://127.0.0.1:8080")
    p.add_argument("--token-file", required=True, help="file holding the bearer token")
    p.add_argument("--interval", type=float, default=2.0, help="seconds between refreshes (default 2)")
    p.add_argument("--once", action="store_true", help="print one table and exit")
    for name in ("provider", "zone", "namespace", "selector"):
        p.add_argument(f"--{name}", help=f"only proxies with this {name} (API filter)")
    args = p.parse_args(argv)
    if not args.api.startswith(("http://", "https://")):
        p.error(f"--api: want an http:// or https:// URL, got {args.api!r}")
    if args.interval < 0.2:
        p.error(f"--interval: at least 0.2 seconds, got {args.interval}")
    return args


def main(argv: list[str] | None = None) -> int:
    """Run the live table; return the exit status."""
    args = parse_args(argv)
    filters = {k: v for k in ("provider", "zone", "namespace", "selector") if (v := getattr(args, k))}
    clear = CLEAR if sys.stdout.isatty() else ""
    session = requests.Session()
    try:
        while True:
            try:
                items = fetch(session, args.api, read_token(args.token_file), filters)
                screen = f"{summary(items)}\n\n{render_table(items)}"
                ok = True
            except FetchError as exc:
                screen, ok = f"error: {exc}\n", False
            if args.once:
                (sys.stdout if ok else sys.stderr).write(screen)
                return 0 if ok else 1
            sys.stdout.write(clear + screen)
            sys.stdout.flush()
            time.sleep(args.interval)
    except KeyboardInterrupt:
        return 0


if __name__ == "__main__":
    sys.exit(main())
