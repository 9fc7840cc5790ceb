"""`kfbot optimize`'s search as the command shows it, answered by a `ReplayExecutor`
instead of a GPU. Run as a program, so its output goes wherever the caller sends it:

    python tests/replay_search.py REPO KERNEL BUDGET RUN_DIR [SCALE [TIME_S]]

Silent passes first learn which candidates the seed makes the mutators propose, until
the record holds all of them; each gets a recorded evaluation (faster, noise or a
failure, with build and run seconds); what they learnt is kept in RUN_DIR. The last
pass replays the record through `search_with_progress`, as `kfbot optimize` shows a
search, into RUN_DIR/replayed: a second run with the same RUN_DIR resumes it.

With SCALE, each batch takes its recorded time times SCALE (its slowest build, then
every GPU evaluation in turn), and the last pass runs as `kfbot optimize` runs it:
SIGTERM and SIGINT stop it, and with TIME_S so does its time limit, counted from the
start of the last pass. A stopped run prints why and exits with the stop's code.
"""

from __future__ import annotations

import json
import random
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from rich.console import Console

from kfbot.commands.optimize import search_with_progress
from kfbot.config import Config
from kfbot.evaluate.candidate import Candidate
from kfbot.evaluate.evaluation import Evaluation, failed, shape_timings
from kfbot.evaluate.task import KernelTask, make_task
from kfbot.scan.scanner import scan
from kfbot.scan.select import select_kernel
from kfbot.search.executor import ReplayExecutor
from kfbot.search.plan import OptimizeSettings
from kfbot.search.runner import optimize
from kfbot.search.stopping import stop_on


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


class TimedReplay(ReplayExecutor):
    """A replay that takes the time the recorded work took, times `scale`: a batch's
    builds run side by side, its GPU evaluations one after another."""

    def __init__(self, records: Mapping[str, Evaluation], scale: float) -> None:
        super().__init__(records)
        self.scale = scale

    def evaluate(self, candidates: Sequence[Candidate]) -> list[tuple[Candidate, Evaluation]]:
        found = [(cand, replace(ev, build_seconds=ev.build_seconds * self.scale,
                                eval_seconds=ev.eval_seconds * self.scale))
                 for cand, ev in super().evaluate(candidates)]
        time.sleep(max((ev.build_seconds for _, ev in found), default=0.0)
                   + sum(ev.eval_seconds for _, ev in found))
        return found


def learn(task: KernelTask, settings: OptimizeSettings, run_dir: Path
          ) -> dict[str, Evaluation]:
    """A recorded evaluation for every candidate the seed makes the mutators propose,
    learnt in silent passes, or read back from RUN_DIR/learned.json (their hashes, in
    the order learnt: each record is made from its hash and its place)."""
    saved = run_dir / "learned.json"
    if saved.is_file():
        order = json.loads(saved.read_text())
        return {h: recorded(h, i) for i, h in enumerate(order)}
    records: dict[str, Evaluation] = {}
    with tempfile.TemporaryDirectory() as scratch:
        for attempt in range(8):
            learning = ReplayExecutor(records)
            optimize(task, RecordedGpu(), settings, Path(scratch) / f"pass-{attempt}", None,
                     None, learning)
            new = [h for h in learning.asked if h not in records]
            if not new:
                break
            start = len(records)
            records.update({h: recorded(h, start + i) for i, h in enumerate(new)})
    run_dir.mkdir(parents=True, exist_ok=True)
    saved.write_text(json.dumps(list(records)))
    return records


def main() -> int:
    root, kernel, budget, run_dir = Path(sys.argv[1]), sys.argv[2], int(sys.argv[3]), \
        Path(sys.argv[4])
    scale = float(sys.argv[5]) if len(sys.argv) > 5 else None
    limit = float(sys.argv[6]) if len(sys.argv) > 6 else None
    task = make_task(select_kernel(scan(root, Config()).kernels, kernel), root, Config())
    settings = OptimizeSettings(islands=2, seed=5, evaluations=budget)
    records = learn(task, settings, run_dir)
    if scale is None:
        outcome = search_with_progress(task, settings, run_dir / "replayed", None, Console(),
                                       RecordedGpu(), ReplayExecutor(records))
        print(f"history: {len(outcome.result.history)}")
        return 0
    started = time.monotonic()
    # 6 s kept back for writing the report, as `kfbot optimize` keeps FINISH_S.
    timed = replace(settings, seconds=limit, started=started, reserve_s=6.0)
    with stop_on(limit, started):
        outcome = search_with_progress(task, timed, run_dir / "replayed", None, Console(),
                                       RecordedGpu(), TimedReplay(records, scale))
    print(f"history: {len(outcome.result.history)}; stopped: {outcome.result.stopped}; "
          f"took {time.monotonic() - started:.2f} s")
    return outcome.exit_code


if __name__ == "__main__":
    sys.exit(main())
