"""The finalist check: the repository's own build and its own reference tests, run
against a copy of the repository with the candidate applied.

kfbot's fast builds and its own checks decide the search; before a winner is
published it must also pass what the repository's authors wrote, built the way they
build it: `setup.py build_ext --inplace` (a `pyproject.toml` installed into a folder of
the copy's), or the `load()` calls its tests make. A
kernel-builder repository is built by a tool kfbot does not run; there the tests get
kfbot's build of the candidate, staged as the builder would lay it out (`capture.imports`).

The tests run as pytest runs them, and each script as a script, from its own folder
(`kfbot.evaluate.capture.harness`). Everything happens in a copy of the repository that holds
no link leading out of it; the user's working tree is never written, and whatever a
step leaves running is killed with it.
"""

from __future__ import annotations

import os
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from kfbot.evaluate.build.layouts.own import OwnRecipe, own_recipe
from kfbot.evaluate.candidate import Candidate
from kfbot.evaluate.capture import harness
from kfbot.evaluate.capture.collect import kfbot_import_dir
from kfbot.evaluate.capture.imports import STAGED_ENV, StagedModule, encode
from kfbot.evaluate.sandbox import untrusted_env
from kfbot.evaluate.sandbox.processes import Ran, run_process
from kfbot.evaluate.task import KernelTask
from kfbot.paths import copy_repository
from kfbot.text import write_source


@dataclass(frozen=True)
class FinalistResult:
    passed: bool
    reason: str  # one line: what ran and how it ended
    commands: tuple[str, ...]
    seconds: float
    output_tail: str


@dataclass(frozen=True)
class _Step:
    command: list[str]
    folder: str  # relative to the copy
    shown: str  # the command as a person would type it


def run_finalist(task: KernelTask, candidate: Candidate, timeout_s: float = 1800.0,
                 python: str = sys.executable,
                 staged: Sequence[StagedModule] = ()) -> FinalistResult:
    """`staged`: kfbot's build of the candidate, for a layout kfbot cannot build the
    repository's own way; a "package" entry names a folder relative to the repository."""
    if candidate.params:
        return FinalistResult(False, "parameter values must be written into the sources "
                              "before the finalist check", (), 0.0, "")
    if not task.test_targets and not task.script_targets:
        return FinalistResult(False, "the repository has no reference test for this kernel",
                              (), 0.0, "")
    started = time.monotonic()
    steps = _steps(task, python, bool(staged))
    shown = tuple(step.shown for step in steps)
    with tempfile.TemporaryDirectory(prefix="kfbot-finalist-") as tmp:
        copy = _prepared_copy(task.root, Path(tmp), candidate)
        env = _environment(Path(tmp), copy, staged, task)
        output = ""
        for index, step in enumerate(steps):
            left = timeout_s - (time.monotonic() - started)
            ran = run_process(step.command, copy / step.folder, env, left,
                              Path(tmp) / f"step{index}.log", writable=[Path(tmp)])
            output = (output + ran.tail)[-8000:]
            if not ran.ok:
                return FinalistResult(False, f"`{step.shown}` failed ({_why(ran)})", shown,
                                      time.monotonic() - started, output)
    targets = len(task.test_targets) + len(task.script_targets)
    return FinalistResult(True, f"the repository's build and {targets} reference test "
                          "target(s) pass", shown, time.monotonic() - started, output)


def _why(ran: Ran) -> str:
    if ran.timed_out:
        return "timed out"
    return ran.how() if ran.flooded or ran.exit_code < 0 else f"exit {ran.exit_code}"


def _prepared_copy(root: Path, tmp: Path, candidate: Candidate) -> Path:
    """The repository's own files (no link out of it followed) with the candidate's laid
    over them; build outputs are left out so the copy builds its own."""
    copy = tmp / "repo"
    copy_repository(root, copy)
    for rel, text in candidate.files.items():
        target = copy / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        write_source(target, text)
    return copy


def _own(task: KernelTask) -> OwnRecipe | None:
    """The repository's own build, where it builds the extension itself."""
    if task.build.kind in ("setup_py", "repository") and \
            Path(task.build.file).name in ("setup.py", "pyproject.toml"):
        return own_recipe(task.build.file)
    return None


def _environment(tmp: Path, copy: Path, staged: Sequence[StagedModule],
                 task: KernelTask) -> dict[str, str]:
    extra = {"TORCH_EXTENSIONS_DIR": str(tmp / "torch_ext"), "PYTHONDONTWRITEBYTECODE": "1",
             "PYTHONUNBUFFERED": "1"}
    if staged:
        # The package is the copy's (the candidate may change its Python), the build
        # is kfbot's.
        inside = [StagedModule(m.name, m.kind, str(copy / m.path), m.init, m.source)
                  if m.kind == "package" else m for m in staged]
        extra[STAGED_ENV] = encode(inside)
    env = untrusted_env(extra)
    # The harness that starts the tests and scripts is kfbot's, importable alone.
    # A package the repository builds itself is importable as an install would make it.
    recipe = _own(task) if task.build.kind == "repository" else None
    built = [str(recipe.library_root(copy)), str(copy / recipe.folder)] if recipe else []
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(kfbot_import_dir(tmp)), *built,
                                                      env.get("PYTHONPATH")]))
    return env


def _steps(task: KernelTask, python: str, staged: bool) -> list[_Step]:
    steps: list[_Step] = []
    recipe = _own(task)
    if recipe is not None and not staged:
        # Built in place (or into the copy's private folder) so that the tests import
        # this copy's libraries.
        steps.append(_Step(recipe.command(python), recipe.folder or ".", recipe.typed()))
    if task.test_targets:
        args = ["-q", "-p", "no:cacheprovider", *task.test_targets]
        steps.append(_Step(harness.command(python, "pytest", *args), ".",
                           f"python -m pytest {' '.join(args)}"))
    for script in task.script_targets:
        path = Path(script)
        steps.append(_Step(harness.command(python, "script", path.name), str(path.parent),
                           f"python {path.name} (in {path.parent.as_posix()}/)"
                           if path.parent != Path(".") else f"python {path.name}"))
    return steps
