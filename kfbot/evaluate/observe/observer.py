"""Observed pairing: run the repository's tests on the GPU and see what they launch.

    observed = observe(root, report, Builder(cache / "build"), ObserveSettings())
    kfbot.scan.observed.save(root, observed)

1. Build every extension the scan found, under the names the repository uses, and
   stage the builds for its tests (`build.repository`); one that does not build is
   said, and the tests that import it run without it. A repository that builds itself
   (a build of kind `repository`) is built its own way, and its tests run in that tree.
2. Run every test file and the scripts that reach an extension, each file in its own
   sandboxed process with its own time limit (`capture.collect`), under the recorder: per
   test, the kernels it launched (torch's profiler), the ops they came through, its
   outcome.
3. Match the launched names to the scanned definitions (`names`): by name, namespace,
   template arguments and parameters, and the library the test had loaded.
4. For each kernel a passing test launched, build the mutant whose kernel writes
   nothing (`mutants`), run those tests again against it with NaN in the allocator,
   and judge: the test fails, it checks the kernel; it passes, it only launches it.

What the tests do is data: a test that fails, hangs or crashes is an outcome in the
observations. Nothing here imports torch; the recorder does, in the test processes.
"""

from __future__ import annotations

import hashlib
import re
import sys
import tempfile
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Literal

from kfbot.errors import KfbotError
from kfbot.evaluate.build import Builder, BuildRequest
from kfbot.evaluate.build.layouts.load_inline import inline_sources
from kfbot.evaluate.build.repository import staged_modules
from kfbot.evaluate.capture.collect import CaptureResult, capture_signatures
from kfbot.evaluate.capture.imports import StagedModule
from kfbot.evaluate.capture.launches import ObserveRequest, RunRecord
from kfbot.evaluate.capture.signature import OpRef
from kfbot.evaluate.capture.suite import expand
from kfbot.evaluate.observe import names
from kfbot.evaluate.observe.mutants import NoMutant, silent
from kfbot.evaluate.observe.own_tree import own_mutant_tree, own_tree
from kfbot.paths import default_skip, inside
from kfbot.scan.model import BuildRecipe, Kernel, Observations, ObservedTest, ScanReport, Verdict
from kfbot.scan.observed import state_key

DEFAULT_FILE_TIMEOUT_S = 300.0
FOREIGN_SHOWN = 12
_SCRIPT_NAME = re.compile(r"^(main|test|bench\w*|benchmark\w*|example\w*|demo\w*|run\w*|"
                          r"check\w*|verify\w*)\.py$")
_MAX_CALLS = 50  # recorded signatures per op: observing needs the ops, not every call


@dataclass(frozen=True)
class ObserveSettings:
    file_timeout_s: float = DEFAULT_FILE_TIMEOUT_S
    timeout_s: float = 3600.0  # all test files together, and again for each mutant
    jobs: int = 4  # test files run at once
    python: str = sys.executable
    # Kernels to confirm with a mutant (ids); None: every kernel a test launched.
    confirm: tuple[str, ...] | None = None
    extra_env: Mapping[str, str] = field(default_factory=dict)


@dataclass
class _Seen:
    """One test seen launching one kernel, gathered from the profile records."""

    kind: str
    ops: dict[str, None] = field(default_factory=dict)
    outcome: str = "passed"


