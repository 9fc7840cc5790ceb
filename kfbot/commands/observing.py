"""The observation of the tests on a GPU, for the commands that show or use pairs.

`kfbot scan` shows the observation kept for the repository's current state, if any;
`kfbot scan --observe` makes one (and keeps it). `kfbot verify` and `kfbot optimize`
make one when asked (`--observe`), or when a GPU is visible and the static reading
left the kernels they work on without a reference; `--no-observe` never does.

The observer (which builds, and runs the repository's tests) is imported only when an
observation is made: `kfbot scan` without `--observe` reads a JSON file at most.
"""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Sequence
from pathlib import Path

from kfbot.commands.options import duration_argument
from kfbot.errors import EXIT_MISSING_TOOL, KfbotError
from kfbot.scan.model import Kernel, Observations, ScanReport
from kfbot.scan.observed import load, save, with_observations

log = logging.getLogger(__name__)


def add_observe_arguments(p: argparse.ArgumentParser, always: bool = False) -> None:
    """`--observe` (and, unless it is the only way, `--no-observe`)."""
    what = ("run the repository's tests and scripts on the GPU, each file in its own "
            "sandboxed process, to see which kernels each test launches and whether a "
            "mutant of the kernel that writes nothing fails it; kept in .kfbot/observed/ "
            "per commit")
    if always:
        p.add_argument("--observe", action="store_true", help=what)
    else:
        group = p.add_mutually_exclusive_group()
        group.add_argument("--observe", dest="observe", action="store_const", const="always",
                           help=what + " (default: when a GPU is visible and no test was "
                                       "paired with the kernel by reading the code)")
        group.add_argument("--no-observe", dest="observe", action="store_const",
                           const="never", help="use only the static pairing")
        p.set_defaults(observe="auto")
    p.add_argument("--file-timeout", type=duration_argument, default=300.0,
                   metavar="DURATION",
                   help="with an observation: the most one test file or script may take, "
                        "with a unit: 90s, 5m (default: 5m)")


def observed(root: Path, report: ScanReport, make: bool, file_timeout_s: float = 300.0,
             confirm: Sequence[str] | None = None) -> ScanReport:
    """`report` with the observation of this state merged in: the kept one, or (with
    `make`) a new one, kept for next time."""
    found = None if make else load(root)
    if make:
        found = _make(root, report, file_timeout_s, confirm)
    return with_observations(report, found, root) if found is not None else report


def wanted(mode: str, kernels: Sequence[Kernel], root: Path) -> bool:
    """Whether verify or optimize should observe the tests before it starts."""
    if mode == "never":
        return False
    if mode == "always":
        return True
    if load(root) is not None or any(k.references for k in kernels):
        return False
    from kfbot.search.executors.gpus import visible_gpus

    return bool(visible_gpus())


def _make(root: Path, report: ScanReport, file_timeout_s: float,
          confirm: Sequence[str] | None) -> Observations:
    from kfbot.cache import cache_dir
    from kfbot.evaluate.build import Builder
    from kfbot.evaluate.observe.observer import ObserveSettings, observe
    from kfbot.search.executors.gpus import visible_gpus

    if not visible_gpus():
        raise KfbotError("observing the tests needs a CUDA GPU, and none is visible "
                         "(nvidia-smi -L lists none, or CUDA_VISIBLE_DEVICES hides them); "
                         "without one the static pairing is all there is", EXIT_MISSING_TOOL)
    print("kfbot: observing the tests on the GPU (each test file in its own process)...",
          file=sys.stderr)
    settings = ObserveSettings(file_timeout_s=file_timeout_s,
                               confirm=tuple(confirm) if confirm is not None else None)
    found = observe(root, report, Builder(cache_dir() / "build"), settings)
    saved = save(root, found)
    if saved is None:
        log.info("%s is not a git working tree: the observation is not kept", root)
    else:
        log.info("observation kept in %s", saved)
    return found
