"""On a GPU: the tests of fixtures/observe_pairs observed, each file in its own process
under the profiler; the mutant of each kernel tells the tests that check it from the one
that only launches it; a file that crashes keeps the calls it made; and the inputs
kfbot adds that the original gets wrong leave the contract as findings while the
baseline passes.

    pytest -m gpu tests/evaluate/test_observe_gpu.py -v     # about 3 minutes on an H100

One copy of the fixture (in a git repository of its own, so observations are kept by
commit) and one build cache serve every test: the extension's bindings compile once.
"""

from __future__ import annotations

import importlib.util
import shutil
import subprocess
from pathlib import Path

import pytest

from kfbot.config import load_config
from kfbot.evaluate.build import Builder, BuildRequest
from kfbot.evaluate.build.repository import staged_modules
from kfbot.evaluate.candidate import Candidate
from kfbot.evaluate.capture.collect import capture_signatures
from kfbot.evaluate.capture.signature import OpRef
from kfbot.evaluate.engine import Engine, EngineSettings
from kfbot.evaluate.inputs.contract import FINDING
from kfbot.evaluate.observe.observer import ObserveSettings, observe
from kfbot.evaluate.task import make_task
from kfbot.scan.model import Observations
from kfbot.scan.observed import load, save, with_observations
from kfbot.scan.scanner import scan
from kfbot.scan.select import select_kernel

pytestmark = pytest.mark.gpu

FIXTURE = Path(__file__).resolve().parents[2] / "fixtures" / "observe_pairs"
SCALE = "csrc/kernels.cu::ops::detail::scale_kernel"
PLAIN_C = "csrc/kernels.cu::plain_c_kernel"
FREE = "csrc/kernels.cu::free_kernel"


@pytest.fixture(scope="module")
def repo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("observe") / "observe_pairs"
    shutil.copytree(FIXTURE, root)
    for args in (["init", "-q"], ["add", "-A"], ["commit", "-qm", "fixture"]):
        subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@t", *args], cwd=root,
                       check=True, capture_output=True)
    return root


@pytest.fixture(scope="module")
def cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("kfbot-cache")


@pytest.fixture(scope="module")
def observed(repo: Path, cache: Path) -> Observations:
    report = scan(repo, load_config(None, repo))
    found = observe(repo, report, Builder(cache / "build"),
                    ObserveSettings(file_timeout_s=180, timeout_s=600, jobs=4))
    save(repo, found)
    return found


def verdicts(observed: Observations) -> dict[tuple[str, str], str]:
    return {(kernel, t.test): t.verdict for kernel, tests in observed.kernels for t in tests}


def test_each_test_is_seen_launching_its_kernels(observed: Observations) -> None:
    said = verdicts(observed)
    print("\n".join(f"{k} {t}: {v}" for (k, t), v in sorted(said.items())))
    print("\n".join(observed.files))
    expecttest = importlib.util.find_spec("expecttest") is not None
    assert observed.note == "" and observed.tests_run == 8 + expecttest
    for n in (1, 1000, 4096):
        assert said[(SCALE, f"tests/test_scale.py::test_scale_matches_torch[{n}]")] == "checks"
    # Reached through a dict keyed by device type: only watching pairs it.
    assert said[(SCALE, "tests/test_dispatch.py::test_dispatched_scale")] == "checks"
    assert said[(SCALE, "tests/test_crashes.py::test_scale_before_the_crash")] == "checks"
    # Checks only the shape: the kernel that writes nothing passes it.
    assert said[(PLAIN_C, "tests/test_offset.py::test_offset_keeps_the_shape")] == \
        "launches-only"
    for shape in ("shape0", "shape1"):
        assert said[(FREE, f"tests/test_double32.py::test_double32_matches_torch[{shape}]")] \
            == "checks"
    scale = dict(observed.kernels)[SCALE]
    assert all(t.ops == ("obs_ext.scale",) for t in scale)  # credited to the op's call
    assert {kernel for kernel, _ in said} == {SCALE, PLAIN_C, FREE}
    assert any(name.startswith("at::") for name in observed.foreign)  # torch's own kernels


