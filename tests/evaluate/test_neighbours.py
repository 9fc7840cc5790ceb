"""Changes to code shared with another kernel (kfbot/evaluate/neighbours.py): the other
kernel's op becomes the task's neighbour, a candidate that changes what both use is kept
for verification against both references, and one that reaches a kernel with no op to
verify, or code only the other kernel uses, is rejected before any build. The GPU side
(both ops run with the candidate) is tests/evaluate/test_neighbours_gpu.py."""

from __future__ import annotations

import random
import shutil
from dataclasses import replace
from pathlib import Path

import pytest

from kfbot.config import load_config
from kfbot.evaluate.candidate import Candidate
from kfbot.evaluate.engine import Engine, EngineSettings
from kfbot.evaluate.evaluation import Evaluation, ShapeTiming, failed
from kfbot.evaluate.neighbours import Neighbours
from kfbot.evaluate.scope import reaches
from kfbot.evaluate.task import KernelTask, make_task
from kfbot.evaluate.verdict.stats import compare_times
from kfbot.scan.scanner import scan
from kfbot.scan.select import select_kernel

FIXTURE = Path(__file__).resolve().parents[2] / "fixtures" / "shared_device_fn"
PATH = "csrc/activations.cu"
SOURCE = (FIXTURE / PATH).read_text()
# The same function, its arithmetic regrouped: the change both kernels see.
REGROUPED = SOURCE.replace("return 0.5f * v * (1.0f + tanhf(inner));",
                           "return v * (0.5f + 0.5f * tanhf(inner));")


def _task(root: Path, kernel: str = "gelu_kernel") -> KernelTask:
    config = load_config(None, root)
    kernels = scan(root, config).kernels
    return make_task(select_kernel(kernels, kernel), root, config, kernels)


def _static(task: KernelTask, text: str, tmp_path: Path) -> list[str]:
    with Engine(task, EngineSettings(cache_dir=tmp_path / "cache")) as engine:
        found = engine.static_check(Candidate(files={PATH: text}, origin="user"))
    return [f"{f.severity} {f.line()}" for f in found if f.check == "edit-scope"]


def test_the_other_kernel_of_the_build_is_the_tasks_neighbour() -> None:
    task = _task(FIXTURE)
    assert [n.kernel_name for n in task.neighbours] == ["bias_gelu_kernel"]
    assert task.neighbours[0].references and task.neighbours[0].neighbours == ()
    config = load_config(None, FIXTURE)
    alone = make_task(select_kernel(scan(FIXTURE, config).kernels, "gelu_kernel"), FIXTURE,
                      config)
    assert alone.neighbours == ()  # without the scan's other kernels, none


def test_a_change_to_shared_code_is_kept_for_both_references(tmp_path: Path) -> None:
    assert _static(_task(FIXTURE), REGROUPED, tmp_path) == [
        "warn [edit-scope] changes device function gelu_tanh, which bias_gelu_kernel uses "
        "too: bias_gelu_kernel's op is verified against its reference as well "
        "(csrc/activations.cu:8)"]


def test_code_only_the_other_kernel_uses_stays_out_of_scope(tmp_path: Path) -> None:
    changed = SOURCE.replace("y[i] = gelu_tanh(x[i] + bias[i % cols]);",
                             "y[i] = gelu_tanh(bias[i % cols] + x[i]);")
    [line] = _static(_task(FIXTURE), changed, tmp_path)
    assert line.startswith("strict [edit-scope] changes kernel bias_gelu_kernel, which only "
                           "bias_gelu_kernel uses; this task verifies gelu_kernel")


def test_shared_code_of_a_kernel_without_a_reference_stays(tmp_path: Path) -> None:
    root = tmp_path / "repo"
    shutil.copytree(FIXTURE, root)
    (root / "tests" / "test_bias_gelu.py").unlink()
    task = _task(root)
    assert task.neighbours == ()
    [line] = _static(task, REGROUPED, tmp_path)
    assert line == ("strict [edit-scope] changes device function gelu_tanh, which "
                    "bias_gelu_kernel uses too, and bias_gelu_kernel has no op kfbot can "
                    "verify (no reference test pairs with it): code shared with it must "
                    "stay as it is (csrc/activations.cu:8)")


