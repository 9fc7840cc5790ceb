"""`kfbot reproduce RUN_DIR`: re-measure a run's reported speedup from its patch alone.

The run folder's committed patch is applied to a clean copy of the commit the run
started from, built the repository's way and timed against the original by a second
timer in a fresh worker (see `kfbot.evaluate.reproduce.remeasure`). Exit 0 when the reproduced
speedup is at most 5% below the reported one, 1 when it is further below or the patch
does not apply or build, 2 for a run folder that does not fit, 3 without a GPU.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from rich.console import Console
from rich.table import Table

from kfbot import extras
from kfbot.cache import cache_dir
from kfbot.commands.options import add_repo_argument
from kfbot.errors import EXIT_FAILURE, EXIT_OK
from kfbot.evaluate.reproduce.model import Reproduction
from kfbot.paths import kfbot_folder
from kfbot.search.runfolder import read_record, reproduce_run


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("reproduce", help="re-time a run's committed patch with a second timer",
                       description="Apply a run's committed patch to a clean copy of the "
                                   "commit it started from, build it the repository's way "
                                   "and time it against the original with a second timer "
                                   "(GPU): reported vs reproduced speedup, per shape.")
    p.add_argument("run_dir", type=Path, metavar="RUN_DIR",
                   help="the run folder, .kfbot/runs/<run id>/ in the repository, or its "
                        "run id")
    add_repo_argument(p, help="the repository whose .kfbot/runs/ holds a RUN_DIR given as a "
                              "run id")
    p.add_argument("--gpu", type=int, default=None, metavar="N",
                   help="GPU index (default: the first)")
    p.add_argument("--json", action="store_true",
                   help="print the figures as JSON: shapes, speedup (geometric means)")
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    folder = _folder(args.run_dir, args.repo)
    read_record(folder)  # a folder that is not a run: said before anything is needed
    extras.require("torch", "kfbot reproduce")  # the timing worker runs this interpreter
    found = reproduce_run(folder, cache_dir(), args.gpu)
    if args.json:
        sys.stdout.write(json.dumps({"run": str(args.run_dir), **found.to_json()}, indent=1)
                         + "\n")
    else:
        _table(found, Console())
    return EXIT_OK if found.agrees else EXIT_FAILURE


def _folder(run_dir: Path, repo: Path) -> Path:
    """RUN_DIR as a path, else as a run id of the repository."""
    if run_dir.is_dir() or len(run_dir.parts) > 1:
        return run_dir.resolve()
    return kfbot_folder(repo, "runs", str(run_dir)).resolve()


def _table(found: Reproduction, console: Console) -> None:
    table = Table(title=f"candidate {found.candidate[:10]}: reported vs reproduced "
                        "(speedup = original / candidate)")
    for col in ("shape", "reported", "reproduced", "original µs", "candidate µs", "calls"):
        table.add_column(col)
    for s in found.shapes:
        table.add_row(s.shape, f"{s.reported:.3f}x", f"{s.reproduced:.3f}x",
                      f"{s.original_us:.2f}", f"{s.candidate_us:.2f}", str(s.samples))
    console.print(table)
    console.print(f"geometric mean: {found.summary()}", highlight=False, markup=False,
                  soft_wrap=True)
    console.print(f"timed with: {found.method}", highlight=False, markup=False, soft_wrap=True)