def test_the_files_that_could_not_run_are_named(observed: Observations) -> None:
    lines = "\n".join(observed.files)
    if importlib.util.find_spec("expecttest") is None:
        assert "tests/test_needs_expecttest.py: cannot be collected: no module named " \
               "'expecttest' (pip install expecttest)" in lines
    else:  # this machine has it: the file is a test like the others
        assert (SCALE, "tests/test_needs_expecttest.py::TestScale::test_scale") in \
            verdicts(observed)
    assert "tests/test_ops_mps.py: skipped, a Metal twin" in lines
    assert "pytest tests/test_crashes.py: crashed; its last lines:" in lines


def test_scan_shows_the_observed_pairs(observed: Observations, repo: Path) -> None:
    assert load(repo) == observed  # kept by commit
    merged = with_observations(scan(repo, load_config(None, repo)), observed, repo)
    scale = select_kernel(merged.kernels, "scale_kernel")
    assert {(r.file, r.origin) for r in scale.references} >= {
        ("tests/test_scale.py", "discovered"), ("tests/test_dispatch.py", "observed")}
    assert not select_kernel(merged.kernels, "plain_c_kernel").references


def test_calls_recorded_before_a_crash_are_kept(repo: Path, cache: Path) -> None:
    config = load_config(None, repo)
    recipe = select_kernel(scan(repo, config).kernels, "scale_kernel").builds[0]
    built = Builder(cache / "build").build(BuildRequest(recipe, repo, tag="repo",
                                                        real_names=True))
    assert built.ok
    result = capture_signatures(repo, ["tests/test_crashes.py"], [OpRef.parse("obs_ext.scale")],
                                timeout_s=300, staged=staged_modules(repo, recipe, built))
    run, = result.runs
    assert run.ran.exit_code < 0 and "crashed" in run.problem
    shapes = {t.shape for s in result.signatures for t in s.tensors()}
    assert shapes == {(512,), (300,)}  # the second call came just before the abort


def test_the_original_defines_the_contract(repo: Path, cache: Path) -> None:
    config = load_config(None, repo)
    report = scan(repo, config)
    task = make_task(select_kernel(report.kernels, "free_kernel"), repo, config, report.kernels)
    settings = EngineSettings(cache_dir=cache, capture_timeout_s=300, measure_peaks=False)
    with Engine(task, settings) as engine:
        base = engine.baseline()
        about = [f.reason for f in base.findings if f.check == FINDING]
        print("\n".join(about))
        # The repository's own calls pass; the added inputs the original gets wrong (rows
        # not a multiple of 32 long) or cannot launch (rows under 32 long, more than
        # 65535 rows) leave the contract as findings about the original.
        assert base.ok, base.reason
        assert any(r.startswith("the original is wrong at edge (64, 33) float32") for r in about)
        # A grid of no blocks: "invalid configuration argument" before CUDA 13, "invalid
        # argument" since.
        assert any(r.startswith("the original raises at edge (64, 1) float32") and
                   ("invalid configuration" in r or "invalid argument" in r) for r in about)
        assert "added inputs hold on the original" in base.steps[-1].summary
        excluded = {v.trial.label for v in engine.contract().excluded}
        admitted = {t.label for t in engine.contract().admitted}
        assert "edge (64, 33) float32" in excluded and "x2 (128, 96) float32" in admitted
        # A candidate the same as the original is held to the contract, not beyond it.
        source = (repo / "csrc" / "kernels.cu").read_text()
        body = "data[(long long)blockIdx.y * cols + col] *= 2.0f;"
        assert body in source
        same = Candidate({"csrc/kernels.cu": source.replace(body, body + "  // the same")},
                         origin="user")
        ev = engine.evaluate(same, bench=False)
        assert ev.ok, ev.reason
        checked = {c.input for c in ev.checks}
        assert not checked & excluded and "x2 (128, 96) float32" in checked
        assert {f.reason for f in ev.findings if f.check == FINDING} == set(about)
