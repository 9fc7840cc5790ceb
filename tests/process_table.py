"""What runs on this machine, as the tests see it: processes are found by a marker on
their command line, since a sandboxed process's pid is that of its own namespace."""

from __future__ import annotations

import time
from pathlib import Path


def running(marker: str, within_s: float = 5.0) -> bool:
    """Whether a process with `marker` in its command line still runs after `within_s`
    (False as soon as none does)."""
    deadline = time.monotonic() + within_s
    while True:
        if not any(_runs(proc, marker) for proc in Path("/proc").glob("[0-9]*")):
            return False
        if time.monotonic() > deadline:
            return True
        time.sleep(0.1)


def started(marker: str, within_s: float = 5.0) -> bool:
    """Whether a process with `marker` in its command line runs within `within_s`."""
    deadline = time.monotonic() + within_s
    while not any(_runs(proc, marker) for proc in Path("/proc").glob("[0-9]*")):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


def _runs(proc: Path, marker: str) -> bool:
    try:
        command = (proc / "cmdline").read_bytes()
        state = (proc / "stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False  # gone while being read
    return marker.encode() in command and state != "Z"
