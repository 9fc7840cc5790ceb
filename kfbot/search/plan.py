"""What a run of `kfbot optimize` will do, before anything runs: its settings, the
tunables, rewrites and compiler settings it will search, and the time it keeps at the
end to reproduce its winner.

    plan = make_plan(task, settings, llm="on")   # no GPU needed
    print("\n".join(plan.lines()))
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from kfbot.evaluate.candidate import ORIGINAL
from kfbot.evaluate.scope import shared_names
from kfbot.evaluate.task import KernelTask
from kfbot.search.flags import flag_plan
from kfbot.search.mutators import Mutators
from kfbot.search.params import Knob, space_size
from kfbot.search.reach import Reach, reaching_knobs
from kfbot.search.rewrites import load_rewrites, propose_rewrites
from kfbot.search.rewrites.explain import explain as explain_rewrites
from kfbot.text import read_source

# Seconds of `--time` kept for writing the report, the patch and the branch.
FINISH_S = 10.0


@dataclass(frozen=True)
class OptimizeSettings:
    islands: int = 4
    seed: int = 0
    evaluations: int | None = 64
    seconds: float | None = None
    tokens: int | None = None
    usd: float | None = None
    batch: int = 2
    migrate_every: int = 3
    # Stop once a publishable candidate (or the original itself) runs at this % of the
    # speed of light or more: what is left to win is within the floor's own error.
    light_stop: float | None = 90.0
    started: float | None = None  # time.monotonic() when the run began: `seconds` from it
    reserve_s: float = 0.0  # of `seconds`, kept for what the command does after the search


@dataclass(frozen=True)
class Plan:
    kernel_id: str
    knobs: tuple[Knob, ...]
    rewrites: tuple[str, ...]  # ids of the rewrites that apply to the original
    llm: str  # "on" or why it is off
    settings: OptimizeSettings
    # Tunables the scan found that do not reach the kernel, or cannot be traced, and why.
    knob_notes: tuple[str, ...] = ()
    # One line per rewrite: applies (through helpers or not), or why it does not.
    rule_notes: tuple[str, ...] = ()
    flag_lines: tuple[str, ...] = ()  # the compiler settings searched, or why none

    def lines(self) -> list[str]:
        s = self.settings
        budget = ", ".join(part for part in (
            f"{s.evaluations} evaluations" if s.evaluations else "",
            f"{s.seconds:.0f} s" if s.seconds else "",
            f"{s.tokens} LLM tokens" if s.tokens else "",
            f"${s.usd:.2f}" if s.usd else "") if part) or "unlimited"
        out = [f"kernel {self.kernel_id}: {s.islands} islands, seed {s.seed}, budget {budget}"]
        if self.knobs:
            out.append(f"params: {len(self.knobs)} tunables, {space_size(self.knobs)} points")
            out += [f"  {k.name} ({k.kind}, {k.file}:{k.line}) = {k.current}, tries "
                    f"{', '.join(k.choices)}" for k in self.knobs]
        else:
            out.append("params: no numeric tunables found that reach the kernel")
        out += [f"  {note}" for note in self.knob_notes]
        out.append(f"rules: {', '.join(self.rewrites) or 'no rewrite applies to the original'}")
        out += [f"  {note}" for note in self.rule_notes]
        out += self.flag_lines
        out.append(f"llm: {self.llm}")
        return out


def make_plan(task: KernelTask, settings: OptimizeSettings, llm: str) -> Plan:
    found = task_knobs(task)
    mut = Mutators(task, found.knobs, load_rewrites())
    applying = propose_rewrites(mut.base_files(), task.editable_files, ORIGINAL,
                                task.kernel_name, mut.rewrites)
    ids = tuple(sorted({c.rationale.split(":", 1)[0] for c in applying}))
    why = explain_rewrites(mut.base_files(), task.editable_files, task.kernel_name,
                           mut.rewrites)
    return Plan(task.kernel_id, tuple(mut.knobs), ids, llm, settings, found.notes,
                tuple(why), flag_plan(task))


def task_knobs(task: KernelTask) -> Reach:
    """The tunables that reach the task's kernel, as knobs, and why others do not."""
    files = {rel: read_source(task.root / rel, rel) for rel in task.editable_files
             if (task.root / rel).is_file()}
    return reaching_knobs(files, task.editable_files, task.kernel_name, task.tunables,
                          shared_names(task))


def reproduction_s(slowest_compile_s: float) -> float:
    """About how long a reproduction takes: the repository's own build (its slowest
    unit, as kfbot's build of the original took) and the timing."""
    return 1.5 * slowest_compile_s + 60.0


def too_late(settings: OptimizeSettings) -> str:
    """Why there is no time left to reproduce before `--time` ends, or ""."""
    if settings.seconds is None or settings.started is None:
        return ""
    left = settings.seconds - (time.monotonic() - settings.started)
    need = settings.reserve_s - FINISH_S
    if left >= need:
        return ""
    return (f"{left:.0f} s of the time limit are left and a reproduction takes about "
            f"{need:.0f} s")
