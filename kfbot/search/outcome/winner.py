"""Which candidate a run commits, and what a faster one that needs build parameters would
take to carry into the repository.

A candidate may also set build parameters (extra nvcc flags such as `--use_fast_math`,
or `-D` values) that live in kfbot's build, not in the repository's files; committing
only its files would publish a different kernel than the one measured. So the candidate
committed is the fastest publishable one that changes files only, and every number a
run reports is that candidate's. A faster candidate with parameters is shown apart,
with its own numbers and the edit of the repository's build (the line of `setup.py`,
the `load()` call or the declared build, and the flag) that would carry them: a
suggestion for a person, never the headline.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass

from kfbot.evaluate.candidate import NVCC_FLAGS_PARAM, Candidate, nvcc_flags
from kfbot.evaluate.evaluation import Evaluation
from kfbot.evaluate.task import KernelTask
from kfbot.scan.model import BuildRecipe
from kfbot.text import read_source

# Where each kind of build takes nvcc flags and defines.
_NVCC_FLAGS_AT = {
    "setup_py": "`extra_compile_args[\"nvcc\"]`",
    "load": "`extra_cuda_cflags`",
    "load_inline": "`extra_cuda_cflags`",
    "kernel_builder": "`cuda-flags` of the [kernel] section",
    "repository": "the nvcc flags of the repository's own build (its setup.py or CMake)",
}
_DEFINES_AT = {
    "setup_py": "`define_macros` (or `-D` in `extra_compile_args[\"nvcc\"]`)",
    "load": "`extra_cuda_cflags` as `-D`",
    "load_inline": "`extra_cuda_cflags` as `-D`",
    "kernel_builder": "`cuda-flags` of the [kernel] section as `-D`",
    "repository": "the defines of the repository's own build (its setup.py or CMake)",
}


@dataclass(frozen=True)
class NeedsParameters:
    """A candidate faster than the committed one whose speed needs build parameters."""

    evaluation: Evaluation
    candidate: Candidate
    edits: tuple[str, ...]  # one line per parameter: where and what to change


def _fastest(evaluations: Mapping[str, Evaluation], candidates: Mapping[str, Candidate],
             keep: Callable[[Evaluation, Candidate], bool]) -> tuple[Evaluation, Candidate] | None:
    """The fastest kept (evaluation, candidate); ties go to the first hash, so a run
    chooses the same way every time."""
    kept = [(ev, candidates[d]) for d, ev in sorted(evaluations.items())
            if d in candidates and keep(ev, candidates[d])]
    return max(kept, key=lambda pair: pair[0].speedup or 0.0, default=None)


def _files_only(cand: Candidate) -> bool:
    """What a branch can hold: changed files, no build parameters."""
    return bool(cand.files) and not cand.params


def committable(evaluations: Mapping[str, Evaluation], candidates: Mapping[str, Candidate]
                ) -> tuple[Evaluation, Candidate] | None:
    """The fastest publishable candidate without build parameters, or None."""
    return _fastest(evaluations, candidates,
                    lambda ev, cand: _files_only(cand) and ev.publishable)


def near_miss(evaluations: Mapping[str, Evaluation], candidates: Mapping[str, Candidate]
              ) -> str | None:
    """Why the fastest correct file-only candidate that is not committable was not: the
    shapes it made significantly slower, with their times (or None when there is none)."""
    missed = _fastest(evaluations, candidates, lambda ev, cand: (
        _files_only(cand) and ev.ok and not ev.publishable and (ev.speedup or 0.0) > 1.0))
    if missed is None:
        return None
    ev, cand = missed
    slower = [f"{t.input}: {t.speedup.baseline.median:.2f} µs -> "
              f"{t.speedup.candidate.median:.2f} µs ({t.speedup.ratio:.2f}x)"
              for t in ev.timings if t.speedup.verdict == "slower"]
    why = ("significantly slower on " + "; ".join(slower)) if slower else \
        "no shape significantly faster"
    return (f"the fastest correct candidate, `{cand.short}` ({cand.origin}: "
            f"{cand.rationale or 'no rationale'}), is {ev.speedup or 0.0:.2f}x overall but {why}")


# How many candidates, fastest first, may be timed again before a run commits nothing.
CONFIRMATIONS = 3


@dataclass(frozen=True)
class Confirmed:
    """The committed candidate with its second evaluation, and what the search said."""

    committed: tuple[Evaluation, Candidate] | None
    search_speedup: float | None  # the committed candidate's figure in the search
    dropped: tuple[str, ...]  # faster candidates that failed their second evaluation


def confirm(evaluations: Mapping[str, Evaluation], candidates: Mapping[str, Candidate],
            evaluate: Callable[[Candidate], Evaluation],
            earlier: Mapping[str, float] | None = None,
            time_for_one: Callable[[], bool] = lambda: True) -> Confirmed:
    """The committable candidate, evaluated again; that second evaluation is its numbers.

    The search keeps the fastest of many noisy measurements, so the winner's own figure
    leans high (on an H200: 16.2x in the search, 15.4x reproduced). A fresh evaluation
    of the chosen code, which took no part in choosing it, does not. A candidate whose
    second evaluation is not correct and significantly faster is not committed; the
    next fastest is tried, CONFIRMATIONS at most.

    `earlier`: speedups a resumed run's log recorded for candidates it did not evaluate
    again; such a candidate competes on that figure, and its fresh evaluation here is
    its second one. `time_for_one` says whether the run's time allows one more.
    """
    left = dict(evaluations)
    logged = {h: s for h, s in (earlier or {}).items()
              if h not in evaluations and h in candidates and _files_only(candidates[h])}
    dropped: list[str] = []
    for _ in range(CONFIRMATIONS):
        choice = _next_choice(left, logged, candidates)
        if choice is None:
            break
        if not time_for_one():
            dropped.append(f"`{choice[1].short}` ({choice[0]:.2f}x in the search) was not "
                           "timed again: the time limit leaves no room for it")
            break
        figure, cand = choice
        again = evaluate(cand)
        if again.publishable:
            return Confirmed((again, cand), figure, tuple(dropped))
        dropped.append(f"`{cand.short}` ({figure:.2f}x in the search) was "
                       f"{again.verdict or again.stage} when timed again: {again.reason}")
        left.pop(cand.hash, None)
        logged.pop(cand.hash, None)
    return Confirmed(None, None, tuple(dropped))


def _next_choice(left: Mapping[str, Evaluation], logged: Mapping[str, float],
                 candidates: Mapping[str, Candidate]) -> tuple[float, Candidate] | None:
    """The fastest in the search of the committable evaluated ones and the logged ones."""
    fresh = committable(left, candidates)
    found = [(fresh[0].speedup or 0.0, fresh[1])] if fresh else []
    found += [(figure, candidates[h]) for h, figure in sorted(logged.items())]
    return max(found, key=lambda pair: pair[0], default=None)


def needs_parameters(task: KernelTask, evaluations: Mapping[str, Evaluation],
                     candidates: Mapping[str, Candidate],
                     committed: tuple[Evaluation, Candidate] | None) -> NeedsParameters | None:
    """The fastest publishable candidate with build parameters, when it beats the
    committed one (or nothing was committed)."""
    floor = (committed[0].speedup or 0.0) if committed else 0.0
    best = _fastest(evaluations, candidates, lambda ev, cand: (
        bool(cand.params) and ev.publishable and (ev.speedup or 0.0) > floor))
    if best is None:
        return None
    return NeedsParameters(best[0], best[1], tuple(build_edits(task, best[1].params)))


def build_edits(task: KernelTask, params: Mapping[str, str]) -> list[str]:
    """For each parameter, the line of the repository's build to change and how."""
    recipe = task.build
    where = _build_line(task, recipe)
    out = []
    flags = nvcc_flags(params)
    if flags:
        quoted = ", ".join(f'"{f}"' for f in flags)
        out.append(f"add {quoted} to {_NVCC_FLAGS_AT[recipe.kind]} of {where}")
    for name, value in sorted(params.items()):
        if name != NVCC_FLAGS_PARAM:
            out.append(_define_edit(task, name, value, where))
    return out


