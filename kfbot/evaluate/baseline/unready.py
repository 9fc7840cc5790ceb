"""The baseline's steps for a kernel kfbot cannot make a task of.

When the scan found no build that compiles a kernel, or no binding that reaches it,
nothing can be built or run; the answer is still the baseline's six steps, the first
failure with what the scan read as its evidence, and the `kfbot.yaml` that gets past
it, written with the repository's own names (the build's name from the nearest recipe
the scan read, the sources from the kernel's files and the binding that reaches it).
"""

from __future__ import annotations

import posixpath
from collections.abc import Sequence

from kfbot.evaluate.baseline.step_reports import runs_summary
from kfbot.evaluate.baseline.steps import StepName, StepReport, build_snippet
from kfbot.evaluate.task import TaskError
from kfbot.scan.model import BuildRecipe, Kernel, ScanReport

_LATER: tuple[StepName, ...] = ("import", "capture", "reference", "comparison")
# What the scan says about a build it could read only in part.
_BUILD_NOTES = ("is not a static path", "is not a static string", "matches no file",
                "not static")


def unready_steps(kernel: Kernel, report: ScanReport, error: TaskError) -> tuple[StepReport, ...]:
    """pair, build, import, capture, reference, comparison: the first failure with its
    evidence and snippet, the steps that could not run after it."""
    pair = _pair(kernel, report)
    build = _build(kernel, report) if error.step == "build" or not kernel.builds \
        else StepReport("build", "skipped", f"not run: the pair step failed (the build: "
                        f"{_recipe_line(kernel.builds[0])})")
    after: StepName = "pair" if pair.failed else "build"
    rest = [StepReport(name, "skipped", f"not run: the {after} step failed")
            for name in _LATER]
    return (pair, build, *rest)


def _pair(kernel: Kernel, report: ScanReport) -> StepReport:
    bound = [b for b in kernel.bindings if b.cpp_function is not None]
    if not bound:
        launchers = sorted({s.host_function for s in kernel.launch_sites if s.host_function})
        evidence = [f"{s.file}:{s.line}: launched in {s.host_function or 'file scope'}"
                    for s in kernel.launch_sites[:6]]
        evidence += _problems(report, kernel.editable_files)
        shown = ", ".join(launchers) or "no host function"
        return StepReport("pair", "failed", f"no Python binding reaches the kernel: it is "
                          f"launched from {shown}, which no pybind11 m.def or torch "
                          "library op calls, directly or through other functions (see "
                          f"`kfbot scan --explain {kernel.name}`)", "\n".join(evidence))
    found = [r for r in kernel.references if r.origin == "discovered"]
    tests = [f"{r.file}::{r.test.split('.')[0]}" for r in found if r.kind == "pytest"]
    scripts = [r.file for r in found if r.kind == "script"]
    if tests or scripts:
        return StepReport("pair", "ok", runs_summary(list(dict.fromkeys(tests)),
                                                     list(dict.fromkeys(scripts))))
    op = f"{bound[0].module}.{bound[0].name}"
    return StepReport("pair", "failed", f"the scan found no test or script that calls the op "
                      f"{op} (see `kfbot scan --explain {kernel.name}`)")


def _build(kernel: Kernel, report: ScanReport) -> StepReport:
    nearest = _nearest(kernel.file, report.builds)
    evidence = [f"the kernel: {kernel.file}:{kernel.definition.line}"]
    evidence += [f"bound by {b.file}:{b.line} ({b.kind} {b.module}.{b.name})"
                 for b in kernel.bindings[:3]]
    evidence += [f"a build the scan read: {_recipe_line(b)}; its sources do not include "
                 f"{kernel.file}" for b in nearest[:3]]
    python = sorted({b.file for b in report.builds})
    evidence += [p for p in _problems(report, python)
                 if any(note in p for note in _BUILD_NOTES)][:8]
    where = posixpath.dirname(kernel.file) or "the repository's root"
    summary = (f"kfbot cannot tell how this kernel is built: no setup.py, pyproject.toml, "
               f"load() or load_inline() the scan could read compiles {kernel.file}, and no "
               f"setup.py or pyproject.toml is in {where} or a folder above it")
    return StepReport("build", "failed", summary, "\n".join(evidence),
                      build_snippet(kernel.id, kernel.name, _recipe(kernel, nearest)))


def _recipe(kernel: Kernel, nearest: Sequence[BuildRecipe]) -> BuildRecipe:
    """The recipe to declare: the nearest build's kind and name, this kernel's files."""
    like = nearest[0] if nearest else None
    kind = like.kind if like is not None and like.kind in ("load", "setup_py") else "load"
    name = like.name if like is not None and like.name.isidentifier() else _module(kernel)
    files = [*(b.file for b in kernel.bindings), kernel.file,
             *(s.file for s in kernel.launch_sites)]
    sources = sorted(dict.fromkeys(f for f in files if not f.endswith((".h", ".cuh", ".hpp"))),
                     key=lambda f: (f.endswith(".cu"), f))
    flags = like.extra_cuda_cflags if like is not None else ()
    return BuildRecipe(kind=kind, name=name, file=kernel.file, line=kernel.definition.line,
                       sources=tuple(sources), extra_cuda_cflags=flags)


def _module(kernel: Kernel) -> str:
    """A name the repository gives the extension: the module its tests import the op
    from, its binding's module unless that is a macro the build would define, else the
    kernel file's own name."""
    for ref in kernel.references:
        hint = ref.module_hint or ""
        if hint.isidentifier() and not hint.isupper():
            return hint
    for binding in kernel.bindings:
        if binding.module.isidentifier() and not binding.module.isupper():
            return binding.module
    return posixpath.splitext(posixpath.basename(kernel.file))[0]


def _nearest(file: str, builds: Sequence[BuildRecipe]) -> list[BuildRecipe]:
    """The builds read nearest to `file`: the longest common folder first."""
    folder = posixpath.dirname(file).split("/")

    def shared(build: BuildRecipe) -> int:
        other = posixpath.dirname(build.file).split("/")
        return next((i for i, (a, b) in enumerate(zip(folder, other, strict=False))
                     if a != b), min(len(folder), len(other)))

    useful = [b for b in builds if b.kind in ("load", "setup_py", "load_inline")]
    return sorted(useful, key=lambda b: (-shared(b), b.file, b.line))


def _recipe_line(build: BuildRecipe) -> str:
    return f"{build.kind} {build.name or build.file} ({build.file}:{build.line})"


def _problems(report: ScanReport, files: Sequence[str]) -> list[str]:
    """What the scan said about `files`, one line each."""
    wanted = set(files)
    return [f"{p.file}:{p.line}: {p.message}" if p.line else f"{p.file}: {p.message}"
            for p in report.problems if p.file in wanted]
