"""Where kfbot keeps what it can make again: builds, captured inputs, scan facts.

Outside every repository (a repository's tree is never written), in `$KFBOT_CACHE`,
else `$XDG_CACHE_HOME/kfbot`, else `~/.cache/kfbot`.
"""

from __future__ import annotations

import os
from pathlib import Path


def cache_dir() -> Path:
    if "KFBOT_CACHE" in os.environ:
        return Path(os.environ["KFBOT_CACHE"])
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "kfbot"
