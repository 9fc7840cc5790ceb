"""What a search leaves behind for people: the patch, the progress chart, the history.

The chart is best speedup against evaluations, one line per island: a Mermaid
`xychart-beta` block for Markdown (GitHub draws it), and a PNG when matplotlib is
installed (`pip install 'kfbot[gpu]'`; without it the PNG is skipped and the report
says so). Mermaid's xychart names no lines, so the block sets each island's colour and
a legend under it names them with squares of the same colours. The speedup axis starts
just below the data, not at zero, where a 1.0x to 1.3x climb would be a flat line.
"""

from __future__ import annotations

import difflib
import json
from collections.abc import Mapping, Sequence
from pathlib import Path

from kfbot.search.evolution.archive import Individual

Series = dict[int, list[tuple[int, float]]]


def unified_patch(originals: Mapping[str, str | None], changed: Mapping[str, str]) -> str:
    """A `git apply`-able patch from the original texts to the candidate's."""
    out = []
    for path in sorted(changed):
        before = originals.get(path)
        old = (before or "").splitlines(keepends=True)
        new = changed[path].splitlines(keepends=True)
        src = f"a/{path}" if before is not None else "/dev/null"
        lines = list(difflib.unified_diff(old, new, src, f"b/{path}"))
        if lines:
            out.append(f"diff --git a/{path} b/{path}\n")
            if before is None:
                out.append("new file mode 100644\n")
            out += [line if line.endswith("\n") else line + "\n\\ No newline at end of file\n"
                    for line in lines]
    return "".join(out)


def best_so_far(history: Sequence[Individual], islands: int) -> Series:
    """Per island, (evaluation number, best speedup so far) at every improvement."""
    series: Series = {i: [] for i in range(islands)}
    best = dict.fromkeys(range(islands), 1.0)
    for ind in history:
        if ind.fitness is not None and ind.fitness > best[ind.island]:
            best[ind.island] = ind.fitness
            series[ind.island].append((ind.step, ind.fitness))
    last = max((ind.step for ind in history), default=0)
    for i, points in series.items():
        series[i] = [(0, 1.0), *points, (last, best[i])]
    return series


# Each island's colour in both charts, and the square that names it in a Markdown legend.
PALETTE = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#333333",
           "#aaaaaa")
_SQUARES = ("🟦", "🟧", "🟩", "🟥", "🟪", "🟫", "⬛", "⬜")


def mermaid_chart(series: Series, title: str = "best speedup by evaluation") -> str:
    """An xychart-beta: x is the evaluation number, one coloured line per island, the
    y axis from just below the slowest to just above the best; a legend follows it."""
    last = max((p[0] for pts in series.values() for p in pts), default=0)
    xs = list(range(0, last + 1, max(1, last // 16)))
    low, high = axis_range(series)
    islands = sorted(series)
    colours = ", ".join(PALETTE[i % len(PALETTE)] for i in islands)
    theme = {"themeVariables": {"xyChart": {"plotColorPalette": colours}}}
    lines = ["```mermaid", f"%%{{init: {json.dumps(theme)}}}%%",
             "xychart-beta", f'    title "{title}"',
             f"    x-axis \"evaluations\" [{', '.join(str(x) for x in xs)}]",
             f'    y-axis "speedup (x, 1.0 = the original)" {low:.2f} --> {high:.2f}']
    for island in islands:
        values = [_at(series[island], x) for x in xs]
        lines.append(f"    line [{', '.join(f'{v:.3f}' for v in values)}]")
    lines.append("```")
    return "\n".join(lines) + "\n" + legend(series) + "\n"


def legend(series: Series) -> str:
    """One Markdown line naming each island's line by its colour, with its best."""
    parts = []
    for island in sorted(series):
        points = series[island]
        best = max(points, key=lambda p: (p[1], -p[0])) if points else (0, 1.0)
        where = f"{best[1]:.2f}x at evaluation {best[0]}" if best[1] > 1.0 else "no gain"
        parts.append(f"{_SQUARES[island % len(_SQUARES)]} island {island}: {where}")
    return " · ".join(parts)


def axis_range(series: Series) -> tuple[float, float]:
    """The speedup axis: a little room below the lowest value and above the highest,
    on round hundredths, so the lines fill the chart."""
    values = [p[1] for pts in series.values() for p in pts] or [1.0]
    low, high = min(values), max(values)
    pad = max((high - low) * 0.1, 0.05)
    return max(0.0, round(low - pad, 2)), round(high + pad, 2)


def _at(points: Sequence[tuple[int, float]], x: int) -> float:
    """The step function's value at evaluation `x`."""
    value = 1.0
    for step, speed in points:
        if step > x:
            break
        value = speed
    return value


def png_chart(series: Series, path: Path, title: str = "best speedup by evaluation") -> bool:
    """Draw the chart as a PNG; False (and nothing written) without matplotlib."""
    try:
        import matplotlib

        matplotlib.use("Agg")  # no display: write files only
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    fig, ax = plt.subplots(figsize=(7, 4), dpi=120)
    for island in sorted(series):
        xs, ys = zip(*series[island], strict=True) if series[island] else ((), ())
        ax.step(xs, ys, where="post", color=PALETTE[island % len(PALETTE)],
                label=f"island {island} (best {max(ys, default=1.0):.2f}x)")
    ax.axhline(1.0, color="grey", linewidth=0.8, linestyle=":", label="the original (1.0x)")
    ax.set_ylim(*axis_range(series))
    ax.set_xlabel("evaluations")
    ax.set_ylabel("best speedup (x)")
    ax.set_title(title)
    ax.legend(loc="lower right")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path)
    plt.close(fig)
    return True


def history_table(history: Sequence[Individual], limit: int = 40) -> str:
    """The search history in Markdown, best first, failures with their reasons."""
    rows = ["| # | island | origin | cell | speedup | result |", "|---|---|---|---|---|---|"]
    ranked = sorted(history, key=lambda i: (i.fitness is None, -(i.fitness or 0.0), i.step))
    for ind in ranked[:limit]:
        speed = f"{ind.fitness:.3f}x" if ind.fitness is not None else "-"
        result = "correct" if ind.fitness is not None else f"{ind.stage}: {ind.reason[:80]}"
        rows.append(f"| {ind.step} | {ind.island} | {ind.origin} | {ind.cell.label()} | "
                    f"{speed} | {result.replace('|', '/')} |")
    return "\n".join(rows) + "\n"
