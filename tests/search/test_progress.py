"""How a search shows its progress: a line per evaluation when piped (a replayed search
through `kfbot optimize`'s own display), a heartbeat while a batch runs, the live table
on a terminal, a status every few minutes, and GitHub Actions log groups."""

from __future__ import annotations

import io
import os
import pty
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import git
import pytest
from rich.console import Console

from kfbot.search import progress
from kfbot.search.evolution.archive import Individual
from kfbot.search.model import Cell

ROOT = Path(__file__).resolve().parents[2]
CELL = Cell("global", "none", "thread-per-element", "128")
LINE = re.compile(r"evaluation (\d+)/12: island [01], (params|rules|migrant): "
                  r"(faster|slower|noise|correct|failed at [a-z]+)( \(.+\))?, "
                  r"(\d+\.\d{3}x|-), \d+\.\d s( \(best so far\))?")


def individual(step: int, fitness: float | None, island: int = 0) -> Individual:
    return Individual(f"h{step}", None, island, CELL, fitness,
                      "done" if fitness else "correctness", "tail block differs", "params",
                      step)


def test_a_piped_search_prints_one_line_per_evaluation(tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    shutil.copytree(ROOT / "fixtures" / "load_elementwise", repo)
    made = git.Repo.init(repo)
    made.git.add("-A")
    made.git.commit("-m", "initial", author="Dev <dev@example.com>",
                    env={"GIT_COMMITTER_NAME": "Dev", "GIT_COMMITTER_EMAIL": "dev@example.com"})
    proc = subprocess.run([sys.executable, str(ROOT / "tests" / "replay_search.py"), str(repo),
                           "gelu_kernel", "12", str(tmp_path / "runs")],
                          capture_output=True, text=True, timeout=120,
                          env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert proc.returncode == 0, proc.stderr
    lines = [line for line in proc.stdout.splitlines() if line.startswith("evaluation ")]
    assert [int(m.group(1)) for m in map(LINE.fullmatch, lines) if m] == list(range(1, 13)), \
        proc.stdout
    assert any(": faster, " in line for line in lines)
    assert any("failed at correctness (only the last partial block" in line for line in lines)
    assert "\x1b[" not in proc.stdout and "┃" not in proc.stdout  # no live table frames
    assert proc.stdout.rstrip().endswith("history: 12")


def test_a_heartbeat_while_a_batch_runs_quietly() -> None:
    out = io.StringIO()
    lines = progress.LogLines(out, budget=64, heartbeat_s=0.2)
    try:
        lines.evaluated(individual(1, 1.25), None)
        lines.batch_started(8)
        time.sleep(0.75)
        lines.batch_done()
        beats = out.getvalue().count("still working")
        time.sleep(0.5)
    finally:
        lines.close()
    text = out.getvalue()
    assert 2 <= beats <= 4, text
    assert text.count("still working") == beats  # nothing once the batch is done
    assert "still working: 8 candidates building, verifying or timing for 0s; 1/64 " \
           "evaluations, best so far 1.250x (island 0, params)" in text


def test_a_terminal_gets_the_live_table() -> None:
    leader, follower = pty.openpty()
    with os.fdopen(follower, "w") as terminal:
        shown = progress.for_stream(terminal, islands=2, budget=4)
        assert isinstance(shown, progress.LiveTable)
        shown.evaluated(individual(1, 1.3, island=1), None)
        shown.evaluated(individual(2, None), None)
        drawn = Console(file=io.StringIO(), width=100)
        drawn.print(shown.table())
        shown.close()
    os.close(leader)
    text = drawn.file.getvalue()  # type: ignore[attr-defined]
    assert re.search(r"│ 1 +│ 1 +│ 1\.300x +│ - ", text), text
    assert re.search(r"│ 0 +│ 1 +│ 1\.000x +│ correctness 1 ", text), text
    assert "2/4 evaluations, best so far 1.300x (island 1, params)" in text
    piped = progress.for_stream(io.StringIO(), islands=2, budget=4)
    assert isinstance(piped, progress.LogLines)
    piped.close()


def test_the_status_is_said_at_most_every_interval() -> None:
    now = [0.0]
    said: list[str] = []
    every = progress.Every(said.append, 180.0, budget=64, clock=lambda: now[0])
    for step, (at, fitness) in enumerate([(10, 1.1), (170, None), (200, 1.4), (250, 1.5),
                                          (390, None)], start=1):
        now[0] = at
        every.evaluated(individual(step, fitness), None)
    assert len(said) == 2
    assert said[0].startswith("3/64 evaluations, best so far 1.400x (island 0, params)")
    assert said[1].startswith("5/64 evaluations, best so far 1.500x")


def test_github_actions_logs_get_a_group_per_kernel(monkeypatch: pytest.MonkeyPatch) -> None:
    out = io.StringIO()
    monkeypatch.setenv("GITHUB_ACTIONS", "true")
    with progress.log_group("kfbot optimize a.cu::k\nsecond line", out):
        out.write("work\n")
    assert out.getvalue() == "::group::kfbot optimize a.cu::k second line\nwork\n::endgroup::\n"
    monkeypatch.delenv("GITHUB_ACTIONS")
    quiet = io.StringIO()
    with progress.log_group("kfbot optimize", quiet):
        quiet.write("work\n")
    assert quiet.getvalue() == "work\n"
