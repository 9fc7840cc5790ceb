"""The YAML data files kfbot ships in `rules/`: where they are, and reading one.

Every file is a list of entries with unique ids; the loaders that own each format
(anti-cheating rules, rewrites, personas) validate the entries themselves.
"""

from __future__ import annotations

from collections.abc import Iterable
from importlib import resources
from pathlib import Path
from typing import Any

import yaml

from kfbot.errors import KfbotError

_PROBE = "anticheat.yaml"  # a file every rules folder holds


def rules_dir() -> Path:
    """The rules folder: the installed `kfbot.rules` data, else the checkout's rules/."""
    try:
        installed: Path | None = Path(str(resources.files("kfbot.rules") / _PROBE))
    except (ImportError, TypeError, ValueError):
        installed = None  # a source checkout where kfbot.rules is not importable as data
    if installed is not None and installed.is_file():
        return installed.parent
    return Path(__file__).resolve().parents[1] / "rules"


def read_entries(path: Path, noun: str) -> list[Any]:
    """The list of entries in one data file; `noun` (rule, rewrite...) names them in errors."""
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except OSError as e:
        raise KfbotError(f"{path}: cannot read the {noun} file: {e.strerror or e}") from e
    except yaml.YAMLError as e:
        raise KfbotError(f"{path}: not valid YAML: {e}") from e
    if not isinstance(data, list):
        raise KfbotError(f"{path}: expected a list of {noun}s, got {type(data).__name__}")
    return data


def check_unique_ids(path: Path, noun: str, ids: Iterable[str]) -> None:
    seen: set[str] = set()
    for entry_id in ids:
        if entry_id in seen:
            raise KfbotError(f"{path}: {noun} {entry_id}: the id is used twice")
        seen.add(entry_id)
