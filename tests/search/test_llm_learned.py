"""The LLM mutator sees what the other mutators learned, and the run records what the
LLM cost per improvement: a whole search over fixtures/naive_real's layer norm with the
real anthropic SDK talking to the local fake Messages API (rate limits and overloads
included), its candidates answered by a scripted executor instead of a GPU."""

from __future__ import annotations

import json
import random
import shutil
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest
from fake_anthropic import FakeAnthropic, Reply

from kfbot.config import load_config
from kfbot.evaluate.candidate import Candidate
from kfbot.evaluate.evaluation import Evaluation, failed, shape_timings
from kfbot.evaluate.model import Diagnostic
from kfbot.evaluate.task import KernelTask, make_task
from kfbot.scan.scanner import scan
from kfbot.scan.select import select_kernel
from kfbot.search.budget import Budget, Limits
from kfbot.search.mutators.llm import LlmMutator, LlmSettings
from kfbot.search.plan import OptimizeSettings
from kfbot.search.runner import optimize

pytest.importorskip("anthropic")

REAL = Path(__file__).resolve().parents[2] / "fixtures" / "naive_real"
FILE = "csrc/layernorm.cu"
BROKEN = "block-per-row"  # its candidates are answered as a build failure
PEAKS = {"bandwidth_bytes_per_s": 3.0e12, "fp32_flop_per_s": 5.0e13}
ANSWER = f"""\
Keep the inverse standard deviation in a register reused by the whole row.

{FILE}
<<<<<<< SEARCH
    float inv = rsqrtf(var + eps);
=======
    const float inv = rsqrtf(var + eps);
>>>>>>> REPLACE
"""


class _Gpu:
    def __init__(self) -> None:
        self.device: dict[str, Any] = {"gpu": "scripted", "peaks": PEAKS}

    def adequacy(self) -> None:
        return None


class _Scripted:
    """LLM candidates 1.5x faster, the broken rewrite a compile error, the rest noise."""

    def evaluate(self, cands: Sequence[Candidate]) -> list[tuple[Candidate, Evaluation]]:
        return [(c, self._one(c)) for c in cands]

    def _one(self, cand: Candidate) -> Evaluation:
        if cand.origin == "rules" and cand.rationale.startswith(BROKEN + ":"):
            error = Diagnostic("build", "compile_error", "identifier \"kfbot_tid\" is undefined",
                               file=FILE, line=12)
            return failed(cand.hash, "build", "nvcc failed", (error,))
        rng = random.Random(cand.hash)
        ratio = 1.5 if cand.origin == "llm" else 1.0
        base = [20.0 + rng.gauss(0, 0.02) for _ in range(20)]
        timings = shape_timings([{"input": "(4096, 1024) float32", "original_us": base,
                                  "candidate_us": [t / ratio for t in base],
                                  "bytes": 2 * 4096 * 1024 * 4}], 0, PEAKS)
        return Evaluation(cand.hash, "done", True, "correct", timings=timings)

    def close(self) -> None:
        """Nothing to release."""


@pytest.fixture
def fake() -> Iterator[FakeAnthropic]:
    with FakeAnthropic() as server:
        yield server


@pytest.fixture
def task(tmp_path: Path) -> KernelTask:
    root = tmp_path / "repo"
    shutil.copytree(REAL, root)
    config = load_config(None, root)
    return make_task(select_kernel(scan(root, config).kernels, "layernorm_kernel"), root,
                     config)


def _run(task: KernelTask, fake: FakeAnthropic, tmp_path: Path, evaluations: int
         ) -> dict[str, Any]:
    settings = LlmSettings(base_url=fake.base_url, max_retries=0, timeout_s=5.0)
    llm = LlmMutator(settings, Budget(Limits(None, None, None, None)), api_key="k")
    optimize(task, _Gpu(), OptimizeSettings(islands=3, seed=2, evaluations=evaluations),
             tmp_path / "run", llm, None, _Scripted())
    return dict(json.loads((tmp_path / "run" / "report.json").read_text()))


