"""Release and commit stamping (``proxy-operator version`` and every first log line)."""

from __future__ import annotations

import os
import subprocess
from importlib import metadata
from pathlib import Path


def release() -> str:
    """Return the installed distribution's version, e.g. ``"0.1.0"`` (``"0.0.0+unknown"`` if not installed)."""
    try:
        return metadata.version("proxy-operator")
    except metadata.PackageNotFoundError:
        return "0.0.0+unknown"


def commit() -> str:
    """Return the git commit this build came from.

    The image sets ``GIT_COMMIT`` at build time; a source checkout asks git. Returns
    ``"unknown"`` when neither is available.
    """
    env = os.environ.get("GIT_COMMIT")
    if env:
        return env
    root = Path(__file__).resolve().parent.parent
    try:
        out = subprocess.run(
            ["git", "-C", str(root), "rev-parse", "HEAD"],
            capture_output=True, text=True, timeout=5, check=True,
        )
        return out.stdout.strip() or "unknown"
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def banner(process: str) -> str:
    """Return the first log line of a process: ``"proxy-operator <process> release=<v> commit=<sha>"``."""
    return f"proxy-operator {process} release={release()} commit={commit()}"
