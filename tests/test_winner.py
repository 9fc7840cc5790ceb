"""The committed candidate changes files only; a faster one with build flags is noted."""

from __future__ import annotations

import random

from kfbot.evaluate.candidate import NVCC_FLAGS_PARAM, Candidate
from kfbot.evaluate.evaluation import Evaluation, ShapeTiming, failed
from kfbot.evaluate.stats import compare_times
from kfbot.search.winner import committable, params_note


def _faster(cand: Candidate, speedup: float) -> Evaluation:
    base = [10.0 + 0.01 * i for i in range(30)]
    timing = ShapeTiming("(1024,) float32",
                         compare_times(base, [b / speedup for b in base], random.Random(0)))
    return Evaluation(cand.hash, "done", True, "correct", timings=(timing,))


FLAGS = Candidate(files={"k.cu": "// block 32"}, params={NVCC_FLAGS_PARAM: "--use_fast_math"},
                  origin="rules")
FILES = Candidate(files={"k.cu": "// block 64"}, origin="params")
SLOWER_FILES = Candidate(files={"k.cu": "// block 128"}, origin="params")
WRONG = Candidate(files={"k.cu": "// wrong"}, origin="llm")


def test_the_fastest_file_only_publishable_candidate_is_committed() -> None:
    cands = {c.hash: c for c in (FLAGS, FILES, SLOWER_FILES, WRONG)}
    evals = {FLAGS.hash: _faster(FLAGS, 1.25), FILES.hash: _faster(FILES, 1.14),
             SLOWER_FILES.hash: _faster(SLOWER_FILES, 1.05),
             WRONG.hash: failed(WRONG.hash, "correctness", "wrong at row 3")}
    chosen = committable(evals, cands)
    assert chosen is not None and chosen[1] == FILES
    note = params_note(FLAGS, chosen[1])
    assert note is not None and "--use_fast_math" in note and "file-only" in note
    assert params_note(FILES, FILES) is None


def test_nothing_to_commit_when_only_flag_changes_are_faster() -> None:
    cands = {FLAGS.hash: FLAGS, WRONG.hash: WRONG}
    evals = {FLAGS.hash: _faster(FLAGS, 1.25),
             WRONG.hash: failed(WRONG.hash, "correctness", "wrong")}
    assert committable(evals, cands) is None
    note = params_note(FLAGS, None)
    assert note is not None and "no branch" in note
