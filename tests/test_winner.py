"""The committed candidate changes files only; a faster one with build parameters is a
suggestion that names the line of the repository's build and the flag to add there."""

from __future__ import annotations

import random
from pathlib import Path

from kfbot.config import load_config
from kfbot.evaluate.candidate import NVCC_FLAGS_PARAM, Candidate
from kfbot.evaluate.evaluation import Evaluation, ShapeTiming, failed
from kfbot.evaluate.stats import compare_times
from kfbot.evaluate.task import KernelTask, make_task
from kfbot.scan.scanner import scan
from kfbot.scan.select import select_kernel
from kfbot.search.winner import build_edits, committable, needs_parameters

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"


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
