"""The size dispatch (kfbot/search/outcome/dispatch.py, heldout.dispatch_where_slower): a
candidate slower than the original at held-out sizes keeps the original there, by a
threshold on a launcher parameter that the evaluations, not a guess, pick; the copy of
the original is the original (with the constants the candidate changed written back),
and the output compiles."""

from __future__ import annotations

import random
from collections.abc import Sequence
from pathlib import Path

import pytest
from cuda_compile import NVCC, compile_all

from kfbot.config import load_config
from kfbot.evaluate.candidate import Candidate
from kfbot.evaluate.capture.signature import CallSignature, TensorSpec
from kfbot.evaluate.evaluation import Evaluation, ShapeTiming, shape_timings
from kfbot.evaluate.task import KernelTask, make_task
from kfbot.scan.scanner import scan
from kfbot.scan.select import select_kernel
from kfbot.search.outcome.dispatch import Split, size_dispatches, split_of
from kfbot.search.outcome.heldout import dispatch_where_slower
from kfbot.search.rewrites.registry import SOURCE_REWRITES
from kfbot.search.rewrites.syntax import Target

REAL = Path(__file__).resolve().parents[2] / "fixtures" / "naive_real"
FILE = "csrc/layernorm.cu"


def _sig(rows: int, cols: int = 1024) -> CallSignature:
    t = TensorSpec((rows, cols), "float32", (cols, 1), True, "cuda")
    return CallSignature("ops.layernorm", (t,))


def _timing(rows: int, ratio: float, seed: int = 0) -> ShapeTiming:
    rng = random.Random(seed + rows)
    base = [50.0 + rng.gauss(0, 0.05) for _ in range(20)]
    [t] = shape_timings([{"input": f"({rows}, 1024) float32", "original_us": base,
                          "candidate_us": [b / ratio for b in base],
                          "signature": _sig(rows).to_json()}], 0, None)
    return t


def test_one_threshold_between_the_sizes_it_loses_and_wins_at() -> None:
    wins = [_timing(64, 3.0), _timing(4096, 2.0)]
    assert split_of([*wins, _timing(16384, 0.8)]) == Split(8192, True)
    assert split_of([_timing(16, 0.7), *wins]) == Split(32, False)
    assert "lie among" in str(split_of([_timing(16, 0.7), *wins, _timing(16384, 0.8)]))
    assert split_of(wins) == "the candidate is slower nowhere"


def _task() -> KernelTask:
    config = load_config(None, REAL)
    return make_task(select_kernel(scan(REAL, config).kernels, "layernorm_kernel"), REAL,
                     config)


def _warp_candidate() -> Candidate:
    text = (REAL / FILE).read_text().replace("#define LN_THREADS 128", "#define LN_THREADS 64")
    new = SOURCE_REWRITES["warp_per_row"](text, Target("layernorm_kernel"))
    assert new is not None
    return Candidate(files={FILE: new}, origin="rules", rationale="warp-per-row: a warp a row")


def _dispatches() -> list[Candidate]:
    cand = _warp_candidate()
    original = {FILE: (REAL / FILE).read_text()}
    made = size_dispatches({**original, **cand.files}, original, FILE, "layernorm_kernel",
                           cand, Split(8192, True))
    assert not isinstance(made, str), made
    return made


def test_a_dispatch_per_integer_parameter_of_the_launcher() -> None:
    made = _dispatches()
    assert [c.rationale.split(",")[0] for c in made] == [
        "size dispatch: the original where (rows) >= 8192",
        "size dispatch: the original where (cols) >= 8192"]
    text = made[0].files[FILE]
    assert ("if ((rows) >= 8192) return launch_layernorm_kfbot_orig(x, gamma, beta, y, rows, "
            "cols, eps);") in text
    copy = text[text.index("__global__ void layernorm_kernel_kfbot_orig"):]
    # The original's block size, though the candidate changed the #define.
    assert "layernorm_kernel_kfbot_orig<<<blocks, 128>>>" in copy
    assert "const int blocks = (rows + 128 - 1) / 128;" in copy
    assert "row_mean(in, cols)" in copy  # the original's own kernel, helpers and all
    assert made[0].parent == _warp_candidate().hash


@pytest.mark.skipif(NVCC is None, reason="nvcc not on PATH")
def test_the_dispatches_compile(tmp_path: Path) -> None:
    out = compile_all({f"d{i}": c.files[FILE] for i, c in enumerate(_dispatches())}, tmp_path)
    assert out == {"d0": "", "d1": ""}


class _Engine:
    """Evaluations as a GPU would give them: the rows dispatch is even at the large held-out
    size; the cols one (whose threshold the calls never reach) still loses there."""

    def __init__(self) -> None:
        self.task = _task()
        self.asked: list[str] = []

    def signatures(self) -> list[CallSignature]:
        return [_sig(64), _sig(4096)]

    def evaluate(self, candidate: Candidate) -> Evaluation:
        self.asked.append(f"captured {candidate.rationale[:45]}")
        return Evaluation(candidate.hash, "done", True, "correct",
                          timings=(_timing(64, 3.0), _timing(4096, 2.0)))

    def evaluate_at(self, candidate: Candidate, signatures: Sequence[CallSignature]
                    ) -> Evaluation:
        self.asked.append(f"held out {candidate.rationale[:45]}")
        large = 1.0 if "(rows)" in candidate.rationale else 0.8
        return Evaluation(candidate.hash, "done", True, "correct",
                          timings=(_timing(16, 2.5), _timing(1024, 2.0), _timing(16384, large)))


def test_the_evaluations_pick_the_dispatch_that_loses_nowhere() -> None:
    engine = _Engine()
    cand = _warp_candidate()
    committed = (engine.evaluate(cand), cand)
    held = Evaluation(cand.hash, "done", True, "correct",
                      timings=(_timing(16, 2.5), _timing(1024, 2.0), _timing(16384, 0.8)))
    found = dispatch_where_slower(engine, committed, held)
    assert not isinstance(found, str), found
    (ev, chosen), again = found
    assert chosen.rationale.startswith("size dispatch: the original where (rows) >= 8192")
    assert ev.publishable and again.timings[-1].speedup.verdict != "slower"
    # Both were tried in order; the rows one first, and it held.
    assert engine.asked[1:] == ["captured size dispatch: the original where (rows) >= 8",
                                "held out size dispatch: the original where (rows) >= 8"]