class RecordedEngine:
    """A neighbour's engine answering with recorded evaluations: the verdict logic
    without a GPU (the real one runs in tests/evaluate/test_neighbours_gpu.py)."""

    def __init__(self, baseline: Evaluation, answer: Evaluation) -> None:
        self.answers = {"baseline": baseline, "shared": answer}
        self.asked: list[str] = []
        self.closed = False

    def baseline(self) -> Evaluation:
        self.asked.append("baseline")
        return self.answers["baseline"]

    def evaluate_shared(self, candidate: Candidate, bench: bool = True) -> Evaluation:
        self.asked.append(f"shared {candidate.short} bench={bench}")
        return self.answers["shared"]

    def __exit__(self, *exc: object) -> None:
        self.closed = True


def _ok(digest: str, ratio: float = 1.0) -> Evaluation:
    base = [10.0 + 0.01 * i for i in range(40)]
    timing = ShapeTiming("x[256x1024]", compare_times(base, [t / ratio for t in base],
                                                        random.Random(0)))
    return Evaluation(digest, "done", True, "correct on 12 checks", timings=(timing,))


@pytest.mark.parametrize(("answer", "expected"), [
    (_ok("n"), "ok: bias_gelu_kernel"),
    (failed("n", "correctness", "x[33x100] vs reference: 3 of 3300 differ"),
     "correctness: changes code bias_gelu_kernel uses too, and "
     "csrc/activations.cu::bias_gelu_kernel's op then fails: x[33x100] vs reference"),
    (_ok("n", ratio=0.5), "benchmark: changes code bias_gelu_kernel uses too, and "
     "csrc/activations.cu::bias_gelu_kernel's op is slower with it at x[256x1024] (0.500x)"),
])
def test_the_neighbours_verdict(answer: Evaluation, expected: str) -> None:
    task = _task(FIXTURE)
    engine = RecordedEngine(_ok("b"), answer)
    neighbours = Neighbours(task.neighbours, lambda t: engine)
    cand = Candidate(files={PATH: REGROUPED}, origin="user")
    scope = neighbours.scope(reaches(task, cand))
    assert scope.verify == ("bias_gelu_kernel",)
    got = neighbours.verify(cand, scope.verify, _ok(cand.hash, ratio=1.5))
    assert got.candidate == cand.hash
    said = f"ok: {got.findings[-1].evidence}" if got.ok else f"{got.stage}: {got.reason}"
    assert said.startswith(expected)
    assert engine.asked == ["baseline", f"shared {cand.short} bench=True"]
    neighbours.verify(cand, scope.verify, _ok(cand.hash))
    assert engine.asked.count("baseline") == 1  # the neighbour's baseline runs once
    neighbours.close()
    assert engine.closed


def test_a_neighbour_whose_original_fails_cannot_vouch() -> None:
    task = _task(FIXTURE)
    engine = RecordedEngine(failed("o", "baseline", "capture: no call of the op"), _ok("n"))
    neighbours = Neighbours(task.neighbours, lambda t: engine)
    cand = Candidate(files={PATH: REGROUPED}, origin="user")
    got = neighbours.verify(cand, ("bias_gelu_kernel",), _ok(cand.hash))
    assert not got.ok and got.stage == "static"
    assert "its original fails its own reference (capture: no call of the op)" in got.reason
    assert engine.asked == ["baseline"]


def test_the_neighbours_task_is_not_given_neighbours_of_its_own(tmp_path: Path) -> None:
    task = _task(FIXTURE)
    with Engine(task, EngineSettings(cache_dir=tmp_path)) as engine:
        neighbour = engine._neighbour(replace(task.neighbours[0]))
        assert neighbour.task.neighbours == () and neighbour.builder is engine.builder
