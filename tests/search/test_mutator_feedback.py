"""What evaluations teach the LLM mutator's next prompt on an island: the parent's
diagnosis picks the persona, its compiler and verification lines, the island's failures,
the experience file's lessons and the island's strategy hints, which change after a
child that did not improve. Checked on the requests a local Anthropic API server saw."""

from __future__ import annotations

import json
import random
from collections.abc import Iterator
from pathlib import Path

import pytest
from fake_anthropic import FakeAnthropic, Reply

from kfbot.config import load_config
from kfbot.evaluate.candidate import ORIGINAL, Candidate
from kfbot.evaluate.evaluation import Evaluation, ShapeTiming, failed
from kfbot.evaluate.model import Diagnostic
from kfbot.evaluate.task import KernelTask, make_task
from kfbot.evaluate.verdict.stats import compare_times
from kfbot.scan.scanner import scan
from kfbot.scan.select import select_kernel
from kfbot.search.budget import Budget, Limits
from kfbot.search.evolution.archive import Individual
from kfbot.search.evolution.features import cell_of
from kfbot.search.mutators.llm import LlmMutator, LlmSettings, persona_for
from kfbot.search.mutators.rotation import Mutators, diagnosis_of

EXAMPLE = Path(__file__).resolve().parents[2] / "fixtures" / "example"
NOT_AN_EDIT = "I would rather not change anything."


@pytest.fixture
def fake() -> Iterator[FakeAnthropic]:
    with FakeAnthropic() as server:
        yield server


@pytest.fixture(scope="module")
def task() -> KernelTask:
    config = load_config(None, EXAMPLE)
    return make_task(select_kernel(scan(EXAMPLE, config).kernels, "softmax_kernel"),
                     EXAMPLE, config)


def _timing(bound: str) -> ShapeTiming:
    speed = compare_times([10.0 + 0.01 * i for i in range(20)],
                          [9.0 + 0.01 * i for i in range(20)], random.Random(0))
    return ShapeTiming("(4096, 1024) float32", speed, bound=bound)


def _mutators(task: KernelTask, fake: FakeAnthropic) -> Mutators:
    settings = LlmSettings(base_url=fake.base_url, max_retries=0, timeout_s=5.0)
    llm = LlmMutator(settings, Budget(Limits()), api_key="test-key")
    return Mutators(task, (), (), llm, task_text="softmax over rows", batch=1,
                    lessons=("lesson: BLOCK 256 was 1.2x faster on NVIDIA H200",))


def _prompt(fake: FakeAnthropic, n: int = -1) -> str:
    return json.dumps(fake.requests[n].body)


def _parent() -> Individual:
    return Individual(ORIGINAL.hash, None, 0, cell_of([], None), 1.0, "done", "", "original", 0)


def test_diagnosis_is_the_bound_most_shapes_show() -> None:
    ev = Evaluation(ORIGINAL.hash, "done", True, "",
                    timings=(_timing("memory-bound"), _timing("memory-bound"),
                             _timing("latency-bound")))
    assert diagnosis_of(ev) == "memory-bound"
    assert diagnosis_of(failed("x", "build", "no")) == "unknown"


def test_the_parents_evaluation_shapes_the_next_prompt(task: KernelTask,
                                                       fake: FakeAnthropic) -> None:
    mut = _mutators(task, fake)
    rng = random.Random(3)
    ev = Evaluation(ORIGINAL.hash, "done", True, "correct",
                    diagnostics=(Diagnostic("build", "resources", "ptxas: 40 registers",
                                            "info"),),
                    timings=(_timing("memory-bound"),))
    mut.note_result(0, ORIGINAL, ev, improved=False, rng=rng)
    mut.note_result(0, Candidate(files={"x": "y"}, origin="rules"),
                    failed("abc", "correctness", "wrong at row 3"), improved=False, rng=rng)
    fake.script(Reply.text(NOT_AN_EDIT))
    assert mut.propose(2, _parent(), rng) == []  # island 2 asks the llm first
    fake.script(Reply.text(NOT_AN_EDIT))
    mut.propose(0 + 3, _parent(), rng)  # island 3: same order as island 0
    sent = _prompt(fake)
    assert persona_for("memory-bound").persona[:60] in sent
    assert "ptxas: 40 registers" in sent
    assert "BLOCK 256 was 1.2x faster" in sent
    # Failures are kept per island: island 0's failure is not in island 3's prompt.
    assert "wrong at row 3" not in sent
    assert "wrong at row 3" in json.dumps(mut.failures[0])


def test_strategy_hints_change_after_a_child_that_did_not_improve(task: KernelTask,
                                                                  fake: FakeAnthropic) -> None:
    mut = _mutators(task, fake)
    rng = random.Random(5)
    fake.script(Reply.text(NOT_AN_EDIT))
    mut.propose(2, _parent(), rng)
    before = mut.meta[2]
    assert before.splitlines()[0] in _prompt(fake)
    child = Candidate(files={"csrc/softmax.cu": "// changed"}, origin="llm")
    kept = Evaluation(child.hash, "done", True, "", timings=(_timing("compute-bound"),))
    mut.note_result(2, child, kept, improved=True, rng=rng)
    assert mut.meta[2] == before  # hints that led to an improvement stay
    mut.note_result(2, child, kept, improved=False, rng=rng)
    assert mut.meta[2] != before
    fake.script(Reply.text(NOT_AN_EDIT))
    mut.propose(2, _parent(), rng)
    assert mut.meta[2].splitlines()[-1] in _prompt(fake)


def test_the_search_teaches_the_mutators_what_each_result_showed(task: KernelTask,
                                                                  fake: FakeAnthropic) -> None:
    from kfbot.search.runner import _learner

    mut = _mutators(task, fake)
    child = Candidate(files={"csrc/softmax.cu": "// tried"}, origin="llm",
                      parent=ORIGINAL.hash)
    mut.candidates[child.hash] = child
    slower = failed(child.hash, "correctness", "wrong at row 9")
    shown: list[Individual] = []
    learn = _learner(mut, {child.hash: slower}, random.Random(1), shown.append)
    mut.meta[1] = "Make small, safe edits: one idea per proposal."
    ind = Individual(child.hash, ORIGINAL.hash, 1, cell_of([], None), None, "correctness",
                     "wrong at row 9", "llm", 1)
    learn(ind)
    assert shown == [ind]
    assert mut.findings[child.hash][0] == "unknown"
    assert any("wrong at row 9" in f for f in mut.failures[1])
    assert mut.meta[1] != "Make small, safe edits: one idea per proposal."
