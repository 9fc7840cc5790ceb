"""Evaluations for people (rich tables, Markdown) and machines (JSON)."""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

from rich.console import Console
from rich.markup import escape
from rich.table import Table
from rich.text import Text

from kfbot.evaluate.baseline.steps import StepReport, first_failure
from kfbot.evaluate.evaluation import Evaluation, ShapeTiming
from kfbot.evaluate.inputs.contract import FINDING as CONTRACT_FINDING
from kfbot.evaluate.verdict.light import light_text
from kfbot.terminal import fitted, wrapped

MARKS = {"faster": "✓ faster", "slower": "✗ slower", "noise": "≈ noise"}
_PLAIN_MARKS = {"ok": ("ok", "green"), "warning": ("warning", "yellow"),
                "failed": ("FAILED", "red"), "skipped": ("skipped", "dim")}


def verdict_line(name: str, ev: Evaluation) -> str:
    """The one line a person reads first."""
    if not ev.ok:
        return f"{name}: REJECTED at {ev.stage}: {ev.reason}"
    if ev.speedup is None:
        return f"{name}: correct ({ev.reason})"
    ratios = [t.speedup.ratio for t in ev.timings]
    gpu = ev.environment.get("gpu", "GPU")
    shapes = f"{len(ratios)} shape{'s' if len(ratios) != 1 else ''}"
    spread = f"per shape {min(ratios):.2f}x-{max(ratios):.2f}x" if len(ratios) > 1 else \
        f"95% CI {ev.timings[0].speedup.ci_low:.2f}-{ev.timings[0].speedup.ci_high:.2f}"
    light = f", {ev.light:.0f}% of the speed of light" if ev.light is not None else ""
    return (f"{name}: {ev.speedup:.2f}x {MARKS[ev.verdict or 'noise']} (geometric mean over "
            f"{shapes}; {spread}){light} on {gpu}, verified on {len(ev.checks)} checks")


def print_steps(steps: Sequence[StepReport], console: Console, details: bool = True) -> None:
    """Each baseline step with its outcome; with `details`, the evidence and the
    suggested kfbot.yaml snippet of the steps that failed or warn. Lines fit the
    console's width where it is a terminal or $COLUMNS says it (kfbot.terminal)."""
    columns = _columns(console)
    for step in steps:
        mark, style = _PLAIN_MARKS[step.outcome]
        head = f"{step.step:>11}  {mark}  "
        for n, line in enumerate(wrapped(head + step.summary, columns, len(head))):
            text = Text(line)
            if n == 0:
                text.stylize(style, 13, 13 + len(mark))
            console.print(text, highlight=False, soft_wrap=True)
        if details and step.outcome in ("failed", "warning"):
            print_step_details(step, console)
        elif details and step.step == "pair" and step.evidence:
            # The observed tests: what running them on a GPU showed, one per line.
            for line in step.evidence.splitlines():
                console.print(f"            | {line}", highlight=False, markup=False,
                              soft_wrap=True)


def print_step_details(step: StepReport, console: Console) -> None:
    columns = _columns(console)
    lines: list[str] = []
    if step.evidence:
        lines.append("             what was checked:" if step.step == "environment" else
                     "             evidence:")
        lines += fitted((f"             | {line}" for line in step.evidence.splitlines()),
                        columns, 4)
    if step.suggestion:
        lines.append("             kfbot.yaml that would get past this step:")
        # YAML is not wrapped: a folded line would no longer be the same YAML. A comment
        # that does not fit is left out instead.
        lines += [_fit_yaml(f"               {line}", columns)
                  for line in step.suggestion.splitlines()]
    for line in lines:
        console.print(line, highlight=False, markup=False, soft_wrap=True)


def _fit_yaml(line: str, columns: int | None) -> str:
    """A YAML line of a suggestion within `columns`: without its trailing comment where
    the line is too long with it."""
    if columns is None or len(line) <= columns:
        return line
    code, comment, _ = line.partition("  # ")
    return code.rstrip() if comment else line


def _columns(console: Console) -> int | None:
    return console.width if console.is_terminal or os.environ.get("COLUMNS") else None


def print_failed_step(ev: Evaluation, console: Console) -> None:
    """For a baseline that stopped at a step: that step's evidence and snippet."""
    failure = first_failure(ev.steps)
    if failure is not None:
        print_step_details(failure, console)


def print_checks(ev: Evaluation, console: Console) -> None:
    table = Table(title="verification", show_lines=False)
    for col in ("input", "against", "result", "max abs err", "max rel err", "where"):
        table.add_column(col)
    for c in ev.checks:
        result = "ok" if c.passed else ("ERROR" if c.error else "MISMATCH")
        table.add_row(
            c.input,
            c.against,
            result,
            f"{c.max_abs_error:.3g}",
            f"{c.max_rel_error:.3g}",
            c.error or c.description or c.where,
        )
    console.print(table)


