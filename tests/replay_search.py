"""`kfbot optimize`'s search as the command shows it, answered by a `ReplayExecutor`
instead of a GPU. Run as a program, so its output goes wherever the caller sends it:

    python tests/replay_search.py REPO KERNEL BUDGET RUN_DIR

Silent passes first learn which candidates the seed makes the mutators propose, until
the record holds all of them; each gets a recorded evaluation (faster, noise or a
failure, with build and run seconds). The last pass replays the record through
`search_with_progress`, as `kfbot optimize` shows a search.
"""

from __future__ import annotations

import random
import sys
from pathlib import Path
from typing import Any

from rich.console import Console

from kfbot.commands.optimize import search_with_progress
from kfbot.config import Config
from kfbot.evaluate.evaluation import Evaluation, failed, shape_timings
from kfbot.evaluate.task import make_task
from kfbot.scan.scanner import scan
from kfbot.scan.select import select_kernel
from kfbot.search.executor import ReplayExecutor
from kfbot.search.runner import OptimizeSettings, optimize


class RecordedGpu:
    """What a probed engine tells the search before it starts."""

    def __init__(self) -> None:
        self.device: dict[str, Any] = {"gpu": "the recorded GPU"}

    def adequacy(self) -> None:
        return None


def recorded(digest: str, index: int) -> Evaluation:
    if index % 4 == 3:
        return failed(digest, "correctness", "only the last partial block of 128 differs -> "
                      "likely a missing bounds check", build_seconds=2.5, eval_seconds=0.5)
    rng = random.Random(index)
    ratio = 1.0 + 0.08 * (index % 3)  # 1.0 is noise; the others significantly faster
    original = [10.0 + rng.gauss(0, 0.02) for _ in range(30)]
    candidate = [10.0 / ratio + rng.gauss(0, 0.02) for _ in range(30)]
    timings = shape_timings([{"input": "(4096,) float32", "original_us": original,
                              "candidate_us": candidate}], index, None)
    return Evaluation(digest, "done", True, "correct", timings=timings, build_seconds=3.0,
                      eval_seconds=1.25)


def main() -> None:
    root, kernel, budget, run_dir = Path(sys.argv[1]), sys.argv[2], int(sys.argv[3]), \
        Path(sys.argv[4])
    task = make_task(select_kernel(scan(root, Config()).kernels, kernel), root, Config())
    settings = OptimizeSettings(islands=2, seed=5, evaluations=budget)
    records: dict[str, Evaluation] = {}
    for attempt in range(8):
        learning = ReplayExecutor(records)
        optimize(task, RecordedGpu(), settings, run_dir / f"pass-{attempt}", None, None,
                 learning)
        new = [h for h in learning.asked if h not in records]
        if not new:
            break
        start = len(records)
        records.update({h: recorded(h, start + i) for i, h in enumerate(new)})
    outcome = search_with_progress(task, settings, run_dir / "replayed", None, Console(),
                                   RecordedGpu(), ReplayExecutor(records))
    print(f"history: {len(outcome.result.history)}")


if __name__ == "__main__":
    main()
