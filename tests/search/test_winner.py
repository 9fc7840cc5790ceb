"""The committed candidate changes files only; a faster one with build parameters is a
suggestion that names the line of the repository's build and the flag to add there."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from kfbot.config import load_config
from kfbot.evaluate.candidate import NVCC_FLAGS_PARAM, Candidate
from kfbot.evaluate.evaluation import Evaluation, ShapeTiming, failed
from kfbot.evaluate.task import KernelTask, make_task
from kfbot.evaluate.verdict.stats import compare_times
from kfbot.scan.scanner import scan
from kfbot.scan.select import select_kernel
from kfbot.search.outcome.winner import (
    CONFIRMATIONS,
    build_edits,
    committable,
    confirm,
    near_miss,
    needs_parameters,
)

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures"


def _faster(cand: Candidate, speedup: float) -> Evaluation:
    base = [10.0 + 0.01 * i for i in range(30)]
    timing = ShapeTiming("(1024,) float32",
                         compare_times(base, [b / speedup for b in base], random.Random(0)))
    return Evaluation(cand.hash, "done", True, "correct", timings=(timing,))


def _task(fixture: str, kernel: str) -> KernelTask:
    root = FIXTURES / fixture
    config = load_config(None, root)
    return make_task(select_kernel(scan(root, config).kernels, kernel), root, config)


FLAGS = Candidate(files={"k.cu": "// block 32"}, params={NVCC_FLAGS_PARAM: "--use_fast_math"},
                  origin="rules")
FILES = Candidate(files={"k.cu": "// block 64"}, origin="params")
SLOWER_FILES = Candidate(files={"k.cu": "// block 128"}, origin="params")
WRONG = Candidate(files={"k.cu": "// wrong"}, origin="llm")


def test_the_fastest_file_only_publishable_candidate_is_committed() -> None:
    task = _task("load_elementwise", "gelu_kernel")
    cands = {c.hash: c for c in (FLAGS, FILES, SLOWER_FILES, WRONG)}
    evals = {FLAGS.hash: _faster(FLAGS, 1.25), FILES.hash: _faster(FILES, 1.14),
             SLOWER_FILES.hash: _faster(SLOWER_FILES, 1.05),
             WRONG.hash: failed(WRONG.hash, "correctness", "wrong at row 3")}
    chosen = committable(evals, cands)
    assert chosen is not None and chosen[1] == FILES
    found = needs_parameters(task, evals, cands, chosen)
    assert found is not None and found.candidate == FLAGS
    assert found.evaluation.speedup is not None and found.evaluation.speedup > 1.2
    assert found.edits == ('add "--use_fast_math" to `extra_cuda_cflags` of the load() call '
                           "at `elementwise.py:17`: `return load(`",)
    slower = {**evals, FLAGS.hash: _faster(FLAGS, 1.10)}
    assert needs_parameters(task, slower, cands, chosen) is None  # not faster: no section


def test_nothing_to_commit_when_only_flag_changes_are_faster() -> None:
    task = _task("load_elementwise", "gelu_kernel")
    cands = {FLAGS.hash: FLAGS, WRONG.hash: WRONG}
    evals = {FLAGS.hash: _faster(FLAGS, 1.25),
             WRONG.hash: failed(WRONG.hash, "correctness", "wrong")}
    assert committable(evals, cands) is None
    found = needs_parameters(task, evals, cands, None)
    assert found is not None and found.candidate == FLAGS


def test_build_edits_name_the_setup_line_and_the_define_to_change() -> None:
    task = _task("setup_rowsum", "rowsum_kernel")
    edits = build_edits(task, {"BLOCK_SIZE": "512", NVCC_FLAGS_PARAM: "--use_fast_math"})
    assert edits[0].startswith('add "--use_fast_math" to `extra_compile_args["nvcc"]` of the '
                               "CUDAExtension at `setup.py:8`: `")
    assert edits[1].startswith("change `-DBLOCK_SIZE=256` to `-DBLOCK_SIZE=512` in the "
                               "CUDAExtension at `setup.py:8`")


def test_a_define_the_build_does_not_set_can_go_in_the_build_or_the_default() -> None:
    task = _task("example", "softmax_kernel")
    (edit,) = build_edits(task, {"EXTRA": "4"})
    assert edit.startswith("set `-DEXTRA=4` in `extra_cuda_cflags` as `-D` of the load() call "
                           "at `kernels_demo/__init__.py:23`")
    matmul = _task("tunables_matmul", "matmul_tiled")
    (tile,) = build_edits(matmul, {"TILE": "32"})
    assert tile.startswith("change `-DTILE=16` to `-DTILE=32` in the load() call at "
                           "`matmul_ops.py:17`")


def test_the_committed_numbers_are_a_second_evaluation_of_the_chosen_code() -> None:
    cands = {c.hash: c for c in (FLAGS, FILES, SLOWER_FILES)}
    evals = {FLAGS.hash: _faster(FLAGS, 1.25), FILES.hash: _faster(FILES, 1.30),
             SLOWER_FILES.hash: _faster(SLOWER_FILES, 1.10)}
    asked: list[Candidate] = []

    def again(cand: Candidate) -> Evaluation:
        asked.append(cand)
        return _faster(cand, 1.22)  # the search's figure of its fastest leant high

    found = confirm(evals, cands, again)
    assert asked == [FILES]  # the flag candidate is never committed, so never re-timed
    assert found.committed is not None and found.committed[1] == FILES
    assert found.committed[0].speedup == pytest.approx(1.22, rel=1e-3)
    assert found.search_speedup == pytest.approx(1.30, rel=1e-3)
    assert found.dropped == ()


def test_a_candidate_that_fails_its_second_evaluation_is_not_committed() -> None:
    cands = {c.hash: c for c in (FILES, SLOWER_FILES)}
    evals = {FILES.hash: _faster(FILES, 1.30), SLOWER_FILES.hash: _faster(SLOWER_FILES, 1.10)}

    def again(cand: Candidate) -> Evaluation:
        if cand == FILES:
            return failed(cand.hash, "correctness", "wrong at (7, 33) on the second run")
        return _faster(cand, 1.09)

    found = confirm(evals, cands, again)
    assert found.committed is not None and found.committed[1] == SLOWER_FILES
    (line,) = found.dropped
    assert line.startswith(f"`{FILES.short}` (1.30x in the search) was correctness")
    assert "wrong at (7, 33) on the second run" in line
    # Within noise on its second evaluation: not significantly faster, not committed.
    many = [Candidate(files={"k.cu": f"// {i}"}, origin="params") for i in range(5)]
    evals = {c.hash: _faster(c, 1.2 + 0.01 * i) for i, c in enumerate(many)}
    found = confirm(evals, {c.hash: c for c in many}, lambda c: _faster(c, 1.0))
    assert found.committed is None and len(found.dropped) == CONFIRMATIONS
    assert all("was noise when timed again" in line for line in found.dropped)


def _mixed(cand: Candidate) -> Evaluation:
    """3x on a large shape, 5.7 µs -> 8.6 µs on a small one: faster overall, not committable."""
    rng = random.Random(0)
    big = [400.0 + 0.1 * i for i in range(30)]
    small = [5.7 + 0.001 * i for i in range(30)]
    return Evaluation(cand.hash, "done", True, "correct", timings=(
        ShapeTiming("(1024, 1024) x (1024, 1024) float32",
                    compare_times(big, [b / 3 for b in big], rng)),
        ShapeTiming("(65, 33) x (33, 17) float32",
                    compare_times(small, [s * 8.6 / 5.7 for s in small], rng))))


def test_nothing_committed_says_which_shape_kept_the_fastest_out() -> None:
    mixed = Candidate(files={"k.cu": "// tiled"}, origin="rules", rationale="register tiling")
    cands = {c.hash: c for c in (mixed, FLAGS)}
    evals = {mixed.hash: _mixed(mixed), FLAGS.hash: _faster(FLAGS, 1.25)}
    assert committable(evals, cands) is None
    said = near_miss(evals, cands)
    assert said == (f"the fastest correct candidate, `{mixed.short}` (rules: register tiling), "
                    "is 1.41x overall but significantly slower on (65, 33) x (33, 17) float32: "
                    "5.71 µs -> 8.62 µs (0.66x)")
    assert near_miss({FLAGS.hash: evals[FLAGS.hash]}, cands) is None  # flags: a suggestion
