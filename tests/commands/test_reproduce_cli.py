"""`kfbot reproduce RUN_DIR` without a GPU: the run folder is read and checked, the patch
is applied to clean checkouts of the base commit (the user's checkout untouched), and
only then does it say there is no GPU (exit 3). A run folder that does not fit says what
and where (exit 2); a patch that does not apply is a failed reproduction (exit 1). The
figures' JSON and the 5% rule are checked on plain values."""

from __future__ import annotations

import json
import os
import random
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from kfbot.config import Config
from kfbot.evaluate.candidate import Candidate
from kfbot.evaluate.capture.signature import CallSignature, TensorSpec
from kfbot.evaluate.evaluation import Evaluation, ShapeTiming
from kfbot.evaluate.reproduce.model import Reproduction, ShapeFigures
from kfbot.evaluate.task import make_task
from kfbot.evaluate.verdict.stats import compare_times
from kfbot.scan.scanner import scan
from kfbot.scan.select import select_kernel
from kfbot.search.evolution.archive import Individual
from kfbot.search.evolution.islands import SearchResult
from kfbot.search.model import Cell
from kfbot.search.plan import OptimizeSettings
from kfbot.search.runner import OptimizeOutcome, write_outputs

FIXTURE = Path(__file__).resolve().parents[2] / "fixtures" / "load_elementwise"


def _git(cwd: Path, *args: str) -> str:
    return subprocess.run(["git", *args], cwd=cwd, check=True, capture_output=True,
                          text=True).stdout.strip()


def _kfbot(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "COLUMNS": "200", "KFBOT_CACHE": str(cwd / "cache")}
    return subprocess.run([sys.executable, "-m", "kfbot", *args], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=300)


def _evaluation(cand: Candidate) -> Evaluation:
    x = TensorSpec((1 << 20,), "float32", (1,), True, "cuda", -3.0, 3.0, 0.0, std=1.0)
    sig = CallSignature("elementwise.gelu", (x,))
    base = [50.0 + 0.01 * k for k in range(30)]
    timing = ShapeTiming("(1048576,) float32", compare_times(base, [b / 1.3 for b in base],
                                                              random.Random(0)),
                         signature=sig.to_json())
    return Evaluation(cand.hash, "done", True, "correct", timings=(timing,),
                      environment={"gpu": "NVIDIA H200"})


