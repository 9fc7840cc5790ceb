"""Where a speedup holds: the per-shape picture of the committed candidate.

Each timed shape is one row: whether the repository's own tests use it (captured) or
kfbot made it by scaling a captured one up or down (held-out), the original's and the
candidate's median, the speedup with its 95 % interval, and a bar GitHub renders as
text. Beside the table, a Mermaid bar chart of the same speedups, and one line for
each shape where the candidate is significantly slower than the original, or than the
repository's own fastest variant of the op where one was timed.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from kfbot.evaluate.evaluation import ShapeTiming

BAR_WIDTH = 20  # characters for the largest speedup
CAPTURED = "captured"
HELD_OUT = "held-out"


@dataclass(frozen=True)
class ShapeRow:
    shape: str
    kind: str  # CAPTURED or HELD_OUT
    original_us: float
    candidate_us: float
    speedup: float
    low: float
    high: float
    verdict: str
    variant_us: float | None = None  # the repository's fastest variant here, if timed


def rows_of(captured: Sequence[ShapeTiming], held_out: Sequence[ShapeTiming] = (),
            variants: Mapping[str, float] | None = None) -> list[ShapeRow]:
    """The rows, captured shapes first; `variants` maps a shape to the repository's
    fastest variant's median there."""
    seen = {t.input for t in captured}
    out = []
    for kind, timings in ((CAPTURED, captured), (HELD_OUT, [t for t in held_out
                                                           if t.input not in seen])):
        for t in timings:
            s = t.speedup
            out.append(ShapeRow(t.input, kind, s.baseline.median, s.candidate.median,
                                s.ratio, s.ci_low, s.ci_high, s.verdict,
                                (variants or {}).get(t.input)))
    return out


def _bar(value: float, top: float) -> str:
    n = max(1, round(BAR_WIDTH * value / top)) if top > 0 else 1
    return "█" * n


def markdown(rows: Sequence[ShapeRow]) -> str:
    """The table with bars and the Mermaid chart, for the report and the pull request."""
    if not rows:
        return "No shape was timed.\n"
    top = max(r.speedup for r in rows)
    variant = any(r.variant_us is not None for r in rows)
    head = "| shape | | original | candidate | speedup (95% interval) | |"
    rule = "|---|---|---:|---:|---:|---|"
    if variant:
        head += " repository's best variant |"
        rule += "---:|"
    lines = [head, rule]
    for r in rows:
        line = (f"| `{r.shape}` | {r.kind} | {r.original_us:.2f} µs | {r.candidate_us:.2f} µs "
                f"| {r.speedup:.2f}x ({r.low:.2f}-{r.high:.2f}) | `{_bar(r.speedup, top)}` |")
        if variant:
            line += f" {r.variant_us:.2f} µs |" if r.variant_us is not None else " - |"
        lines.append(line)
    return "\n".join([*lines, "", mermaid(rows), *slower_lines(rows)]) + "\n"


def mermaid(rows: Sequence[ShapeRow]) -> str:
    """A bar per shape (c: captured, h: held-out), a line at 1x."""
    labels = ", ".join(f'"{"c" if r.kind == CAPTURED else "h"}{i + 1}"'
                       for i, r in enumerate(rows))
    top = max(max(r.high for r in rows), 1.0) * 1.1
    bars = ", ".join(f"{r.speedup:.2f}" for r in rows)
    ones = ", ".join("1" for _ in rows)
    legend = "; ".join(f"{'c' if r.kind == CAPTURED else 'h'}{i + 1}: {r.shape}"
                       for i, r in enumerate(rows))
    return "\n".join(["```mermaid", "xychart-beta", '    title "speedup per shape"',
                      f"    x-axis [{labels}]", f'    y-axis "x faster" 0 --> {top:.1f}',
                      f"    bar [{bars}]", f"    line [{ones}]", "```", "",
                      f"Shapes: {legend} (c: the repository's tests use it; h: held out, "
                      "scaled from one they use).", ""])


def slower_lines(rows: Sequence[ShapeRow]) -> list[str]:
    """One line per shape where the candidate loses: to the original, or to the
    repository's own fastest variant."""
    out = []
    for r in rows:
        if r.verdict == "slower":
            out.append(f"- slower than the original at `{r.shape}` ({r.kind}): "
                       f"{r.original_us:.2f} µs -> {r.candidate_us:.2f} µs ({r.speedup:.2f}x)")
        if r.variant_us is not None and r.candidate_us > r.variant_us:
            out.append(f"- slower than the repository's own fastest variant at `{r.shape}` "
                       f"({r.kind}): {r.variant_us:.2f} µs against {r.candidate_us:.2f} µs")
    return out


def held_out_slower(rows: Sequence[ShapeRow]) -> list[ShapeRow]:
    """Held-out shapes where the candidate is significantly slower than the original:
    without a size dispatch that keeps the original there, it is not committed."""
    return [r for r in rows if r.kind == HELD_OUT and r.verdict == "slower"]


def prompt_lines(rows: Sequence[ShapeRow], limit: int = 8) -> tuple[str, ...]:
    """The picture in a few lines for the LLM mutator."""
    return tuple(f"{r.shape} ({r.kind}): {r.speedup:.2f}x [{r.low:.2f}, {r.high:.2f}], "
                 f"{r.verdict}" for r in rows[:limit])


def light_lines(timings: Sequence[ShapeTiming], limit: int = 8) -> tuple[str, ...]:
    """Per shape, how close the candidate is to the speed of light on this GPU (the
    floor from the bytes it must move and the FLOPs it must do): how much speed is
    left to find there."""
    out = []
    for t in timings[:limit]:
        if t.floor is not None and t.light is not None:
            out.append(f"{t.input}: {t.light:.0f}% of the speed of light "
                       f"({t.floor.bound} floor {t.floor.us:.2f} µs, now "
                       f"{t.speedup.candidate.median:.2f} µs)")
    return tuple(out)


def section(captured: Sequence[ShapeTiming], held_out: Sequence[ShapeTiming],
            variants: Mapping[str, float], notes: Sequence[str]) -> list[str]:
    """The "Where it holds" section of the report and the pull request (empty when no
    shape was timed)."""
    if not captured and not held_out:
        return []
    said = [f"{n}." for n in notes if n]
    return ["## Where it holds", "", *said, *([""] if said else []),
            markdown(rows_of(captured, held_out, variants)), ""]