def observe(root: Path, report: ScanReport, builder: Builder,
            settings: ObserveSettings) -> Observations:
    """Run the tests, watch, and judge each kernel's tests with its mutant."""
    root = root.resolve()
    key = state_key(root) or ""
    built, notes = _build_originals(root, report, builder)
    staged = tuple(m for modules in built.values() for m in modules)
    ops = op_refs(report.kernels)
    tests = ["."] if _has_tests(root) else []
    scripts = script_targets(root, report)
    if not tests and not scripts:
        return Observations(key, note="no test file or script to run")
    tree, settings, said = _own_tree(root, report, builder, settings)
    notes += said
    first = _run(tree, tests, scripts, ops, staged, settings, ObserveRequest("", profile=True))
    seen, foreign = _gather(first.observed, report.kernels, _called(first))
    kernels = []
    for kernel in report.kernels:
        if kernel.id not in seen:
            continue
        wanted = settings.confirm is None or kernel.id in settings.confirm
        judged = _judge(root, kernel, seen[kernel.id], built, builder, ops, settings) \
            if wanted else _unjudged(seen[kernel.id], "not asked to confirm this kernel")
        kernels.append((kernel.id, judged))
    return Observations(key, tuple(kernels), (*notes, *_file_lines(first)),
                        tuple(sorted(foreign))[:FOREIGN_SHOWN], _note(first.observed),
                        len({r.test for r in first.observed if r.outcome != "crashed"}))


def op_refs(kernels: Iterable[Kernel]) -> list[OpRef]:
    """Every op the scan found bound to a kernel, as the recorder names it."""
    found: dict[str, OpRef] = {}
    for kernel in kernels:
        for binding in kernel.bindings:
            texts = [f"torch.ops.{binding.module}.{binding.name}"] \
                if binding.kind != "pybind11" else \
                [f"{b.name}.{binding.name}" for b in kernel.builds]
            for text in texts:
                try:
                    found.setdefault(text, OpRef.parse(text))
                except KfbotError:
                    continue  # a namespace named by a macro: its launches stay unattributed
    return list(found.values())


def _has_tests(root: Path) -> bool:
    return bool(expand(root, ["."]))


def script_targets(root: Path, report: ScanReport) -> list[str]:
    """Scripts to run: those the scan found comparing an op, and entry points named as
    scripts usually are (`main.py`, `bench_*.py`) that reach an extension."""
    found = {r.file for k in report.kernels for r in k.references if r.kind == "script"}
    builds = {b.name.rsplit(".", 1)[-1] for k in report.kernels for b in k.builds}
    for path in _python_files(root):
        rel = path.relative_to(root).as_posix()
        if rel in found or not _SCRIPT_NAME.match(path.name):
            continue
        text = path.read_text(errors="replace")
        if "torch" in text and ("cpp_extension" in text or any(
                re.search(rf"\b{re.escape(b)}\b", text) for b in builds)):
            found.add(rel)
    return sorted(found)


def _python_files(root: Path) -> list[Path]:
    out = []
    for path in sorted(root.rglob("*.py")):
        rel = path.relative_to(root).parts
        if any(default_skip(p) or p.startswith(".") for p in rel[:-1]):
            continue
        if path.name != "setup.py" and inside(root, path):
            out.append(path)
    return out


def _build_originals(root: Path, report: ScanReport, builder: Builder
                     ) -> tuple[dict[tuple[str, str], tuple[StagedModule, ...]], list[str]]:
    """Every extension built under its real names, staged, by recipe; and what failed."""
    built: dict[tuple[str, str], tuple[StagedModule, ...]] = {}
    notes = []
    for recipe in _recipes(report.kernels):
        if recipe.kind == "repository":
            continue  # the repository builds it: the tests run in that build's tree
        result = builder.build(BuildRequest(recipe, root, tag="repo", real_names=True,
                                            inline_sources=inline_sources(root, recipe, {})))
        if not result.ok:
            first = next((d.message for d in result.diagnostics if d.severity == "error"),
                         f"stopped at the {result.stage} stage")
            notes.append(f"build {recipe.kind} {recipe.name} ({recipe.file}:{recipe.line}) "
                         f"failed: {first}; its tests ran without kfbot's build")
            continue
        built[_recipe_key(recipe)] = staged_modules(root, recipe, result)
    return built, notes


