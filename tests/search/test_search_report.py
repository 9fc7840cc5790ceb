"""Search reports: a patch git can apply, the progress series, the Mermaid and PNG charts."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from kfbot.search.budget import duration_words, spent_words
from kfbot.search.evolution.archive import Individual
from kfbot.search.model import Cell
from kfbot.search.outcome.report import (
    axis_range,
    best_so_far,
    history_table,
    mermaid_chart,
    png_chart,
    unified_patch,
)

CELL = Cell("global", "none", "thread-per-element", "128")


def _ind(step: int, island: int, fitness: float | None) -> Individual:
    stage, reason = ("done", "correct") if fitness else ("correctness", "tail | differs")
    return Individual(f"h{step}", None, island, CELL, fitness, stage, reason, "params", step)


HISTORY = [_ind(1, 0, 1.2), _ind(2, 1, None), _ind(3, 0, 1.1), _ind(4, 1, 1.5),
           _ind(5, 0, 1.8), _ind(6, 1, 1.4)]


def test_the_patch_applies_with_git(tmp_path: Path) -> None:
    (tmp_path / "csrc").mkdir()
    (tmp_path / "csrc" / "k.cu").write_text("int a = 1;\nint b = 2;\n")
    subprocess.run(["git", "init", "-q"], cwd=tmp_path, check=True)
    patch = unified_patch({"csrc/k.cu": "int a = 1;\nint b = 2;\n", "new.h": None},
                          {"csrc/k.cu": "int a = 1;\nint b = 3;\n", "new.h": "#pragma once"})
    (tmp_path / "p.patch").write_text(patch)
    subprocess.run(["git", "apply", "p.patch"], cwd=tmp_path, check=True)
    assert (tmp_path / "csrc" / "k.cu").read_text() == "int a = 1;\nint b = 3;\n"
    assert (tmp_path / "new.h").read_text() == "#pragma once"
    assert unified_patch({"x": "same\n"}, {"x": "same\n"}) == ""


def test_best_so_far_is_a_step_function_per_island() -> None:
    series = best_so_far(HISTORY, 2)
    assert series[0] == [(0, 1.0), (1, 1.2), (5, 1.8), (6, 1.8)]
    assert series[1] == [(0, 1.0), (4, 1.5), (6, 1.5)]


def test_mermaid_chart_has_one_named_line_per_island() -> None:
    chart = mermaid_chart(best_so_far(HISTORY, 2))
    legend = chart.rsplit("```\n", 1)[1]
    head = chart.splitlines()[:3]
    assert head[0] == "```mermaid" and head[2] == "xychart-beta"
    # Each island's colour is set, so the legend's squares name the lines.
    assert head[1] == ('%%{init: {"themeVariables": {"xyChart": {"plotColorPalette": '
                       '"#1f77b4, #ff7f0e"}}}}%%')
    assert legend == "🟦 island 0: 1.80x at evaluation 5 · 🟧 island 1: 1.50x at evaluation 4\n"
    lines = [line for line in chart.splitlines() if line.strip().startswith("line [")]
    assert len(lines) == 2
    assert lines[0].strip() == "line [1.000, 1.200, 1.200, 1.200, 1.200, 1.800, 1.800]"
    assert 'x-axis "evaluations" [0, 1, 2, 3, 4, 5, 6]' in chart
    # The axis starts near the data (1.0 to 1.8), not at zero.
    assert '    y-axis "speedup (x, 1.0 = the original)" 0.92 --> 1.88' in chart.splitlines()
    assert axis_range({0: [(0, 1.0), (9, 1.02)]}) == (0.95, 1.07)


def test_a_spend_in_words_and_figures() -> None:
    assert spent_words({"evaluations": 23, "seconds": 253.2, "tokens": 0, "usd": 0.0}) == \
        "23 evaluations in 4m13s, 0 tokens, $0.00"
    assert spent_words({"evaluations": 1, "seconds": 3.25, "tokens": 12345, "usd": 0.4567}) == \
        "1 evaluation in 3.2s, 12,345 tokens, $0.46"
    assert duration_words(3725) == "1h02m"


def test_png_chart_is_a_real_png(tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    path = tmp_path / "out" / "progress.png"
    assert png_chart(best_so_far(HISTORY, 2), path)
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and path.stat().st_size > 2000


def test_history_table_ranks_and_escapes() -> None:
    table = history_table(HISTORY)
    rows = table.splitlines()[2:]
    assert rows[0].startswith("| 5 | 0 | params |") and "1.800x" in rows[0]
    assert rows[-1].startswith("| 2 | 1 |") and "tail / differs" in rows[-1]
