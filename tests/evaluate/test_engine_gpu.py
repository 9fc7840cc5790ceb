"""The evaluation engine on a real GPU: fixtures build, verify and benchmark; faulty
candidates are recorded and survived; a boundary bug is localised; a faster kernel is
reported faster with a significant verdict."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from kfbot.config import load_config
from kfbot.evaluate.candidate import Candidate
from kfbot.evaluate.engine import Engine, EngineSettings
from kfbot.evaluate.task import make_task
from kfbot.scan.scanner import scan
from kfbot.scan.select import select_kernel

pytestmark = pytest.mark.gpu

ROOT = Path(__file__).resolve().parents[2]
FIXTURES = ROOT / "fixtures"
CANDIDATES = ROOT / "tests" / "data" / "candidates"
TIMING = {"max_trials": 60, "min_trials": 10}


def make_engine(fixture: str, kernel: str, cache: Path, timeout_s: float = 300) -> Engine:
    root = FIXTURES / fixture
    config = load_config(None, root)
    chosen = select_kernel(scan(root, config).kernels, kernel)
    settings = EngineSettings(cache_dir=cache, timing=TIMING, job_timeout_s=timeout_s)
    return Engine(make_task(chosen, root, config), settings)


def rebuilt(tag: str) -> Candidate:
    """The original built again under another name: same code, separate artifact."""
    return Candidate(params={"KFBOT_TEST_REBUILD": tag}, origin="user")


@pytest.fixture(scope="module")
def cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("kfbot-cache")


@pytest.fixture(scope="module")
def gelu(cache: Path) -> Iterator[Engine]:
    with make_engine("load_elementwise", "gelu_kernel", cache, timeout_s=40) as engine:
        assert engine.baseline().ok
        yield engine


def gelu_candidate(name: str) -> Candidate:
    text = (CANDIDATES / "gelu" / name).read_text()
    return Candidate(files={"csrc/gelu_kernel.cu": text}, origin="user", rationale=name)


@pytest.mark.parametrize(("fixture", "kernel"), [
    ("example", "softmax_kernel"),
    ("load_elementwise", "gelu_kernel"),
    ("torch_library_layernorm", "layernorm_kernel"),
    ("tunables_matmul", "matmul_tiled"),
])
def test_fixture_kernels_build_verify_and_bench(cache: Path, fixture: str, kernel: str) -> None:
    with make_engine(fixture, kernel, cache) as engine:
        base = engine.baseline()
        assert base.ok, base.reason
        assert len(base.checks) >= 3 and all(c.against == "reference" for c in base.checks)
        result = engine.evaluate(rebuilt("1"))
        assert result.ok, result.reason
        assert result.timings and all(t.speedup.baseline.n >= 10 for t in result.timings)
        assert 0.8 < (result.speedup or 0) < 1.25  # the same code: no real difference
        assert result.environment["gpu"]


def test_hanging_kernel_is_killed_and_the_next_candidate_runs(gelu: Engine) -> None:
    result = gelu.evaluate(gelu_candidate("hang.cu"))
    assert (result.ok, result.stage) == (False, "runtime")
    assert "timeout" in result.reason
    assert gelu.evaluate(rebuilt("after-hang"), bench=False).ok


def test_illegal_address_is_recorded_and_survived(gelu: Engine) -> None:
    result = gelu.evaluate(gelu_candidate("illegal_address.cu"))
    assert (result.ok, result.stage) == (False, "runtime")
    assert any(d.kind == "illegal_address" for d in result.diagnostics), result.reason
    assert gelu.evaluate(rebuilt("after-fault"), bench=False).ok


def test_out_of_memory_is_recorded_and_survived(gelu: Engine) -> None:
    result = gelu.evaluate(gelu_candidate("out_of_memory.cu"))
    assert not result.ok
    assert "out of memory" in (result.reason + " ".join(c.error or "" for c in result.checks))
    assert gelu.evaluate(rebuilt("after-oom"), bench=False).ok


def test_boundary_bug_is_rejected_and_localised_to_the_tail(gelu: Engine) -> None:
    result = gelu.evaluate(gelu_candidate("tail_bug.cu"))
    # The unwritten tail still holds the poison the allocator was filled with.
    assert (result.ok, result.stage) == (False, "anticheat")
    assert result.reason.startswith("[output-poison]")
    failing = [c for c in result.checks if not c.passed]
    where = [(c.input, c.against, c.where, c.description) for c in failing]
    assert failing and all(c.where == "tail_block" for c in failing), where
    assert {c.check for c in failing} == {"output-poison"}
    assert "bounds" in failing[0].description


def test_faster_softmax_is_reported_faster_and_significant(cache: Path) -> None:
    text = (CANDIDATES / "softmax_block_per_row" / "csrc" / "softmax.cu").read_text()
    with make_engine("example", "softmax_kernel", cache) as engine:
        assert engine.baseline().ok
        result = engine.evaluate(Candidate(files={"csrc/softmax.cu": text}, origin="user"))
    assert result.ok, result.reason
    shapes = [(t.input, t.speedup.ratio, t.speedup.ci_low, t.speedup.verdict)
              for t in result.timings]
    assert result.verdict == "faster", shapes
    assert (result.speedup or 0) > 2
    big = next(t for t in result.timings if t.input.startswith("(4096, 1024)"))
    assert big.speedup.ci_low > 2, shapes  # the shape with real work is clearly faster
    assert not any(t.speedup.verdict == "slower" for t in result.timings), shapes


def test_finalist_runs_the_repository_tests_against_the_candidate(cache: Path) -> None:
    text = (CANDIDATES / "softmax_block_per_row" / "csrc" / "softmax.cu").read_text()
    with make_engine("example", "softmax_kernel", cache) as engine:
        good = engine.finalist(Candidate(files={"csrc/softmax.cu": text}))
    assert good.passed, good.output_tail
    assert "passed" in good.output_tail
    tail = (CANDIDATES / "gelu" / "tail_bug.cu").read_text()
    with make_engine("load_elementwise", "gelu_kernel", cache) as engine:
        bad = engine.finalist(Candidate(files={"csrc/gelu_kernel.cu": tail}))
    assert not bad.passed and "failed" in bad.output_tail


def test_declared_flops_are_reported_as_flop_rates(cache: Path, tmp_path: Path) -> None:
    import shutil

    repo = tmp_path / "matmul"
    shutil.copytree(FIXTURES / "tunables_matmul", repo)
    (repo / "kfbot.yaml").write_text(
        "tasks:\n  - name: mm\n    kernel: matmul_tiled\n"
        "    flops: \"2 * args[0].shape[0] * args[0].shape[1] * args[1].shape[1]\"\n")
    config = load_config(None, repo)
    chosen = select_kernel(scan(repo, config).kernels, "matmul_tiled")
    settings = EngineSettings(cache_dir=cache, timing=TIMING)
    with Engine(make_task(chosen, repo, config), settings) as engine:
        result = engine.evaluate(rebuilt("flops"))
    assert result.ok, result.reason
    rates = {t.input: t.flop_rate for t in result.timings}
    assert all(rate is not None and rate > 0 for rate in rates.values()), rates
    assert max(r for r in rates.values() if r is not None) > 1e9, rates  # (128, 300) x (300, 70)
