"""Every kernel of fixtures/naive_real gets proposals: from the original, the rules
mutator has structural rewrites for it (through its helpers, templates and launcher),
and a 32-evaluation search with params and rules only, every candidate answered as
noise, spends its budget instead of stopping with "no mutator proposes anything new"."""

from __future__ import annotations

import random
import shutil
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

from kfbot.config import load_config
from kfbot.evaluate.candidate import ORIGINAL, Candidate
from kfbot.evaluate.evaluation import Evaluation, shape_timings
from kfbot.evaluate.task import KernelTask, make_task
from kfbot.scan.scanner import scan
from kfbot.scan.select import select_kernel
from kfbot.search.plan import OptimizeSettings
from kfbot.search.rewrites import load_rewrites, propose_rewrites
from kfbot.search.runner import optimize

ROOT = Path(__file__).resolve().parents[2]
REAL = ROOT / "fixtures" / "naive_real"
KERNELS = ("softmax_block_kernel", "dropout_scale_kernel", "softmax_warp_kernel",
           "layernorm_kernel", "row_sum_kernel", "row_absmax_kernel", "blur_rows_kernel",
           "rmsnorm_kernel")
# Kernels whose rewrites, knobs and flags leave more than 32 candidates to try.
ROOMY = ("softmax_block_kernel", "layernorm_kernel", "blur_rows_kernel", "rmsnorm_kernel")
# Rewrites that change a kernel's structure (not only a qualifier or a flag).
STRUCTURAL = {"warp-per-row", "block-per-row", "row-map-per-block", "row-split-by-length",
              "vectorize-row-loads", "cache-row-in-shared", "warp-shuffle-reduction",
              "online-softmax", "grid-stride-loop", "vectorize-float4"}


@pytest.fixture(scope="module")
def repo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("naive") / "naive_real"
    shutil.copytree(REAL, root)
    return root


def _task(root: Path, kernel: str) -> KernelTask:
    config = load_config(None, root)
    return make_task(select_kernel(scan(root, config).kernels, kernel), root, config)


class _Gpu:
    def __init__(self) -> None:
        self.device: dict[str, Any] = {"gpu": "no GPU: every candidate is answered as noise"}

    def adequacy(self) -> None:
        return None


class _Noise:
    """Answers every candidate correct and exactly as fast as the original."""

    def __init__(self) -> None:
        self.asked = 0
        self.seen: dict[str, Candidate] = {}

    def evaluate(self, cands: Sequence[Candidate]) -> list[tuple[Candidate, Evaluation]]:
        out = []
        for cand in cands:
            self.asked += 1
            self.seen[cand.hash] = cand
            rng = random.Random(self.asked)
            times = [10.0 + rng.gauss(0, 0.05) for _ in range(20)]
            timings = shape_timings([{"input": "(64, 1024) float32", "original_us": times,
                                      "candidate_us": list(reversed(times))}], 0, None)
            out.append((cand, Evaluation(cand.hash, "done", True, "correct",
                                         timings=timings)))
        return out

    def close(self) -> None:
        """Nothing to release."""


@pytest.mark.parametrize("kernel", KERNELS)
def test_the_original_gets_rule_proposals(repo: Path, kernel: str) -> None:
    task = _task(repo, kernel)
    files = {p: (repo / p).read_text() for p in task.editable_files}
    proposed = propose_rewrites(files, task.editable_files, ORIGINAL, task.kernel_name)
    ids = {c.rationale.split(":", 1)[0] for c in proposed}
    assert ids, f"{kernel}: no rewrite proposed"
    if kernel != "dropout_scale_kernel":  # an elementwise map: qualifiers and flags only
        assert ids & STRUCTURAL, f"{kernel}: only {sorted(ids)}"


@pytest.mark.parametrize("kernel", KERNELS)
def test_a_search_of_noise_stops_only_when_no_rewrite_is_left(repo: Path, kernel: str,
                                                              tmp_path: Path) -> None:
    """32 evaluations of noise: the budget is spent, or the search stopped because no
    rewrite of the library applies to any candidate it has not evaluated yet."""
    task = _task(repo, kernel)
    noise = _Noise()
    outcome = optimize(task, _Gpu(), OptimizeSettings(evaluations=32, seed=1), tmp_path / "run",
                       None, None, noise)
    assert outcome.committed is None  # noise is never committed
    if kernel in ROOMY or outcome.result.stopped != "no mutator proposes anything new":
        assert outcome.result.stopped == "evaluations spent (32/32)" and noise.asked == 32
        return
    base = {p: (repo / p).read_text() for p in task.editable_files}
    for cand in noise.seen.values():
        left = [c for c in propose_rewrites({**base, **cand.files}, task.editable_files, cand,
                                            task.kernel_name, load_rewrites())
                if c.hash not in noise.seen and not c.params]
        assert not left, f"{kernel}: {left[0].rationale} was never proposed"
