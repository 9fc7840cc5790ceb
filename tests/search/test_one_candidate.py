"""One candidate, one set of numbers: a replayed search on the example repository whose
fastest candidate needs a build parameter (`--use_fast_math`) commits the fastest one
that changes files only, and the report's headline and table, report.json, best.patch,
the lesson and the branch all name and measure that one candidate. The faster one gets
a section of its own with the build edit that would carry its flag."""

from __future__ import annotations

import json
import random
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest

from kfbot.config import Config
from kfbot.evaluate.candidate import ORIGINAL, Candidate, content_hash
from kfbot.evaluate.capture.signature import CallSignature, TensorSpec
from kfbot.evaluate.evaluation import Evaluation, ShapeTiming, failed
from kfbot.evaluate.task import KernelTask, make_task
from kfbot.evaluate.verdict.stats import compare_times
from kfbot.scan.scanner import scan
from kfbot.scan.select import select_kernel
from kfbot.search.executors.local import ReplayExecutor
from kfbot.search.mutators.rotation import Mutators
from kfbot.search.plan import OptimizeSettings
from kfbot.search.rewrites import load_rewrites, propose_rewrites
from kfbot.search.runfolder import read_record
from kfbot.search.runner import OptimizeOutcome, credited, headline, lineage, optimize

EXAMPLE = Path(__file__).resolve().parents[2] / "fixtures" / "example"
SHAPES = ((4096, 1024), (7, 33))


def _git(cwd: Path, *args: str) -> str:
    return subprocess.run(["git", *args], cwd=cwd, check=True, capture_output=True,
                          text=True).stdout.strip()


def _signature(shape: tuple[int, ...]) -> CallSignature:
    strides = (*shape[1:], 1)
    x = TensorSpec(shape, "float32", strides, True, "cuda", -4.0, 4.0, 0.0, std=1.0)
    return CallSignature("kernels_demo.softmax", (x,))


def _measured(cand: Candidate, speedup: float) -> Evaluation:
    timings = []
    for i, shape in enumerate(SHAPES):
        base = [100.0 + 0.01 * k for k in range(40)]
        times = compare_times(base, [b / speedup for b in base], random.Random(i))
        timings.append(ShapeTiming(f"{shape} float32", times,
                                   signature=_signature(shape).to_json()))
    return Evaluation(cand.hash, "done", True, "correct on 12 checks", timings=tuple(timings),
                      environment={"gpu": "NVIDIA H200"})


class _Gpu:
    """What the search reads of the GPU before it starts (a `GpuFacts`)."""

    def __init__(self) -> None:
        self.device: dict[str, Any] = {"cuda": True, "gpu": "NVIDIA H200"}

    def adequacy(self) -> None:
        return None


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> tuple[KernelTask, OptimizeOutcome, Path,
                                                            dict[str, Candidate]]:
    root = tmp_path_factory.mktemp("one") / "example"
    shutil.copytree(EXAMPLE, root)
    _git(root, "init", "-q")
    _git(root, "add", "-A")
    _git(root, "-c", "user.name=O", "-c", "user.email=o@x", "commit", "-qm", "example")
    task = make_task(select_kernel(scan(root, Config()).kernels, "softmax_kernel"), root,
                     Config())
    mut = Mutators(task, (), load_rewrites())
    rules = {c.rationale.split(":")[0]: c for c in
             propose_rewrites(mut.base_files(), task.editable_files, ORIGINAL, task.kernel_id,
                              mut.rewrites)}
    flags, restrict, bounds = (rules["fast-math-flags"], rules["restrict-pointers"],
                               rules["launch-bounds"])
    records = {flags.hash: _measured(flags, 1.24), restrict.hash: _measured(restrict, 1.10),
               bounds.hash: failed(bounds.hash, "correctness", "tail block differs")}
    run_dir = root / ".kfbot" / "runs" / "replayed"
    # Room for every mutator's first proposals (rules, params, compiler settings), so the
    # three recorded ones are tried whatever order the mutators take turns in.
    outcome = optimize(task, _Gpu(), OptimizeSettings(islands=1, seed=3, evaluations=16,
                                                      batch=16),
                       run_dir, executor=ReplayExecutor(records))
    return task, outcome, run_dir, {"flags": flags, "restrict": restrict}


def test_the_fastest_needs_a_flag_so_the_file_only_one_is_committed(run: Any) -> None:
    _, outcome, _, cands = run
    assert outcome.best is not None and outcome.best.candidate == cands["flags"].hash
    assert outcome.committed is not None and outcome.committed[1] == cands["restrict"]
    found = outcome.needs_parameters
    assert found is not None and found.candidate == cands["flags"]
    assert found.edits == ('add "--use_fast_math" to `extra_cuda_cflags` of the load() call '
                           "at `kernels_demo/__init__.py:23`: `return load(`",)


