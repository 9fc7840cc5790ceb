"""Options every command spells alike: where the repository is, its config, durations,
the output format. Light to import: `kfbot scan` and `kfbot check` use it too."""

from __future__ import annotations

import argparse
from pathlib import Path

from kfbot.config import CONFIG_NAMES
from kfbot.search.budget import parse_duration, parse_percent


def add_repo_argument(p: argparse.ArgumentParser, default: Path | None = Path("."),
                      help: str = "the repository (or project) folder") -> None:
    p.add_argument("--repo", type=Path, default=default, metavar="DIR", help=help)


def add_config_argument(p: argparse.ArgumentParser) -> None:
    p.add_argument("--config", type=Path, metavar="FILE",
                   help=f"config file (default: the repository's "
                        f"{', '.join(CONFIG_NAMES)}, if there is one)")


def add_repo_arguments(p: argparse.ArgumentParser) -> None:
    add_repo_argument(p)
    add_config_argument(p)


def add_format_arguments(p: argparse.ArgumentParser, json_help: str) -> None:
    fmt = p.add_mutually_exclusive_group()
    fmt.add_argument("--json", action="store_const", const="json", dest="format",
                     help=json_help)
    fmt.add_argument("--format", choices=("table", "json", "markdown"), default="table",
                     help="table for people, json for programs, markdown for reports")
    # On the parser as well: of two options sharing a dest, the first (--json, default
    # None) sets the value first, and tables went to stderr as if JSON were asked for.
    p.set_defaults(format="table")


def duration_argument(text: str) -> float:
    """A duration with its unit (90s, 30m, 1h30m), in seconds."""
    try:
        return parse_duration(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from exc


def percent_argument(text: str) -> float:
    """A percentage with its sign (5%), as a fraction."""
    try:
        return parse_percent(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from exc