def print_timings(timings: Sequence[ShapeTiming], console: Console) -> None:
    table = Table(title="benchmark (µs, median ± IQR; speedup = original / candidate; "
                        "% of light = the floor this GPU allows / the candidate's time)")
    for col in ("input", "original", "candidate", "speedup", "95% CI", "verdict",
                "% of light", "floor µs", "bound"):
        table.add_column(col)
    for t in timings:
        s = t.speedup
        table.add_row(
            t.input,
            f"{s.baseline.median:.2f} ± {s.baseline.iqr:.2f}",
            f"{s.candidate.median:.2f} ± {s.candidate.iqr:.2f}",
            f"{s.ratio:.3f}x",
            f"{s.ci_low:.3f}-{s.ci_high:.3f}",
            MARKS[s.verdict],
            light_text(t.light),
            _floor_text(t),
            t.bound,
        )
    console.print(table)


def _floor_text(t: ShapeTiming) -> str:
    if t.floor is None:
        return "–"
    return f"{t.floor.us:.2f} ({t.floor.bound})"


def print_findings(ev: Evaluation, console: Console) -> None:
    """Anti-cheating findings: what rejected the candidate, warnings, review flags."""
    for f in ev.findings:
        if f.check == CONTRACT_FINDING:
            continue
        style = {"strict": "red", "warn": "yellow"}.get(f.severity, "dim")
        where = f"\n    {f.evidence}" if f.evidence else ""
        text = escape(f"[{f.check}] {f.reason}{where}")
        console.print(f"[{style}]{f.layer} {f.severity}[/{style}] {text}", highlight=False)
    about = [f for f in ev.findings if f.check == CONTRACT_FINDING]
    if about:
        console.print(f"[yellow]about the original[/yellow] ({len(about)} added inputs left "
                      "out of the contract; candidates are not checked on them):",
                      highlight=False)
    for f in about:
        console.print(f"    {escape(f.reason)}", highlight=False)


def print_diagnostics(ev: Evaluation, console: Console) -> None:
    for d in ev.diagnostics:
        where = f"{d.file}:{d.line}: " if d.file else ""
        console.print(f"[dim]{d.stage}/{d.kind}[/dim] {where}{d.message}", highlight=False)


def to_json(name: str, ev: Evaluation) -> dict[str, Any]:
    return {
        "kernel": name,
        "candidate": ev.candidate,
        "ok": ev.ok,
        "stage": ev.stage,
        "reason": ev.reason,
        "verdict": ev.verdict,
        "speedup": ev.speedup,
        "build_seconds": ev.build_seconds,
        "eval_seconds": ev.eval_seconds,
        "environment": dict(ev.environment),
        "checks": [vars(c) for c in ev.checks],
        "timings": [_timing_json(t) for t in ev.timings],
        "diagnostics": [vars(d) for d in ev.diagnostics],
        "findings": [f.to_json() for f in ev.findings],
        "needs_review": ev.needs_review,
        "steps": [step.to_json() for step in ev.steps],
    }


def _timing_json(t: ShapeTiming) -> dict[str, Any]:
    s = t.speedup
    return {
        "input": t.input,
        "speedup": s.ratio,
        "ci_low": s.ci_low,
        "ci_high": s.ci_high,
        "verdict": s.verdict,
        "original_median_us": s.baseline.median,
        "original_iqr_us": s.baseline.iqr,
        "candidate_median_us": s.candidate.median,
        "candidate_iqr_us": s.candidate.iqr,
        "samples": [s.baseline.n, s.candidate.n],
        "bytes": t.bytes,
        "bandwidth_bytes_per_s": t.bandwidth,
        "flop_per_s": t.flop_rate,
        "bound": t.bound,
        "floor_us": t.floor.us if t.floor else None,
        "floor_bound": t.floor.bound if t.floor else None,
        "floor_flops_from": t.floor.flops_from if t.floor else None,
        "percent_of_light": t.light,
        "original_percent_of_light": t.original_light,
        "signature": dict(t.signature) if t.signature else None,
    }


def to_markdown(name: str, ev: Evaluation) -> str:
    lines = [f"**{verdict_line(name, ev)}**", ""]
    if ev.timings:
        lines += [
            "| input | original µs | candidate µs | speedup | 95% CI | verdict "
            "| % of speed of light |",
            "|---|---|---|---|---|---|---|",
        ]
        for t in ev.timings:
            s = t.speedup
            lines.append(
                f"| {t.input} | {s.baseline.median:.2f} ± {s.baseline.iqr:.2f} | "
                f"{s.candidate.median:.2f} ± {s.candidate.iqr:.2f} | {s.ratio:.3f}x | "
                f"{s.ci_low:.3f}–{s.ci_high:.3f} | {MARKS[s.verdict]} | "
                f"{light_text(t.light)} |"
            )
    cheats = [f for f in ev.findings if f.check != CONTRACT_FINDING]
    about = [f for f in ev.findings if f.check == CONTRACT_FINDING]
    if cheats:
        lines += ["", "Anti-cheating findings:", ""]
        lines += [f"- {f.layer}/{f.severity}: {f.line()}" for f in cheats]
    if about:
        lines += ["", "About the original (inputs left out of the contract):", ""]
        lines += [f"- {f.reason}" for f in about]
    failure = first_failure(ev.steps)
    if failure is not None:
        lines += ["", f"Stopped at the {failure.step} step: {failure.summary}"]
        if failure.evidence:
            lines += ["", "```", failure.evidence, "```"]
        if failure.suggestion:
            lines += ["", "A kfbot.yaml that would get past it:", "", "```yaml",
                      failure.suggestion, "```"]
    return "\n".join(lines) + "\n"