def test_the_headline_table_and_json_are_the_committed_candidates(run: Any) -> None:
    _, _, run_dir, cands = run
    committed, flags = cands["restrict"], cands["flags"]
    report = (run_dir / "report.md").read_text()
    top, _, suggestion = report.partition("## Faster with build parameters")
    assert f"**Committed candidate `{committed.short}`** (rules: restrict-pointers" in top
    assert "**softmax_kernel: 1.10x ✓ faster" in top and "1.100x" in top
    assert "1.24" not in top and flags.short not in top  # not one number of the other one
    assert f"Candidate `{flags.short}`" in suggestion and "1.240x" in suggestion
    assert '- add "--use_fast_math" to `extra_cuda_cflags`' in suggestion
    data = json.loads((run_dir / "report.json").read_text())
    assert data["candidate"] == data["best"]["candidate"] == committed.hash
    assert data["best"]["speedup"] == pytest.approx(1.10, rel=1e-6)
    assert data["needs_parameters"]["candidate"] == flags.hash
    assert data["needs_parameters"]["params"] == {"KFBOT_NVCC_FLAGS": "--use_fast_math"}


def test_the_patch_is_exactly_the_headline_candidate(run: Any, tmp_path: Path) -> None:
    """Apply best.patch to a clean clone of the base commit: the files it yields hash to
    the candidate the headline names. Fails whenever the two describe different code."""
    task, _, run_dir, _ = run
    report = (run_dir / "report.md").read_text()
    short = re.search(r"\*\*Committed candidate `([0-9a-f]{10})`\*\*", report)
    assert short is not None
    clone = tmp_path / "clone"
    _git(tmp_path, "clone", "-q", str(task.root), str(clone))
    patch = (run_dir / "best.patch").read_text()
    _git(clone, "apply", str(run_dir / "best.patch"))
    touched = sorted(set(re.findall(r"^\+\+\+ b/(\S+)$", patch, flags=re.MULTILINE)))
    files = {p: (clone / p).read_text() for p in touched}
    assert content_hash(files, {}).startswith(short.group(1))
    record = read_record(run_dir)
    assert record.request.candidate == content_hash(files, {})
    assert record.request.commit == _git(task.root, "rev-parse", "HEAD")
    assert (record.request.prefix, record.request.changed) == ("", ())
    assert [s.label for s in record.request.shapes] == ["(4096, 1024) float32",
                                                        "(7, 33) float32"]
    assert record.request.shapes[0].signature.tensors()[0].shape == (4096, 1024)


def test_the_lesson_and_the_branch_are_of_the_committed_candidate(run: Any) -> None:
    task, outcome, _, cands = run
    committed = cands["restrict"]
    lessons = (task.root / ".kfbot" / "experience.md").read_text()
    assert f"candidate-{committed.short}" in lessons and "1.100" in lessons
    assert "fast_math" not in lessons and "1.240" not in lessons
    branch = str(outcome.files["branch"])
    assert committed.short in branch
    message = _git(task.root, "log", "-1", "--format=%B", branch)
    assert f"Candidate: {committed.hash}" in message and "1.10x faster" in message
    shown = _git(task.root, "show", f"{branch}:csrc/softmax.cu")
    assert shown == committed.files["csrc/softmax.cu"].rstrip("\n")


def test_a_chain_of_changes_is_credited_as_a_whole() -> None:
    # A tuned tiled kernel owes its speed to the tiling: the lesson and the headline
    # name every change from the original, not only the last one.
    tiled = Candidate(files={"k.cu": "tiled"}, origin="rules", parent=ORIGINAL.hash,
                      rationale="matmul-register-tiling: 64x64 tiles")
    tuned = Candidate(files={"k.cu": "tiled, restrict"}, origin="rules", parent=tiled.hash,
                      rationale="restrict-pointers: add __restrict__")
    known = {c.hash: c for c in (tiled, tuned)}
    assert lineage(tuned, known) == ("matmul-register-tiling: 64x64 tiles",
                                     "restrict-pointers: add __restrict__")
    assert lineage(tiled, known) == ("matmul-register-tiling: 64x64 tiles",)
    assert credited(lineage(tuned, known)) == ("restrict-pointers: add __restrict__ (after "
                                               "matmul-register-tiling)")
    # a params point at the original's values has the original's hash: the chain stops
    same = Candidate(origin="params", rationale="params: BLOCK=16")
    assert same.hash == ORIGINAL.hash
    assert lineage(tiled, {**known, same.hash: same}) == lineage(tiled, known)
    ev = Evaluation(tuned.hash, "done", True, "correct")
    line = headline(make_task(select_kernel(scan(EXAMPLE, Config()).kernels, "softmax_kernel"),
                              EXAMPLE, Config()), (ev, tuned), None, lineage(tuned, known))
    assert "(rules: restrict-pointers: add __restrict__; from the original by " \
           "matmul-register-tiling then restrict-pointers)" in line
