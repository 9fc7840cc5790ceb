"""The GPU-free parts of bench/search_quality.py: spaces, Kernel Tuner input, arithmetic, table."""

from __future__ import annotations

import importlib.util
import io
import itertools
import json
import sys
from pathlib import Path
from types import ModuleType

import pytest
from rich.console import Console

from kfbot.evaluate.candidate import ORIGINAL
from kfbot.search.evolution.archive import Individual
from kfbot.search.model import Cell
from kfbot.search.mutators.params import apply_point, knobs, space_size

ROOT = Path(__file__).resolve().parents[2]


def _load() -> ModuleType:
    spec = importlib.util.spec_from_file_location("search_quality",
                                                  ROOT / "bench" / "search_quality.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["search_quality"] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


sq = _load()
EXPECTED_SPACE = {"softmax": 6, "matmul_tiled": 48, "gelu": 6, "saxpy": 6, "matmul": 3}


@pytest.mark.parametrize("bench", sq.BENCHES, ids=lambda b: b.key)
def test_each_fixture_space_is_swept_point_by_point(bench: object) -> None:
    task = sq.load_task(ROOT / bench.repo, bench)
    ks = knobs(task.tunables)
    points, capped = sq.sweep_points(ks)
    assert not capped
    assert len(points) == space_size(ks) == EXPECTED_SPACE[bench.key]
    assert len({sq.point_key(ks, p) for p in points}) == len(points)
    files = {rel: (task.root / rel).read_text() for rel in task.editable_files
             if (task.root / rel).is_file()}
    cands = [apply_point(ks, p, files, ORIGINAL) for p in points]
    assert all(c is not None for c in cands)
    assert len({c.hash for c in cands if c is not None}) == len(points)


def test_at_least_four_benches_cover_softmax_matmul_and_elementwise() -> None:
    assert len(sq.BENCHES) >= 4
    whats = " ".join(b.what for b in sq.BENCHES)
    assert "softmax" in whats and "tiled matmul" in whats and "elementwise" in whats


def test_sweep_is_capped_and_says_so() -> None:
    bench = next(b for b in sq.BENCHES if b.key == "matmul_tiled")
    ks = knobs(sq.load_task(ROOT / bench.repo, bench).tunables)
    points, capped = sq.sweep_points(ks, cap=5)
    assert capped and len(points) == 5
    assert points[0] == {k.name: k.choices[0] for k in ks}


def _ind(step: int, fitness: float | None) -> Individual:
    return Individual(f"h{step}", None, 0, Cell("global", "none", "thread", "128"), fitness,
                      "done" if fitness else "correctness", "", "params", step)


def test_best_after_reads_the_best_among_the_first_n_evaluations() -> None:
    history = [_ind(1, 0.9), _ind(2, None), _ind(5, 1.4), _ind(20, 2.0), _ind(40, 1.1)]
    assert sq.best_after(history, (4, 16, 32, 64)) == {4: 1.0, 16: 1.4, 32: 2.0, 64: 2.0}
    runs = [{16: 1.0, 32: 2.0}, {16: 1.5, 32: 1.8}, {16: 1.2, 32: 3.0}]
    assert sq.median_by_budget(runs, (16, 32)) == {16: 1.2, 32: 2.0}
    assert sq.percent_of(1.9, 2.0) == pytest.approx(95.0)
    assert sq.percent_of(None, 2.0) is None and sq.percent_of(1.0, None) is None


def _synthetic(ks: list) -> dict[tuple[str, ...], float | None]:
    """A landscape with one clear optimum and a few failed points."""
    out: dict[tuple[str, ...], float | None] = {}
    for i, key in enumerate(itertools.product(*(k.choices for k in ks))):
        out[key] = None if i % 7 == 3 else 1.0 + (i % 11) / 10
    return out


def test_kt_cache_holds_the_sweep_in_kernel_tuners_format() -> None:
    bench = next(b for b in sq.BENCHES if b.key == "matmul_tiled")
    ks = knobs(sq.load_task(ROOT / bench.repo, bench).tunables)
    landscape = _synthetic(ks)
    doc = sq.kt_cache("matmul_tiled", ks, landscape)
    assert doc["tune_params_keys"] == [sq.safe_name(k.name) for k in ks]
    assert len(doc["cache"]) == 48
    key = next(k for k, v in landscape.items() if v is not None)
    record = doc["cache"][",".join(key)]
    assert record["time"] == pytest.approx(1.0 / landscape[key])
    failed = next(k for k, v in landscape.items() if v is None)
    assert doc["cache"][",".join(failed)]["time"] == "RuntimeFailedConfig"
    json.dumps(doc)  # written as a file as is
    assert sq.safe_name("launch:threads") == "launch_threads"
    assert sq.safe_name("3x") == "p_3x"


def test_kernel_tuner_simulates_over_the_synthetic_sweep(tmp_path: Path) -> None:
    pytest.importorskip("kernel_tuner")
    bench = next(b for b in sq.BENCHES if b.key == "matmul_tiled")
    ks = knobs(sq.load_task(ROOT / bench.repo, bench).tunables)
    landscape = _synthetic(ks)
    optimum = max(v for v in landscape.values() if v is not None)
    doc = sq.kt_cache("matmul_tiled", ks, landscape)
    found = sq.simulate(doc, (4, 48), seeds=(0,), strategies=("random_sample",),
                        workdir=tmp_path)
    assert found["random_sample"][48] == pytest.approx(optimum)  # the whole space fits
    assert 1.0 <= found["random_sample"][4] <= optimum


def test_kt_best_counts_distinct_configurations_only() -> None:
    rec = [{"a": 1, "time": 1.0}, {"a": 1, "time": 1.0}, {"a": 2, "time": 0.5},
           None, {"a": 3, "time": 0.25, "__error__": "x"}, {"a": 4, "time": 0.2}]
    assert sq.kt_best(rec, ["a"], 1) == pytest.approx(1.0)
    assert sq.kt_best(rec, ["a"], 2) == pytest.approx(2.0)
    assert sq.kt_best(rec, ["a"], 3) == pytest.approx(2.0)  # the failed one is not a result
    assert sq.kt_best(rec, ["a"], 4) == pytest.approx(5.0)


def _row(found32: float, kt32: float) -> object:
    row = sq.Row("k (fixture)", "naive softmax", 6, 6, False, original_us=120.0,
                 found={16: 1.5, 32: found32, 64: found32}, optimum=2.0,
                 optimum_point="BLOCK=32", best_change="params: BLOCK=32")
    row.kt = {"random_sample": {16: 1.5, 32: kt32, 64: kt32},
              "bayes_opt": {16: 1.2, 32: 1.0, 64: 1.0}}
    return row


def test_targets_pass_and_fail_by_the_numbers() -> None:
    good = _row(1.95, 1.9)
    assert good.optimum_target(32) is True and good.kt_target(sq.BUDGETS, 0.02) is True
    assert good.kt_best(32) == (1.9, "random_sample")
    short = _row(1.85, 1.9)  # 92.5% of the optimum, and below Kernel Tuner beyond 2%
    assert short.optimum_target(32) is False and short.kt_target(sq.BUDGETS, 0.02) is False
    lines, passed = sq.summary([good], sq.BUDGETS, 0.02)
    assert passed and "PASS" in lines[0] and "PASS" in lines[1]
    assert "1.95x faster after 64 evaluations" in lines[2]
    lines, passed = sq.summary([good, short], sq.BUDGETS, 0.02)
    assert not passed and "1/2 kernels -> FAIL" in lines[0]


def test_missing_kernel_tuner_does_not_fail_the_run() -> None:
    row = _row(1.95, 1.9)
    row.kt = None
    lines, passed = sq.summary([row], sq.BUDGETS, 0.02)
    assert passed and "not installed" in lines[1]
    errored = sq.Row("gelu", "elementwise", 0, 0, False, error="the original does not build")
    assert not sq.summary([row, errored], sq.BUDGETS, 0.02)[1]


def test_table_shows_every_column() -> None:
    row = _row(1.95, 1.9)
    console = Console(file=io.StringIO(), width=400, record=True)
    console.print(sq.table([row], sq.BUDGETS, 0.02))
    text = console.export_text()
    for part in ("kfbot @16", "kfbot @64", "Kernel Tuner @32", "120.0 us", "2.00x at BLOCK=32",
                 "1.90x random_sample", "98%", "PASS"):
        assert part in text, part


def test_arguments() -> None:
    args = sq.parse(["--quick"])
    assert args.quick and args.seeds == 1
    assert sq.parse(["--quick", "--seeds", "2"]).seeds == 2
    assert [b.key for b in sq.pick(None, quick=True)] == ["softmax"]
    assert [b.key for b in sq.pick("gelu,matmul_tiled", quick=False)] == ["gelu", "matmul_tiled"]
    with pytest.raises(SystemExit, match="unknown kernel"):
        sq.pick("nope", quick=False)
    with pytest.raises(SystemExit):
        sq.parse(["--seeds", "0"])


def test_fixture_is_staged_in_a_private_git_repository(tmp_path: Path) -> None:
    import git

    bench = next(b for b in sq.BENCHES if b.key == "gelu")
    dest = sq.stage_fixture(bench, tmp_path)
    repo = git.Repo(dest)
    assert Path(repo.working_tree_dir or "") == dest and not repo.is_dirty(untracked_files=True)
    assert (dest / "csrc" / "gelu_kernel.cu").is_file()
    assert sq.load_task(dest, bench).kernel_name == "gelu_kernel"


def _cuda() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return bool(torch.cuda.is_available())


@pytest.mark.skipif(_cuda(), reason="would run the whole benchmark on this GPU")
def test_without_a_gpu_it_exits_3(capsys: pytest.CaptureFixture[str]) -> None:
    assert sq.main(["--quick"]) == sq.EXIT_NO_GPU
    assert "needs a CUDA GPU" in capsys.readouterr().out
