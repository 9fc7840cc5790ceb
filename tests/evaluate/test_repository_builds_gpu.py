"""On a GPU, the original passes its baseline where the repository builds itself, and a
candidate is built the repository's way: the fixture `library_loop` makes each op a
library of its own in a loop no scan can read; the library that holds the kernel is
found by its symbols, the tests run in the tree that build made, and a candidate
recompiles only its own objects (torch's ninja build) and loads beside the original
under its own op namespace; observing its tests runs them in that build's tree and
confirms each with the kernel's mutant built the same way. `subfolder_setup` has a
setup.py per folder next to a `load()` fallback and a check script with no `__main__`
guard.

    pytest -m gpu tests/evaluate/test_repository_builds_gpu.py -v  # ~3-4 minutes, mostly builds
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from kfbot.config import load_config
from kfbot.evaluate.build import Builder
from kfbot.evaluate.candidate import Candidate
from kfbot.evaluate.engine import Engine, EngineSettings
from kfbot.evaluate.evaluation import Evaluation
from kfbot.evaluate.observe.observer import ObserveSettings, observe
from kfbot.evaluate.task import KernelTask, make_task
from kfbot.scan.scanner import scan
from kfbot.scan.select import select_kernel

pytestmark = pytest.mark.gpu

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures"


@pytest.fixture(scope="module")
def cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("kfbot-cache")


def _task(fixture: str, kernel: str) -> KernelTask:
    root = FIXTURES / fixture
    config = load_config(None, root)
    report = scan(root, config)
    return make_task(select_kernel(report.kernels, kernel), root, config, report.kernels)


def _settings(cache: Path) -> EngineSettings:
    return EngineSettings(cache_dir=cache, capture_timeout_s=600, job_timeout_s=300)


def explained(ev: Evaluation) -> str:
    return "\n".join(f"{s.step} {s.outcome}: {s.summary}\n{s.evidence}" for s in ev.steps)


@pytest.mark.parametrize(("fixture", "kernel", "library"), [
    ("library_loop", "row_scale_kernel", "rowlib._row_scale"),
    ("library_loop", "row_shift_kernel", "rowlib._row_shift"),
])
def test_the_original_passes_where_the_repository_builds_itself(
        cache: Path, fixture: str, kernel: str, library: str) -> None:
    task = _task(fixture, kernel)
    assert task.build.kind == "repository"
    with Engine(task, _settings(cache)) as engine:
        ev = engine.baseline()
    assert ev.ok, f"{ev.reason}\n{explained(ev)}"
    assert [s.step for s in ev.steps] == ["pair", "build", "import", "capture", "reference",
                                          "comparison"]
    assert all(s.outcome in ("ok", "warning") for s in ev.steps), explained(ev)
    build = next(s for s in ev.steps if s.step == "build")
    assert f"the kernel is in {library}" in build.summary, explained(ev)
    assert "reference" in {c.against for c in ev.checks}, explained(ev)


@pytest.mark.parametrize(("kernel", "run"), [
    ("nearest3d/nearest.cu::nearest_kernel", "check_nearest.py"),  # no __main__ guard
    ("nearest2d/nearest.cu::nearest_kernel", "tests/test_nearest_2d.py"),  # try: import
])
def test_the_original_passes_with_a_setup_py_per_folder(cache: Path, kernel: str,
                                                        run: str) -> None:
    task = _task("subfolder_setup", kernel)
    with Engine(task, _settings(cache)) as engine:
        ev = engine.baseline()
    assert ev.ok, f"{ev.reason}\n{explained(ev)}"
    assert all(s.outcome in ("ok", "warning") for s in ev.steps), explained(ev)
    pair = next(s for s in ev.steps if s.step == "pair")
    assert run in pair.summary, explained(ev)
    assert "reference" in {c.against for c in ev.checks}, explained(ev)


def test_a_candidate_is_rebuilt_the_repositorys_way(cache: Path) -> None:
    """A candidate that breaks the scale kernel: the workshop recompiles its .cu (and the
    .cpp whose registration it renames), the library loads beside the original under
    rowlib_kf<tag>, and the reference catches it; were the original's library loaded
    instead, it would pass."""
    task = _task("library_loop", "row_scale_kernel")
    source = (FIXTURES / "library_loop" / "csrc/cuda/row_scale_cuda.cu").read_text()
    wrong = source.replace("x[i] * static_cast<scalar_t>(alpha)",
                           "x[i] * static_cast<scalar_t>(alpha) + (i == 7)")
    assert wrong != source
    with Engine(task, _settings(cache)) as engine:
        assert engine.baseline().ok
        bad = engine.evaluate(Candidate(files={"csrc/cuda/row_scale_cuda.cu": wrong}),
                              bench=False)
    assert not bad.ok and bad.stage in ("correctness", "anticheat"), bad.reason


def test_the_tests_are_observed_in_the_tree_the_repository_built(
        cache: Path, tmp_path: Path) -> None:
    """Observed pairing where the repository builds itself: the tests run in that
    build's tree, and the mutant of the scale kernel (built the same way, laid into a
    copy of the tree) fails them: they check it."""
    root = tmp_path / "library_loop"
    shutil.copytree(FIXTURES / "library_loop", root)
    for args in (["init", "-q"], ["add", "-A"], ["commit", "-qm", "fixture"]):
        subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@t", *args], cwd=root,
                       check=True, capture_output=True)
    report = scan(root, load_config(None, root))
    scale = "csrc/cuda/row_scale_cuda.cu::rowlib::row_scale_kernel"
    found = observe(root, report, Builder(cache / "build"),
                    ObserveSettings(file_timeout_s=180, timeout_s=600, jobs=4,
                                    confirm=(scale,)))
    seen = {t.test: t.verdict for t in found.of(scale)}
    assert seen and all(t.startswith("test/test_row_scale.py::") for t in seen), found
    assert set(seen.values()) == {"checks"}, found


@pytest.fixture(scope="module")
def library_loop_built(cache: Path) -> Path:
    """`cache` holding library_loop as its setup.py builds it: the original's build alone
    (no capture), a cache hit after the tests above; where this test runs apart from them
    (another xdist worker, or `-k`), the build happens here."""
    with Engine(_task("library_loop", "row_shift_kernel"), _settings(cache)) as engine:
        assert engine.original().ok
    return cache


def test_verify_explain_on_a_repository_that_builds_itself(library_loop_built: Path) -> None:
    """From the command line, with a build of the same content in the cache: it is not
    built again."""
    env = {**os.environ, "KFBOT_CACHE": str(library_loop_built), "COLUMNS": "200"}
    done = subprocess.run([sys.executable, "-m", "kfbot", "verify", "row_shift_kernel",
                           "--repo", str(FIXTURES / "library_loop"), "--explain"],
                          capture_output=True, text=True, env=env, timeout=900)
    assert done.returncode == 0, done.stdout + done.stderr
    names = ("environment", "pair", "build", "import", "capture", "reference", "comparison")
    steps = [words[:2] for line in done.stdout.splitlines()
             if (words := line.split()) and words[0] in names]
    assert steps == [[name, "ok"] for name in names], done.stdout
    assert "(the build of this content, from the cache)" in done.stdout
