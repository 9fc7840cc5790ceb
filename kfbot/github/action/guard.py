"""The pull-request guard of `kfbot action`: the kernels a pull request changes are
verified and timed against its base branch, and the verdict goes into one status
comment, the job summary and annotations on the kernels."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from kfbot import git
from kfbot.cache import cache_dir
from kfbot.errors import EXIT_FAILURE, EXIT_MISSING_TOOL, EXIT_OK, KfbotError
from kfbot.evaluate.against_base import Comparison, compare_with_base
from kfbot.github.action.context import Context
from kfbot.github.action.gpu import GPU_HINT, require_gpu
from kfbot.github.action.scan import problem_annotations
from kfbot.github.action_io import Annotation, Level, Result
from kfbot.github.events import PullRequestEvent
from kfbot.github.status import State, StatusReport, withheld
from kfbot.scan.changes import (
    BrokenPairing,
    ChangedKernel,
    broken_pairings,
    changed_kernels,
    changed_paths,
)
from kfbot.scan.scanner import scan

log = logging.getLogger(__name__)


def guard_mode(ctx: Context, event: PullRequestEvent) -> Result:
    """Verify the kernels a pull request changes and time them against its base branch."""
    config = ctx.config()
    report = scan(ctx.root, config)
    fork_point = merge_base(ctx.root, event.base_sha, event.number)
    changed = changed_kernels(ctx.root, fork_point, report=report)
    log.info("pull request #%d left %s at %s: %d kernels changed", event.number,
             event.base_ref, fork_point[:7], len(changed))
    broken = broken_pairings(ctx.root, fork_point, report)
    notes = problem_annotations(report, set(changed_paths(ctx.root, fork_point)))
    notes += tuple(Annotation("warning", b.line(event.base_ref), b.kernel.file,
                              b.kernel.definition.line, "kfbot guard") for b in broken)
    status = ctx.status_sink(event.number, "guard")
    if not changed and not broken:
        result = Result("no kernel changed in this pull request", annotations=notes)
        # An earlier push changed kernels: say that is over.
        status.show_if_exists(_guard_status(ctx, event, result))
        return result
    try:
        if changed:  # only lost reference tests: nothing to build
            require_gpu(ctx.root, ctx.inputs.gpu)
        comparisons = [compare_with_base(ctx.root, event.base_sha, item, ctx.inputs.gpu,
                                         cache_dir(), config) for item in changed]
        result = _guarded(changed, comparisons, _lost(broken, event.base_ref), notes,
                          Tolerance(ctx.inputs.slowdown_threshold, ctx.inputs.warn_only))
    except KfbotError as exc:
        if exc.exit_code != EXIT_MISSING_TOOL:
            raise
        result = _not_guarded(changed, _lost(broken, event.base_ref), str(exc), notes)
    status.show(_guard_status(ctx, event, result))
    return result


def merge_base(root: Path, base_sha: str, number: int) -> str:
    """Where the pull request left its base: its own changes are those since then."""
    try:
        return git.text(root, "merge-base", base_sha, "HEAD")
    except git.GitError:
        raise KfbotError(f"the base commit {base_sha[:7]} of pull request #{number} is not in "
                         f"the checkout at {root}: check out with `fetch-depth: 0`") from None


def _guard_status(ctx: Context, event: PullRequestEvent, result: Result) -> StatusReport:
    """The sticky comment's last word; for a fork's pull request, without anything its
    code printed (the run's log has it)."""
    state: State = "passed" if result.exit_code == EXIT_OK else "failed"
    report = StatusReport(f"kernel guard against {event.base_ref}", None, event.head_sha[:7],
                          ctx.run_url(), state=state, headline=result.headline,
                          details=result.details)
    return withheld(report) if event.from_fork else report


_GUARD_HEAD = "| kernel | defined at | changed files | result |\n|---|---|---|---|"


def _kernel_cells(item: ChangedKernel) -> str:
    k = item.kernel
    return f"| {k.name} | `{k.file}:{k.definition.line}` | {', '.join(item.files)} |"


def _lost(broken: Sequence[BrokenPairing], base: str) -> str:
    if not broken:
        return ""
    return "\n**Reference tests lost:**\n\n" + "".join(f"- {b.line(base)}\n" for b in broken)


def _not_guarded(changed: Sequence[ChangedKernel], lost: str, why: str,
                 notes: tuple[Annotation, ...]) -> Result:
    rows = "\n".join(f"{_kernel_cells(c)} not verified, not benchmarked |" for c in changed)
    details = (f"**The GPU step could not run** ({why}), so the changed kernels below were "
               f"**not verified against their reference nor benchmarked** against the base "
               f"branch: {GPU_HINT}.\n\n{_GUARD_HEAD}\n{rows}\n{lost}")
    note = Annotation("error", f"the GPU step could not run: {why}", title="kfbot guard")
    return Result(f"the GPU step could not run: {why}", details, EXIT_MISSING_TOOL,
                  annotations=(*notes, note))


@dataclass(frozen=True)
class Tolerance:
    """What slowdown the guard lets through (the Action's `slowdown-threshold` and
    `warn-only` inputs)."""

    threshold: float = 0.0  # an input is slower only beyond this (0.05: 5 %)
    warn_only: bool = False  # slower kernels are warnings; a rejected one still fails

    def beyond(self) -> str:
        return f" by more than {self.threshold:.0%}" if self.threshold else ""


def _guarded(changed: Sequence[ChangedKernel], comparisons: Sequence[Comparison], lost: str,
             notes: tuple[Annotation, ...], tolerance: Tolerance = Tolerance()) -> Result:
    rows, found, bad = [], list(notes), {"rejected": 0, "slower": 0}
    for item, comparison in zip(changed, comparisons, strict=True):
        verdict, note, why = _verdict(item, comparison, tolerance)
        rows.append(f"{_kernel_cells(item)} {verdict} |")
        found += [note] if note is not None else []
        if why is not None:
            bad[why] += 1
    plural = "s" if len(changed) != 1 else ""
    said = [f"{bad['rejected']} rejected"] if bad["rejected"] else []
    if bad["slower"]:
        said.append(f"{bad['slower']} slower than the base{tolerance.beyond()}"
                    + (" (warn-only)" if tolerance.warn_only else ""))
    headline = f"{len(changed)} changed kernel{plural}: " + (
        " and ".join(said) or f"verified, none slower than the base{tolerance.beyond()}")
    failed = bad["rejected"] or (bad["slower"] and not tolerance.warn_only)
    details = f"{_GUARD_HEAD}\n" + "\n".join(rows) + "\n" + lost
    return Result(headline, details, EXIT_FAILURE if failed else EXIT_OK,
                  annotations=tuple(found))


def _verdict(item: ChangedKernel, c: Comparison, tolerance: Tolerance
             ) -> tuple[str, Annotation | None, str | None]:
    """The table cell, the annotation on the kernel, and what is wrong with it, if
    anything ("rejected" or "slower")."""
    k = item.kernel
    where = (k.file, k.definition.line)
    if c.change is None:
        base = c.base.reason if c.base is not None else "no base version"
        return (f"not compared: the base version fails its reference ({base})",
                Annotation("warning", f"{k.name}: the base version fails its reference",
                           *where, "kfbot guard"), None)
    ev = c.change
    if not ev.ok:
        message = f"{k.name}: rejected at {ev.stage}: {ev.reason}"
        return (f"✗ rejected at {ev.stage}: {ev.reason}",
                Annotation("error", message, *where, "kfbot guard"), "rejected")
    slower = c.slower_beyond(tolerance.threshold)
    if slower:
        shapes = ", ".join(slower)
        level: Level = "warning" if tolerance.warn_only else "error"
        mark = "⚠" if tolerance.warn_only else "✗"
        beyond = tolerance.beyond()
        return (f"✓ correct; {mark} slower than the base{beyond} on {shapes}",
                Annotation(level, f"{k.name}: slower than the base{beyond} on {shapes}",
                           *where, "kfbot guard"), "slower")
    speed = f"; {ev.speedup:.2f}x vs the base ({ev.verdict})" if ev.speedup else ""
    return f"✓ correct{speed}", None, None