def _own_tree(root: Path, report: ScanReport, builder: Builder, settings: ObserveSettings
              ) -> tuple[Path, ObserveSettings, list[str]]:
    """Where the tests run: in the tree of the repository's own build where it builds
    itself (`own_tree`), else in the repository."""
    own = [r for r in _recipes(report.kernels) if r.kind == "repository"]
    if not own:
        return root, settings, []
    made = own_tree(root, own[0], _own_cache(builder), settings.extra_env)
    if isinstance(made, str):
        return root, settings, [f"{made}; its tests ran without it"]
    return made[0], replace(settings, extra_env=made[1]), []


def _own_cache(builder: Builder) -> Path:
    return builder.cache_dir.parent / "own"


def _recipes(kernels: Iterable[Kernel]) -> list[BuildRecipe]:
    found: dict[tuple[str, str], BuildRecipe] = {}
    for kernel in kernels:
        if kernel.builds:
            found.setdefault(_recipe_key(_recipe(kernel)), _recipe(kernel))
    return list(found.values())


def _recipe(kernel: Kernel) -> BuildRecipe:
    declared = [b for b in kernel.builds if b.origin == "declared"]
    return (declared or list(kernel.builds))[0]


def _recipe_key(recipe: BuildRecipe) -> tuple[str, str]:
    return recipe.name, f"{recipe.file}:{recipe.line}"


def _run(root: Path, tests: Sequence[str], scripts: Sequence[str], ops: Sequence[OpRef],
         staged: Sequence[StagedModule], settings: ObserveSettings,
         request: ObserveRequest) -> CaptureResult:
    with tempfile.TemporaryDirectory(prefix="kfbot-observe-") as out:
        return capture_signatures(
            root, tests, ops, timeout_s=settings.timeout_s, python=settings.python,
            extra_env=settings.extra_env, max_calls=_MAX_CALLS, scripts=scripts,
            staged=staged, file_timeout_s=settings.file_timeout_s, jobs=settings.jobs,
            observe=ObserveRequest(out, request.profile, request.poison))


def _called(run: CaptureResult) -> dict[str, list[str]]:
    """The recorded ops each test called, from the call signatures it made."""
    called: dict[str, list[str]] = defaultdict(list)
    for sig in run.signatures:
        for test in sig.tests:
            if sig.op not in called[test]:
                called[test].append(sig.op)
    return called


def _gather(records: Sequence[RunRecord], kernels: Sequence[Kernel],
            called: Mapping[str, Sequence[str]]
            ) -> tuple[dict[str, dict[str, _Seen]], set[str]]:
    """Per kernel id, the tests that launched it, with the ops the launches came
    through (where the profile does not say, the ops the test called); and the
    launched names no scanned kernel matches."""
    seen: dict[str, dict[str, _Seen]] = defaultdict(dict)
    foreign: set[str] = set()
    for record in records:
        libraries = [x for pair in record.libraries for x in pair]
        for launch in record.launches:
            found = names.match(launch.name, kernels, libraries)
            if not found.kernels:
                foreign.add(names.parse(launch.name).qualified)
            for kernel in found.kernels:
                entry = seen[kernel.id].setdefault(
                    record.test, _Seen("pytest" if "::" in record.test else "script"))
                for op in [launch.op] if launch.op is not None else called.get(record.test, []):
                    entry.ops[op] = None
                entry.outcome = record.outcome
    return seen, foreign