@pytest.fixture(scope="module")
def repo(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """(a committed copy of the fixture, the run folder of a run that committed a
    block-size change)."""
    root = tmp_path_factory.mktemp("rep") / "repo"
    shutil.copytree(FIXTURE, root)
    (root / ".gitignore").write_text(".kfbot/runs/\n")
    _git(root, "init", "-q")
    _git(root, "add", "-A")
    _git(root, "-c", "user.name=O", "-c", "user.email=o@x", "commit", "-qm", "fixture")
    task = make_task(select_kernel(scan(root, Config()).kernels, "gelu_kernel"), root,
                     Config())
    source = (root / "csrc" / "gelu_kernel.cu").read_text()
    cand = Candidate({"csrc/gelu_kernel.cu": source.replace("kBlockSize = 128",
                                                            "kBlockSize = 256")},
                     origin="params", rationale="params: kBlockSize=256")
    ev = _evaluation(cand)
    best = Individual(cand.hash, None, 0, Cell("global", "none", "thread-per-element", "256"),
                      ev.speedup, "done", "correct", "params", 1)
    outcome = OptimizeOutcome(SearchResult(best, [], [best]), ev, cand, {"evaluations": 1.0},
                              committed=(ev, cand))
    run_dir = root / ".kfbot" / "runs" / "gelu-1"
    write_outputs(task, outcome, run_dir, OptimizeSettings(islands=1, seed=1))
    return root, run_dir


def test_without_a_gpu_it_applies_the_patch_then_says_so(repo: tuple[Path, Path]) -> None:
    root, run_dir = repo
    before = (_git(root, "status", "--porcelain"), _git(root, "worktree", "list"))
    done = _kfbot("reproduce", str(run_dir), "--json", cwd=root)
    assert done.returncode == 3, done.stderr
    assert "kfbot: error: no CUDA GPU" in done.stderr and done.stdout == ""
    assert (_git(root, "status", "--porcelain"), _git(root, "worktree", "list")) == before
    assert "kBlockSize = 128" in (root / "csrc" / "gelu_kernel.cu").read_text()


def test_a_run_id_names_a_folder_of_the_repository(repo: tuple[Path, Path]) -> None:
    root, run_dir = repo
    done = _kfbot("reproduce", run_dir.name, "--repo", str(root), cwd=root.parent)
    assert done.returncode == 3 and "no CUDA GPU" in done.stderr  # found, then no GPU
    missing = _kfbot("reproduce", "gelu-9", "--repo", str(root), cwd=root.parent)
    assert missing.returncode == 2
    assert f"{root / '.kfbot' / 'runs' / 'gelu-9'}: no report.json" in missing.stderr


def test_a_folder_that_is_not_a_run_is_refused(repo: tuple[Path, Path], tmp_path: Path) -> None:
    root, run_dir = repo
    done = _kfbot("reproduce", str(tmp_path), cwd=root)
    assert done.returncode == 2
    assert f"{tmp_path}: no report.json: not a kfbot run folder" in done.stderr
    empty = tmp_path / "empty"
    shutil.copytree(run_dir, empty)
    data = json.loads((empty / "report.json").read_text())
    (empty / "report.json").write_text(json.dumps({**data, "candidate": None, "best": None}))
    done = _kfbot("reproduce", str(empty), cwd=root)
    assert done.returncode == 2 and "the run committed no candidate" in done.stderr


def test_a_run_from_uncommitted_changes_is_refused(repo: tuple[Path, Path],
                                                  tmp_path: Path) -> None:
    root, run_dir = repo
    dirty = root / ".kfbot" / "runs" / "dirty"
    shutil.copytree(run_dir, dirty)
    data = json.loads((dirty / "report.json").read_text())
    data["base"]["changed"] = ["csrc/gelu_kernel.cu"]
    (dirty / "report.json").write_text(json.dumps(data))
    done = _kfbot("reproduce", str(dirty), cwd=root)
    assert done.returncode == 2
    assert "the run started from uncommitted changes (csrc/gelu_kernel.cu)" in done.stderr


def test_a_patch_that_does_not_apply_fails_the_reproduction(repo: tuple[Path, Path]) -> None:
    root, run_dir = repo
    broken = root / ".kfbot" / "runs" / "broken"
    shutil.copytree(run_dir, broken)
    patch = (broken / "best.patch").read_text()
    (broken / "best.patch").write_text(patch.replace("-constexpr int kBlockSize = 128;",
                                                     "-constexpr int kBlockSize = 64;"))
    done = _kfbot("reproduce", str(broken), cwd=root)
    assert done.returncode == 1
    assert "the run's patch does not apply to commit" in done.stderr
    assert _git(root, "worktree", "list").count("\n") == 0


def test_the_figures_and_the_five_percent_rule() -> None:
    shapes = (ShapeFigures("(4096, 1024) float32", 2.0, 1.92, 100.0, 52.1, 64),
              ShapeFigures("(7, 33) float32", 1.5, 1.44, 10.0, 6.9, 64))
    rep = Reproduction("c" * 64, shapes, "CUDA events")
    data = rep.to_json()
    assert [(s["shape"], s["reported"], s["reproduced"]) for s in data["shapes"]] == [
        ("(4096, 1024) float32", 2.0, 1.92), ("(7, 33) float32", 1.5, 1.44)]
    assert data["speedup"]["reported"] == pytest.approx((2.0 * 1.5) ** 0.5)
    assert data["speedup"]["reproduced"] == pytest.approx((1.92 * 1.44) ** 0.5)
    assert rep.agrees and data["agrees"] is True  # 4% below: within
    assert Reproduction.from_json(data) == rep
    short = Reproduction("c" * 64, (ShapeFigures("s", 2.0, 1.89, 1.0, 0.53),), "")
    assert not short.agrees and "falls short of the report" in short.summary()
    above = Reproduction("c" * 64, (ShapeFigures("s", 2.0, 2.5, 1.0, 0.4),), "")
    assert above.agrees  # faster than reported never makes the report overstate
    assert not Reproduction("c" * 64, (), "").agrees


def test_the_report_speaks_in_words_and_figures(repo: tuple[Path, Path]) -> None:
    _, run_dir = repo
    report = (run_dir / "report.md").read_text()
    assert "{'evaluations'" not in report and "Spent:" not in report
    assert "The search stopped: it finished; it took 1 evaluation in 0.0s, 0 tokens, $0.00." \
        in report
    progress = report[report.index("## Progress"):]
    legend = progress[progress.index("```mermaid"):].split("```\n", 1)[1].splitlines()[0]
    assert legend == "🟦 island 0: 1.30x at evaluation 1"  # the line named, with its best
    chart = (run_dir / "progress.png").is_file()
    assert ("The same chart is drawn in `progress.png`" in report) == chart
    assert ("`progress.png` was not drawn: matplotlib is not installed" in report) != chart
