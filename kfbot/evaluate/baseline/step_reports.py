"""Each baseline step's report, made from what that step produced (see `steps`).

The engine runs the steps; this module only judges their results: which step failed,
the evidence a person reads (the failing process's last lines), and the `kfbot.yaml`
snippet that would get past it. Nothing here runs anything.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import replace

from kfbot.evaluate.baseline.steps import (
    NO_REFERENCE,
    StepName,
    StepReport,
    build_snippet,
    inputs_snippet,
    reference_snippet,
    repository_build_snippet,
)
from kfbot.evaluate.build import BuildResult
from kfbot.evaluate.build.repository import OwnOriginal
from kfbot.evaluate.capture.collect import CaptureResult, ProcessRun
from kfbot.evaluate.evaluation import Evaluation
from kfbot.evaluate.sandbox.processes import last_lines
from kfbot.evaluate.task import KernelTask

# How a Python process says that an import failed, as pytest and the interpreter word it.
_IMPORT_FAILURE = re.compile(
    r"ImportError while importing|ModuleNotFoundError|ImportError:|ERROR collecting"
)
EVIDENCE_LINES = 15


def pair_step(task: KernelTask) -> StepReport:
    step = _pair_step(task)
    if not task.observed:
        return step
    checks = sum(": checks it:" in line for line in task.observed)
    seen = f"; observed on a GPU: {_count(len(task.observed), 'test')} launch it, " \
           f"{checks} of them check it (a mutant that writes nothing fails them)"
    return replace(step, summary=step.summary + seen,
                   evidence="\n".join(filter(None, (step.evidence, *task.observed))))


def _pair_step(task: KernelTask) -> StepReport:
    if task.test_targets or task.script_targets:
        return StepReport("pair", "ok", runs_summary(task.test_targets, task.script_targets))
    if task.declared_shapes or task.inputs_ref:
        return StepReport("pair", "ok", "no test or script reaches the op; the task "
                          "declares its inputs")
    return StepReport("pair", "failed",
                      "the scan found no test or script that calls the op "
                      f"{task.op.module}.{task.op.name} (see `kfbot scan --explain "
                      f"{task.kernel_name}`)",
                      suggestion=inputs_snippet(task.kernel_id, task.kernel_name))


def runs_summary(tests: Sequence[str], scripts: Sequence[str]) -> str:
    """"2 tests call the op: a.py::t1, a.py::t2"."""
    runs = [*tests, *scripts]
    counts = [_count(len(tests), "test"), _count(len(scripts), "script")]
    found = " and ".join(c for c in counts if not c.startswith("0 "))
    shown = ", ".join(runs[:4]) + (" ..." if len(runs) > 4 else "")
    verb = "calls" if len(runs) == 1 else "call"
    return f"{found} {verb} the op: {shown}"


def build_step(task: KernelTask, built: BuildResult, fallback: str = "") -> StepReport:
    """`fallback`: how the repository's own build made the original, when kfbot's could
    not (then the tests and the baseline use that build; candidates cannot be built)."""
    recipe = task.build
    where = f"{recipe.kind} {recipe.name} ({recipe.file}:{recipe.line})"
    snippet = build_snippet(task.kernel_id, task.kernel_name, recipe, task.editable_files)
    if built.ok:
        done = f"{built.compiled} compiled, {built.reused} from the cache"
        return StepReport("build", "ok", f"{where}: built ({done})")
    errors = [d for d in built.diagnostics if d.severity == "error"]
    first = errors[0].message if errors else f"stopped at the {built.stage} stage"
    evidence = "\n".join(_diagnostic_line(d.file, d.line, d.message) for d in errors[:8])
    if fallback:
        return StepReport("build", "warning",
                          f"{where}: kfbot's build failed at the {built.stage} stage "
                          f"({first}); {fallback}; candidates cannot be built until "
                          "kfbot's build works", evidence, snippet)
    return StepReport("build", "failed", f"{where}: the original does not build at the "
                      f"{built.stage} stage: {first}", evidence, snippet)


def own_build_step(task: KernelTask, own: OwnOriginal | None) -> StepReport:
    """The build step of a recipe the repository builds itself: the build, and the
    library that holds the kernel (by its name or its symbols)."""
    recipe = task.build
    where = f"the repository's own build ({recipe.file})"
    snippet = repository_build_snippet(task.kernel_id, task.kernel_name, recipe.file,
                                       _library_name(task, own))
    if own is None:
        return StepReport("build", "failed", f"{where}: kfbot cannot run it", "", snippet)
    if own.ok:
        cached = " (the build of this content, from the cache)" if own.build.cached else ""
        return StepReport("build", "ok", f"{own.why}{cached}")
    return StepReport("build", "failed", f"{where}: {own.why}", own.evidence(), snippet)


def _library_name(task: KernelTask, own: OwnOriginal | None) -> str:
    """The library that holds the kernel where one is known: the one found, the one
    declared, else the first the build made; "" when the build made none."""
    made = [own.build.module_name(lib) for lib in own.build.libraries] if own else []
    names = [own.module if own is not None else "", task.build.name, *made]
    return next((n for n in names if n), "")


def _diagnostic_line(file: str | None, line: int | None, message: str) -> str:
    where = f"{file}:{line}: " if file and line else (f"{file}: " if file else "")
    return f"{where}{message}"


def capture_steps(
    task: KernelTask, result: CaptureResult | None, cached: int | None, staged: Sequence[str]
) -> list[StepReport]:
    """The import and capture steps. `result` is None when nothing ran: `cached`
    signatures were read from an earlier run, or there was nothing to run."""
    if result is None:
        if cached:
            return [StepReport("import", "ok", "not run: the signatures are cached"),
                    StepReport("capture", "ok", f"{_count(cached, 'call signature')} "
                               "from an earlier run of the same tests")]
        return [StepReport("import", "skipped", "no test or script to run"),
                _no_signatures(task, "there is no test or script to run", "")]
    return [_import_step(task, result, staged), _capture_step(task, result)]


def _import_step(task: KernelTask, result: CaptureResult, staged: Sequence[str]) -> StepReport:
    failing = next((r for r in result.runs if _IMPORT_FAILURE.search(r.ran.tail)), None)
    kfbot_build = f" (kfbot's build of {', '.join(staged)})" if staged else ""
    if failing is not None and not result.signatures:
        return StepReport("import", "failed", f"{failing.line()}: an import failed"
                          f"{kfbot_build}: {_import_line(failing.ran.tail)}",
                          last_lines(failing.ran.tail, EVIDENCE_LINES),
                          _import_suggestion(task))
    unseen = [e for e in result.errors if "never found while the tests ran" in e]
    if unseen and not result.signatures:
        return StepReport("import", "failed", f"{unseen[0]}: the tests and scripts ran but "
                          f"never imported or loaded it{kfbot_build}",
                          _last_run_lines(result.runs), _import_suggestion(task))
    return StepReport("import", "ok", f"the op was found{kfbot_build}")


def _import_line(tail: str) -> str:
    # pytest marks the error lines of its reports with "E ".
    lines = [line.strip().removeprefix("E ").strip() for line in tail.splitlines()
             if _IMPORT_FAILURE.search(line)]
    errors = [line for line in lines if "Error:" in line]
    return (errors or lines or [""])[-1][:300]


def _import_suggestion(task: KernelTask) -> str:
    if task.build.kind == "setup_py":
        return build_snippet(task.kernel_id, task.kernel_name, task.build, task.editable_files)
    return inputs_snippet(task.kernel_id, task.kernel_name)


def _capture_step(task: KernelTask, result: CaptureResult) -> StepReport:
    runs = "; ".join(r.line() for r in result.runs)
    twins = "".join(f"; {s.line()}" for s in result.skipped)
    if not result.signatures:
        why = result.errors[0] if result.errors else "the op was never called"
        return _no_signatures(task, f"{why} ({runs}{twins})", _last_run_lines(result.runs))
    found = f"{_count(len(result.signatures), 'call signature')} from " \
            f"{_count(result.calls, 'call')} ({runs}{twins})"
    failing = [r for r in result.runs if not r.ok]
    if not failing:
        return StepReport("capture", "ok", found)
    stopped = ", ".join(f"{r.kind} {r.target}" for r in failing)
    evidence = "\n".join(f"{r.kind} {r.target}: {r.problem or r.ran.how()}\n"
                         f"{last_lines(r.ran.tail, EVIDENCE_LINES)}" for r in failing)
    return StepReport("capture", "warning", f"{found}; kept what was recorded before "
                      f"{stopped} stopped", evidence)


def _no_signatures(task: KernelTask, why: str, evidence: str) -> StepReport:
    if task.declared_shapes or task.inputs_ref:
        return StepReport("capture", "warning", f"no call signatures were captured ({why}); "
                          "the task's declared inputs are used", evidence)
    return StepReport("capture", "failed", f"no call signatures were captured and none are "
                      f"declared: {why}", evidence,
                      inputs_snippet(task.kernel_id, task.kernel_name))


def _last_run_lines(runs: Sequence[ProcessRun]) -> str:
    failing = next((r for r in runs if not r.ok), runs[-1] if runs else None)
    return last_lines(failing.ran.tail, EVIDENCE_LINES) if failing is not None else ""


def reference_step(task: KernelTask) -> StepReport:
    if task.references:
        shown = "; ".join(r.description for r in task.references[:3])
        return StepReport("reference", "ok", f"{_count(len(task.references), 'reference')}: "
                          f"{shown}")
    why = "; ".join(task.unusable_references) or "the tests name no reference computation"
    return StepReport("reference", "warning", f"no pure-PyTorch reference could be carried "
                      f"({why}): candidates are {NO_REFERENCE}",
                      "\n".join(task.unusable_references),
                      reference_snippet(task.kernel_id, task.kernel_name))


def comparison_step(result: Evaluation) -> StepReport:
    if result.ok:
        unreferenced = next((f for f in result.findings if f.check == "no-reference"), None)
        if unreferenced is not None:
            return StepReport("comparison", "warning", f"{result.reason}, against the original "
                              f"itself: {unreferenced.evidence}")
        return StepReport("comparison", "ok", result.reason)
    tail = next((dict(d.details).get("output_tail", "") for d in result.diagnostics
                 if d.stage == "runtime"), "")
    return StepReport("comparison", "failed", result.reason, last_lines(tail, EVIDENCE_LINES))


def amended(steps: tuple[StepReport, ...], note: StepReport) -> tuple[StepReport, ...]:
    """`steps` with `note` added to the step of its name: its summary appended, the
    worse of the two outcomes, its evidence and suggestion where it has them."""
    order = ("ok", "skipped", "warning", "failed")
    out = []
    for step in steps:
        if step.step == note.step:
            worse = max(step.outcome, note.outcome, key=order.index)
            step = replace(step, outcome=worse, summary=f"{step.summary}; {note.summary}",
                           evidence=note.evidence or step.evidence,
                           suggestion=note.suggestion or step.suggestion)
        out.append(step)
    return tuple(out)


def skipped(after: StepName, names: Sequence[StepName]) -> list[StepReport]:
    return [StepReport(name, "skipped", f"not run: the {after} step failed") for name in names]


def _count(n: int, one: str, many: str | None = None) -> str:
    return f"{n} {one if n == 1 else (many or one + 's')}"