def _judge(root: Path, kernel: Kernel, tests: Mapping[str, _Seen],
           built: Mapping[tuple[str, str], tuple[StagedModule, ...]], builder: Builder,
           ops: Sequence[OpRef], settings: ObserveSettings) -> tuple[ObservedTest, ...]:
    """Each test's verdict: its outcome on the mutant of `kernel` that writes nothing."""
    passing = [t for t, s in tests.items() if s.outcome == "passed"]
    if not passing:
        return _unjudged(tests, "")
    where = root
    staged: tuple[StagedModule, ...] = ()
    if kernel.builds and _recipe(kernel).kind == "repository":
        tree = own_mutant_tree(root, kernel, _recipe(kernel), _own_cache(builder),
                               settings.extra_env)
        if isinstance(tree, NoMutant):
            return _unjudged(tests, tree.reason)
        where, settings = tree[0], replace(settings, extra_env=tree[1])
    else:
        made = _mutant_staged(root, kernel, built, builder)
        if isinstance(made, NoMutant):
            return _unjudged(tests, made.reason)
        staged = made
    nodes = [t for t in passing if "::" in t]
    scripts = [t for t in passing if "::" not in t]
    rerun = _run(where, nodes, scripts, ops, staged, settings,
                 ObserveRequest("", profile=False, poison=True))
    outcomes = _outcomes(rerun)
    out = []
    for test, s in tests.items():
        if s.outcome != "passed":
            out.append(_observed(test, s, "fails-on-original", f"it {s.outcome} on the original"))
            continue
        after = outcomes.get(test, "not run")
        verdict: Verdict = "launches-only" if after == "passed" else \
            "checks" if after in ("failed", "error", "crashed") else "unconfirmed"
        out.append(_observed(test, s, verdict, f"on the mutant it {after}"))
    return tuple(out)


def _mutant_staged(root: Path, kernel: Kernel,
                   built: Mapping[tuple[str, str], tuple[StagedModule, ...]],
                   builder: Builder) -> tuple[StagedModule, ...] | NoMutant:
    """Every extension as staged for the tests, the kernel's own rebuilt with the
    kernel silent."""
    if not kernel.builds:
        return NoMutant(kernel.id, "the scan found no build of it to make the mutant with")
    mutant = silent(root, kernel)
    if isinstance(mutant, NoMutant):
        return mutant
    recipe = _recipe(kernel)
    files = dict(mutant.files)
    tag = "m" + hashlib.sha256(repr(sorted(files.items())).encode()).hexdigest()[:8]
    result = builder.build(BuildRequest(recipe, root, files=files, tag=tag, real_names=True,
                                        inline_sources=inline_sources(root, recipe, files)))
    if not result.ok:
        first = next((d.message for d in result.diagnostics if d.severity == "error"),
                     f"stopped at the {result.stage} stage")
        return NoMutant(kernel.id, f"the mutant did not build: {first}")
    others = [m for k, modules in built.items() if k != _recipe_key(recipe) for m in modules]
    return (*others, *staged_modules(root, recipe, result))


def _outcomes(run: CaptureResult) -> dict[str, str]:
    """Each test's outcome on the mutant. Where a process died, the first of its tests
    that left no record is the one it died in ("crashed"); the tests after it did not
    run and have no outcome."""
    said: dict[str, str] = {r.test: r.outcome for r in run.observed}
    for record in run.observed:
        if record.outcome != "crashed":
            continue
        unfinished = [t for t in record.test.split() if "::" in t and t not in said]
        if unfinished:
            said[unfinished[0]] = "crashed"
    return said


def _observed(test: str, seen: _Seen, verdict: Verdict, why: str) -> ObservedTest:
    kind: Literal["pytest", "script"] = "script" if seen.kind == "script" else "pytest"
    return ObservedTest(test, kind, tuple(seen.ops), verdict, why)


def _unjudged(tests: Mapping[str, _Seen], why: str) -> tuple[ObservedTest, ...]:
    return tuple(
        _observed(t, s, "fails-on-original", f"it {s.outcome} on the original")
        if s.outcome != "passed" else _observed(t, s, "unconfirmed", why)
        for t, s in tests.items())


def _file_lines(run: CaptureResult) -> list[str]:
    lines = [f"{r.kind} {r.target}: {r.problem or r.ran.how()}" for r in run.runs if not r.ok]
    return lines + [s.line() for s in run.skipped]


def _note(records: Sequence[RunRecord]) -> str:
    if records and not any(r.profiled for r in records):
        notes = sorted({r.note for r in records if r.note})
        return "no test was profiled" + (f" ({notes[0]})" if notes else "")
    return ""
