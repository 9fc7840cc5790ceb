"""The pull-request guard's settings: a slowdown threshold and a warn-only mode, read
from the Action's inputs and applied to measured comparisons (recorded timings of a
real kernel of fixtures/example: one input 10 % slower, one as fast)."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from kfbot.config import Config
from kfbot.errors import KfbotError
from kfbot.evaluate.against_base import Comparison
from kfbot.evaluate.evaluation import Evaluation, failed, shape_timings
from kfbot.github.action.guard import Tolerance, _guarded
from kfbot.github.action_io import read_inputs
from kfbot.scan.changes import ChangedKernel
from kfbot.scan.scanner import scan
from kfbot.scan.select import select_kernel

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def softmax() -> ChangedKernel:
    kernels = scan(ROOT / "fixtures" / "example", Config()).kernels
    return ChangedKernel(select_kernel(kernels, "softmax_kernel"), ("csrc/softmax.cu",))


def measured(slowdown: float) -> Evaluation:
    """Correct, and `slowdown` slower on (4096, 1024) than the base; as fast on (3, 5)."""
    rng = random.Random(7)

    def samples(us: float) -> list[float]:
        return [us * (1 + rng.gauss(0, 0.003)) for _ in range(40)]

    timings = shape_timings([
        {"input": "(4096, 1024) float32", "original_us": samples(600.0),
         "candidate_us": samples(600.0 * (1 + slowdown))},
        {"input": "(3, 5) float32", "original_us": samples(20.0),
         "candidate_us": samples(20.0)}], 3, None)
    return Evaluation("c", "done", True, "correct", timings=timings)


def guard(kernel: ChangedKernel, change: Evaluation, tolerance: Tolerance
          ) -> tuple[int, str, list[str]]:
    result = _guarded([kernel], [Comparison(kernel.kernel.id, change)], "", (), tolerance)
    return result.exit_code, result.headline, [a.level for a in result.annotations]


def test_any_significant_slowdown_fails_by_default(softmax: ChangedKernel) -> None:
    code, headline, levels = guard(softmax, measured(0.10), Tolerance())
    assert (code, levels) == (1, ["error"])
    assert headline == "1 changed kernel: 1 slower than the base"


def test_a_slowdown_within_the_threshold_passes(softmax: ChangedKernel) -> None:
    code, headline, levels = guard(softmax, measured(0.10), Tolerance(threshold=0.15))
    assert (code, levels) == (0, [])
    assert headline == "1 changed kernel: verified, none slower than the base by more than 15%"
    code, headline, _ = guard(softmax, measured(0.10), Tolerance(threshold=0.05))
    assert code == 1 and headline.endswith("1 slower than the base by more than 5%")


def test_warn_only_warns_of_a_slowdown_but_not_of_a_wrong_kernel(
        softmax: ChangedKernel) -> None:
    code, headline, levels = guard(softmax, measured(0.10), Tolerance(0.05, warn_only=True))
    assert (code, levels) == (0, ["warning"])
    assert headline == "1 changed kernel: 1 slower than the base by more than 5% (warn-only)"
    wrong = failed("c", "correctness", "only the last partial block of 128 differs")
    code, headline, levels = guard(softmax, wrong, Tolerance(warn_only=True))
    assert (code, levels) == (1, ["error"])
    assert headline == "1 changed kernel: 1 rejected"


def test_the_settings_are_action_inputs() -> None:
    inputs = read_inputs({"INPUT_SLOWDOWN_THRESHOLD": "5%", "INPUT_WARN_ONLY": "true"})
    assert (inputs.slowdown_threshold, inputs.warn_only) == (0.05, True)
    assert (read_inputs({}).slowdown_threshold, read_inputs({}).warn_only) == (0.0, False)
    with pytest.raises(KfbotError, match=r"action input 'slowdown-threshold' "
                                         r"\(INPUT_SLOWDOWN_THRESHOLD\): not a percentage: "
                                         r"'5' needs a % sign \(try 5%\)"):
        read_inputs({"INPUT_SLOWDOWN_THRESHOLD": "5"})
