"""The finalist check: the repository's own build and its own reference tests, run
against a copy of the repository with the candidate applied.

kfbot's fast builds and its own checks decide the search; before a winner is
published it must also pass what the repository's authors wrote, built the way they
build it. The user's working tree is never written: everything happens in a copy.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from kfbot.evaluate.candidate import Candidate
from kfbot.evaluate.sandbox import untrusted_env
from kfbot.evaluate.task import KernelTask

SKIP = shutil.ignore_patterns(".git", "__pycache__", "*.egg-info", ".kfbot", "build", "dist",
                              ".venv", "venv", "*.so", "*.o")


@dataclass(frozen=True)
class FinalistResult:
    passed: bool
    reason: str  # one line: what ran and how it ended
    commands: tuple[str, ...]
    seconds: float
    output_tail: str


def run_finalist(task: KernelTask, candidate: Candidate, timeout_s: float = 1800.0,
                 python: str = sys.executable) -> FinalistResult:
    if candidate.params:
        return FinalistResult(False, "parameter values must be written into the sources "
                              "before the finalist check", (), 0.0, "")
    if not task.test_targets:
        return FinalistResult(False, "the repository has no reference test for this kernel",
                              (), 0.0, "")
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="kfbot-finalist-") as tmp:
        copy = _prepared_copy(task.root, Path(tmp), candidate)
        env = untrusted_env({"TORCH_EXTENSIONS_DIR": str(Path(tmp) / "torch_ext"),
                                        "PYTHONDONTWRITEBYTECODE": "1"})
        steps = _steps(task, python)
        output = ""
        for cmd, where in steps:
            left = timeout_s - (time.monotonic() - started)
            code, text = _run(cmd, copy / where, env, left)
            output = (output + text)[-8000:]
            if code != 0:
                why = "timed out" if code == -signal.SIGKILL else f"exit {code}"
                return FinalistResult(False, f"`{_shown(cmd)}` failed ({why})",
                                      tuple(_shown(c) for c, _ in steps),
                                      time.monotonic() - started, output)
    return FinalistResult(True, f"the repository's build and {len(task.test_targets)} reference "
                          "test target(s) pass", tuple(_shown(c) for c, _ in steps),
                          time.monotonic() - started, output)


def _prepared_copy(root: Path, tmp: Path, candidate: Candidate) -> Path:
    copy = tmp / "repo"
    shutil.copytree(root, copy, ignore=SKIP, symlinks=True)
    for rel, text in candidate.files.items():
        target = copy / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(text)
    return copy


Step = tuple[list[str], str]  # the command and the folder it runs in, relative to the copy


def _steps(task: KernelTask, python: str) -> list[Step]:
    steps: list[Step] = []
    if task.build.kind == "setup_py":
        # Built in place so that the tests import this copy's extension.
        setup = Path(task.build.file)
        steps.append(([python, "-u", setup.name, "build_ext", "--inplace"], str(setup.parent)))
    tests = [t for t in task.test_targets if "::" in t or Path(t).name.startswith("test_")]
    scripts = [t for t in task.test_targets if t not in tests]
    if tests:
        steps.append(([python, "-u", "-m", "pytest", "-q", "-p", "no:cacheprovider", *tests], "."))
    steps += [([python, "-u", script], ".") for script in scripts]
    return steps


def _run(cmd: Sequence[str], cwd: Path, env: dict[str, str], timeout_s: float
         ) -> tuple[int, str]:
    with subprocess.Popen(cmd, cwd=cwd, env=env, stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, text=True, start_new_session=True) as proc:
        try:
            out, _ = proc.communicate(timeout=max(timeout_s, 1.0))
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            out, _ = proc.communicate()
            return -signal.SIGKILL, out or ""
        return proc.returncode, out or ""


def _shown(cmd: Sequence[str]) -> str:
    return " ".join(["python", *cmd[1:]])