def _define_edit(task: KernelTask, name: str, value: str, where: str) -> str:
    kinds = {t.kind: t for t in task.tunables if t.name == name}
    flag = kinds.get("build_flag")
    if flag is not None:  # the build sets it already: that value is what to change
        return f"change `-D{name}={flag.value}` to `-D{name}={value}` in {where}"
    line = f"set `-D{name}={value}` in {_DEFINES_AT[task.build.kind]} of {where}"
    default = kinds.get("ifndef_default")
    if default is not None:
        line += (f", or make the default at `{default.file}:{default.line}` {value} "
                 f"(now {default.value})")
    return line


def _build_line(task: KernelTask, recipe: BuildRecipe) -> str:
    """`setup.py:12` with the line's text, or the declared build in the config."""
    call = {"setup_py": "the CUDAExtension", "load": "the load() call",
            "load_inline": "the load_inline() call", "kernel_builder": "build.toml",
            "repository": "the repository's own build"}[recipe.kind]
    if recipe.origin == "declared":
        return (f"the build declared at `{recipe.file}:{recipe.line}` (and wherever the "
                "repository's own build passes nvcc flags)")
    text = _line_text(task, recipe.file, recipe.line)
    shown = f": `{text}`" if text else ""
    return f"{call} at `{recipe.file}:{recipe.line}`{shown}"


def _line_text(task: KernelTask, rel: str, line: int) -> str:
    path = task.root / rel
    if not path.is_file():
        return ""
    lines = read_source(path, rel).splitlines()
    text = lines[line - 1].strip() if 0 < line <= len(lines) else ""
    return text.replace("`", "'")[:120]
