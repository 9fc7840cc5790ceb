"""The GPU-free parts of the naive-kernel section of bench/search_quality.py
(bench/naive_kernels.py): the fixtures it names, the figures it reads off kfbot's JSON,
the verdict, the staged copies and the candidate folders."""

from __future__ import annotations

import datetime
import importlib.util
import io
import json
import sys
from pathlib import Path
from types import ModuleType

import pytest
from rich.console import Console

from kfbot import git
from kfbot.search.experience import Lesson, append_lessons
from kfbot.search.rewrites import load_library

ROOT = Path(__file__).resolve().parents[2]


def _load() -> ModuleType:
    spec = importlib.util.spec_from_file_location("naive_kernels",
                                                  ROOT / "bench" / "naive_kernels.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["naive_kernels"] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


nk = _load()


def test_every_class_has_a_fixture_with_a_hand_written_version() -> None:
    assert {b.kind for b in nk.NAIVE} == {c.id for c in load_library().classes}
    assert len({b.key for b in nk.NAIVE}) == len(nk.NAIVE)
    for b in nk.NAIVE:
        root = ROOT / "fixtures" / b.fixture
        assert f"void {b.kernel}(" in (root / b.file).read_text()
        assert "void __launch_bounds__" in (root / "hand" / f"{b.kernel}.cu").read_text()
    assert [b.key for b in nk.pick("matmul, softmax")] == ["matmul", "softmax"]
    # By default one kernel per class, every class once; `all` is every fixture kernel.
    default = nk.pick(None)
    assert sorted(b.kind for b in default) == sorted({b.kind for b in nk.NAIVE})
    assert nk.pick("all") == list(nk.NAIVE)
    real = nk.pick("real")
    assert [b.key for b in real] == list(nk.REAL)
    assert {b.fixture for b in real} == {"naive_real"}
    assert nk.target_of([nk.NaiveRow(b) for b in real]) == nk.REAL_TARGET
    assert nk.target_of([nk.NaiveRow(b) for b in default]) == nk.TARGET
    assert nk._reproduced('{"speedup": {"reproduced": 4.5}}') == 4.5
    assert nk._reproduced("kfbot reproduce: the patch does not apply") is None
    with pytest.raises(SystemExit, match="unknown kernel"):
        nk.pick("softmax,nope")


def test_figures_read_off_kfbots_json() -> None:
    report = {"best": {"speedup": 41.5, "timings": [{"original_median_us": 100.0},
                                                    {"original_median_us": 400.0}]}}
    assert nk.reported_speedup(report) == (41.5, pytest.approx(200.0))
    assert nk.reported_speedup({"best": None}) == (None, None)
    answer = {"shapes": [{"shape": "(4096, 1024)", "reported": 40.0, "reproduced": 39.0}],
              "speedup": {"reported": 41.5, "reproduced": 40.2}}
    assert nk.reproduced_speedup(answer) == 40.2
    assert nk.reproduced_speedup({"speedup": {}}) is None
    assert nk.bench_speedup({"ok": True, "speedup": 90.0}) == (90.0, "")
    assert nk.bench_speedup({"ok": False, "stage": "verify", "reason": "wrong at 7"}) == \
        (None, "verify: wrong at 7")


def _row(key: str, reported: float | None, reproduced: float | None,
         hand: float | None) -> object:
    [bench] = nk.pick(key)
    return nk.NaiveRow(bench, original_us=120.0, reported=reported, reproduced=reproduced,
                       hand=hand, change="warp-per-row: ...")


def test_the_verdict_counts_reproduced_speedups() -> None:
    rows = [_row("softmax", 80.0, 75.0, 150.0), _row("matmul", 3.0, 2.9, 6.0),
            _row("silu", 1.1, 1.0, 1.3)]
    lines, passed = nk.summary(rows, 32)
    assert passed  # (75 * 2.9 * 1.0) ** (1 / 3) = 6.0
    assert "geometric mean reproduced: 6.01x (target >= 5x) -> PASS" in lines[2]
    rows[0].reproduced = 20.0
    lines, passed = nk.summary(rows, 32)
    assert not passed and lines[2].endswith("-> FAIL")
    rows[1].reproduced = None
    rows[1].problems.append("kfbot reproduce failed (exit 2): invalid choice")
    lines, passed = nk.summary(rows, 32)
    assert not passed and lines[2].endswith("n/a: not every kernel was reproduced")
    assert "  matmul: kfbot reproduce failed (exit 2): invalid choice" in lines
    out = io.StringIO()
    Console(file=out, width=240).print(nk.table(rows, 32))
    text = out.getvalue()
    assert "softmax_kernel (naive_rows)" in text and "80.00x" in text and "150.00x" in text
    assert "0.13" in text  # reproduced / hand for softmax: 20 / 150


def test_staged_copy_candidate_folder_and_best_change(tmp_path: Path) -> None:
    [bench] = nk.pick("row_max")
    repo = nk.stage(bench.fixture, tmp_path)
    assert nk.stage(bench.fixture, tmp_path) == repo  # one copy per fixture
    assert git.text(repo, "log", "--format=%s") == "fixture"
    assert git.text(repo, "status", "--porcelain") == ""
    folder = nk.hand_candidate(bench, repo, tmp_path)
    assert (folder / bench.file).read_text() == \
        (ROOT / "fixtures/naive_rows/hand/row_max_kernel.cu").read_text()
    assert [p.relative_to(folder).as_posix() for p in folder.rglob("*.cu")] == [bench.file]
    today = datetime.date.today().isoformat()
    append_lessons(repo / ".kfbot" / "experience.md", [
        Lesson("csrc/row_reduce.cu::row_max_kernel", "H200", "block-per-row: ...", "rules",
               "faster", 30.0, None, "", today),
        Lesson("csrc/row_reduce.cu::row_max_kernel", "H200", "warp-per-row: ...", "rules",
               "faster", 45.0, None, "", today),
        Lesson("csrc/row_reduce.cu::row_mean_kernel", "H200", "other", "rules", "faster",
               90.0, None, "", today)])
    assert nk.best_change(repo, "row_max_kernel") == "warp-per-row: ..."


def test_kfbot_runs_as_a_subprocess_the_way_the_section_calls_it(tmp_path: Path) -> None:
    repo = nk.stage("naive_transpose", tmp_path)
    code, out, _ = nk.kfbot(["scan", str(repo), "--json"], 120)
    assert code == 0
    assert [k["name"] for k in json.loads(out)["kernels"]] == ["transpose_kernel"]
