"""`kfbot optimize` on a GPU: params and rules alone find a verified speedup on the
bundled example's softmax, and the run leaves its report, patch, chart and lessons."""

from __future__ import annotations

import shutil
from pathlib import Path

import git
import pytest

from kfbot.config import load_config
from kfbot.evaluate.engine import Engine, EngineSettings
from kfbot.evaluate.task import make_task
from kfbot.scan.scanner import scan
from kfbot.scan.select import select_kernel
from kfbot.search.runner import OptimizeSettings, optimize

pytestmark = pytest.mark.gpu

EXAMPLE = Path(__file__).resolve().parents[1] / "fixtures" / "example"


def test_params_and_rules_speed_up_the_example_softmax(tmp_path: Path) -> None:
    root = tmp_path / "example"
    shutil.copytree(EXAMPLE, root)
    repo = git.Repo.init(root)
    repo.git.add("-A")  # the fixture's files, not the new .git folder
    repo.index.commit("example")
    config = load_config(None, root)
    task = make_task(select_kernel(scan(root, config).kernels, "softmax_kernel"), root, config)
    settings = OptimizeSettings(islands=2, seed=1, evaluations=12, batch=2)
    with Engine(task, EngineSettings(cache_dir=tmp_path / "cache",
                                     timing={"max_trials": 40, "min_trials": 10})) as engine:
        assert engine.baseline().ok
        outcome = optimize(task, engine, settings, root / ".kfbot" / "runs" / "t")
    assert outcome.best is not None and outcome.best.ok
    assert outcome.best.verdict == "faster", outcome.best.reason
    run = root / ".kfbot" / "runs" / "t"
    assert (run / "report.md").is_file() and (run / "best.patch").is_file()
    assert len((run / "evaluations.jsonl").read_text().splitlines()) <= 12
    assert (root / ".kfbot" / "experience.md").is_file()