def test_the_prompt_holds_failed_rewrites_and_the_per_shape_picture(
        task: KernelTask, fake: FakeAnthropic, tmp_path: Path) -> None:
    fake.default = Reply.text(ANSWER, input_tokens=1000, output_tokens=200)
    report = _run(task, fake, tmp_path, 16)
    prompts = [r.body["messages"][0]["content"] for r in fake.requests]
    later = [p for p in prompts if "Rewrites already tried on this kernel" in p]
    assert later, "no prompt named the failed rewrite"
    assert (f"{BROKEN}: its output does not compile: {FILE}:12: identifier \"kfbot_tid\" "
            "is undefined") in later[-1]
    shaped = "".join(p for p in prompts if "## Per shape" in p)
    # A parent's picture: its speedup per shape with the interval, then its distance to
    # the speed of light there.
    assert "- (4096, 1024) float32 (captured): 1." in shaped
    assert "- (4096, 1024) float32: " in shaped
    assert "% of the speed of light (memory floor" in shaped
    # The broken rewrite is dropped: evaluated once, never proposed again.
    broken = [h for h in report["history"] if h["reason"] == "nvcc failed"]
    assert len(broken) == 1
    assert report["dropped_rewrites"] == {
        BROKEN: f"{FILE}:12: identifier \"kfbot_tid\" is undefined"}
    text = (tmp_path / "run" / "report.md").read_text()
    assert "## Rewrites dropped" in text and f"`{BROKEN}`" in text


def test_tokens_and_cost_per_improvement_with_errors_and_rate_limits(
        task: KernelTask, fake: FakeAnthropic, tmp_path: Path) -> None:
    fake.script(Reply.error(429, "rate limited", retry_after="0"),
                Reply.error(529, "overloaded"),
                Reply.text("No edit this time, only prose.", input_tokens=500,
                           output_tokens=40))
    fake.default = Reply.text(ANSWER, input_tokens=1000, output_tokens=200,
                              cache_read_input_tokens=3000)
    report = _run(task, fake, tmp_path, 32)
    spend = report["llm"]
    assert spend["errors"] == {"OverloadedError": 1, "RateLimitError": 1}
    # After each error the LLM sits out turns (2, then 4) rather than being asked again
    # for every parent the islands try.
    assert spend["calls"] == len(fake.requests) and spend["answered"] == spend["calls"] - 2
    assert spend["unusable"] >= 1  # the prose answer, and repeats of an applied edit
    good = spend["answered"] - 1
    assert spend["input_tokens"] == 500 + 1000 * good
    assert spend["tokens"] == 540 + 4200 * good
    # Each distinct LLM child is 1.5x its parent: an accepted improvement.
    assert spend["improvements"] >= 1
    assert spend["tokens_per_improvement"] == round(spend["tokens"] / spend["improvements"])
    assert spend["usd_per_improvement"] == pytest.approx(spend["usd"] / spend["improvements"],
                                                         abs=1e-6)
    text = (tmp_path / "run" / "report.md").read_text()
    assert "## LLM mutator" in text and "1 RateLimitError" in text
    assert f"{spend['tokens_per_improvement']} tokens and $" in text


def test_no_improvement_says_what_was_spent_for_nothing(
        task: KernelTask, fake: FakeAnthropic, tmp_path: Path) -> None:
    fake.default = Reply.error(429, "rate limited", retry_after="0")
    report = _run(task, fake, tmp_path, 8)
    spend = report["llm"]
    assert spend["improvements"] == 0 and spend["tokens_per_improvement"] is None
    assert spend["errors"] == {"RateLimitError": spend["calls"]}
    assert "for no improvement" in (tmp_path / "run" / "report.md").read_text()


def test_after_api_errors_the_llm_sits_out_turns(task: KernelTask,
                                                  fake: FakeAnthropic) -> None:
    from kfbot.evaluate.candidate import ORIGINAL
    from kfbot.search.mutators.rotation import Mutators

    fake.default = Reply.error(429, "rate limited", retry_after="0")
    settings = LlmSettings(base_url=fake.base_url, max_retries=0, timeout_s=5.0)
    llm = LlmMutator(settings, Budget(Limits(None, None, None, None)), api_key="k")
    mut = Mutators(task, (), (), llm)
    files = mut.base_files()
    asked = []
    for _ in range(8):
        mut._one("llm", 0, ORIGINAL, files, random.Random(0))
        asked.append(len(fake.requests))
    # Called, 2 turns out, called, 4 turns out.
    assert asked == [1, 1, 1, 2, 2, 2, 2, 2]
    fake.default = Reply.text(ANSWER)
    for _ in range(8):
        mut._one("llm", 0, ORIGINAL, files, random.Random(0))
    assert len(fake.requests) == 2 + 8  # the pause is over: every turn asks, and is answered
