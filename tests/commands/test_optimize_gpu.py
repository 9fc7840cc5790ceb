"""`kfbot optimize` on a GPU: params and rules alone find a verified speedup on the
bundled example's softmax, and the run leaves its report, patch, chart and lessons."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import git
import pytest

from kfbot.config import load_config
from kfbot.evaluate.engine import Engine, EngineSettings
from kfbot.evaluate.task import make_task
from kfbot.scan.scanner import scan
from kfbot.scan.select import select_kernel
from kfbot.search.plan import OptimizeSettings
from kfbot.search.runner import optimize

pytestmark = pytest.mark.gpu

EXAMPLE = Path(__file__).resolve().parents[2] / "fixtures" / "example"


def test_params_and_rules_speed_up_the_example_softmax(tmp_path: Path) -> None:
    root = tmp_path / "example"
    shutil.copytree(EXAMPLE, root)
    repo = git.Repo.init(root)
    repo.git.add("-A")  # the fixture's files, not the new .git folder
    repo.index.commit("example")
    config = load_config(None, root)
    task = make_task(select_kernel(scan(root, config).kernels, "softmax_kernel"), root, config)
    settings = OptimizeSettings(islands=2, seed=1, evaluations=12, batch=2)
    cache = Path(os.environ.get("KFBOT_TEST_CACHE") or tmp_path / "cache")  # kept: no rebuilds
    with Engine(task, EngineSettings(cache_dir=cache,
                                     timing={"max_trials": 40, "min_trials": 10})) as engine:
        assert engine.baseline().ok
        outcome = optimize(task, engine, settings, root / ".kfbot" / "runs" / "t")
    assert outcome.best is not None and outcome.best.ok
    assert outcome.committed is not None, outcome.best.reason
    committed, cand = outcome.committed
    assert committed.verdict == "faster" and not cand.params, committed.reason
    run = root / ".kfbot" / "runs" / "t"
    assert (run / "report.md").is_file() and (run / "best.patch").is_file()
    assert json.loads((run / "report.json").read_text())["candidate"] == cand.hash
    assert f"**Committed candidate `{cand.short}`**" in (run / "report.md").read_text()
    assert len((run / "evaluations.jsonl").read_text().splitlines()) <= 12
    # A lesson, with where it was measured, unless a warning kept the candidate from
    # teaching one (the report says which).
    experience = root / ".kfbot" / "experience.md"
    if experience.is_file():
        assert "- run: t\n" in experience.read_text() and "- arch: sm_" in experience.read_text()
    else:
        assert "No lesson was recorded:" in (run / "report.md").read_text()


def test_the_kfbot_optimize_command_finds_a_verified_speedup(tmp_path: Path) -> None:
    """The command a user runs, as a subprocess: its final lines name a faster winner,
    and the user's checkout is left as it was (the winner goes to a new branch)."""
    root = tmp_path / "example"
    shutil.copytree(EXAMPLE, root)
    repo = git.Repo.init(root)
    repo.git.add("-A")
    repo.index.commit("example")
    head = repo.head.commit.hexsha
    env = {**os.environ, "KFBOT_CACHE": os.environ.get("KFBOT_CACHE", str(tmp_path / "cache"))}
    env.pop("ANTHROPIC_API_KEY", None)
    done = subprocess.run(
        [sys.executable, "-m", "kfbot", "optimize", "softmax_kernel", "--repo", str(root),
         "--budget", "16", "--islands", "2", "--seed", "1", "--no-llm"],
        capture_output=True, text=True, timeout=1200, env=env, check=False)
    print(done.stdout[-6000:])  # the final table, for the record (pytest -s)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    # Piped, as in a CI log: a plain line per evaluation, never the live table.
    evaluations = [line for line in done.stdout.splitlines() if line.startswith("evaluation ")]
    assert 1 <= len(evaluations) <= 16 and "┃" not in done.stdout, done.stdout[-3000:]
    assert all(re.match(r"evaluation \d+/16: island [01], \w+: ", e) for e in evaluations)
    best = [line for line in done.stdout.splitlines() if line.startswith("best: ")]
    assert best and "(faster)" in best[0], done.stdout[-3000:]
    assert repo.head.commit.hexsha == head and not repo.is_dirty(untracked_files=False)
    assert any(b.name.startswith("kfbot/") for b in repo.branches), [b.name for b in repo.branches]
