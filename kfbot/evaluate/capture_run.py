"""Run a repository's tests and scripts under the capture recorder and collect the
call signatures.

    result = capture_signatures(repo, ["tests/test_softmax.py"],
                                [OpRef.parse("inline_softmax.softmax")],
                                scripts=["examples/check.py"])
    for sig in result.signatures: ...

The tests run as `pytest -x -q -p kfbot.evaluate.capture_plugin <targets>` in the
repository root, each script as a script in its own folder (`kfbot.evaluate.harness`),
each in its own process group (killed whole at the end and at the timeout), with an
environment stripped of secrets, kfbot's builds staged under their real names
(`staged`), and one time limit shared by them all. What the repository's code does is
data: a failing run, a run that times out or one that never calls the ops comes back
as a `CaptureResult` saying so, with each process's end of output. Only what a person
must fix first raises `KfbotError`: no pytest for that Python, a target that does not
exist.

This module never imports torch.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import kfbot
from kfbot.errors import EXIT_MISSING_TOOL, KfbotError
from kfbot.evaluate import harness
from kfbot.evaluate.processes import Ran, run_process
from kfbot.evaluate.sandbox import untrusted_env
from kfbot.evaluate.signature import (
    CAPTURE_ENV,
    DEFAULT_MAX_CALLS,
    CallSignature,
    CaptureFile,
    CaptureRequest,
    OpRef,
)
from kfbot.evaluate.staged import STAGED_ENV, StagedModule, encode

PLUGIN = "kfbot.evaluate.capture_plugin"
# pytest's exit code for usage errors, which include targets it cannot find.
_PYTEST_USAGE_ERROR = 4
_CHECK_TIMEOUT_S = 60.0


@dataclass(frozen=True)
class ProcessRun:
    """One process capture ran: the pytest session or one script."""

    kind: str  # "pytest" or "script"
    target: str  # what it ran: the test targets, or the script's path
    folder: str  # its working folder, relative to the repository
    ran: Ran

    def line(self) -> str:
        where = f" in {self.folder}/" if self.folder not in ("", ".") else ""
        return f"{self.kind} {self.target}{where} {self.ran.how()}"


@dataclass(frozen=True)
class CaptureResult:
    """The signatures the runs produced, and how each run went."""

    signatures: tuple[CallSignature, ...]
    calls: int  # every call of the ops, recorded or not
    exit_code: int  # the first failing run's (negative: the signal that ended it)
    output_tail: str  # the end of that run's output (else the last run's)
    errors: tuple[str, ...]  # what went wrong, one line each
    timed_out: bool = False
    op_calls: tuple[tuple[str, int], ...] = ()  # calls per op
    raised_calls: tuple[tuple[str, int], ...] = ()  # of those, calls that raised
    runs: tuple[ProcessRun, ...] = ()

    @property
    def ok(self) -> bool:
        """Every run passed and the ops were called."""
        return self.exit_code == 0 and bool(self.signatures)


def capture_signatures(
    root: Path,
    targets: Sequence[str],
    ops: Sequence[OpRef],
    timeout_s: float = 600,
    python: str = sys.executable,
    extra_env: Mapping[str, str] | None = None,
    max_calls: int = DEFAULT_MAX_CALLS,
    mutant: str | None = None,
    scripts: Sequence[str] = (),
    staged: Sequence[StagedModule] = (),
    outer: Sequence[OpRef] = (),
) -> CaptureResult:
    """Run the tests `targets` (paths or node ids, relative to `root`) and the
    `scripts`, and record `ops`; calls made inside the wrappers `outer` say so."""
    root = root.resolve()
    if not ops:
        raise KfbotError("capture: name at least one op to record")
    _check_targets(root, [*targets, *scripts])
    deadline = time.monotonic() + timeout_s
    with tempfile.TemporaryDirectory(prefix="kfbot-capture-") as tmp:
        out = Path(tmp) / "capture.json"
        request = CaptureRequest(ops=tuple(ops), out=str(out), max_calls=max_calls,
                                 mutant=mutant, outer=tuple(outer))
        env = capture_env(request, extra_env, kfbot_import_dir(Path(tmp)), staged)
        runs: list[ProcessRun] = []
        if targets:
            _check_pytest(python, Path(tmp), env)
            runs.append(_run_pytest(python, root, targets, env, deadline, Path(tmp)))
        for index, script in enumerate(scripts):
            # Each script its own results file: they are merged like xdist workers'.
            script_env = {**env, harness.SCRIPT_ENV: script, CAPTURE_ENV: json.dumps(
                {**request.to_json(), "out": f"{out}.script{index}"})}
            runs.append(_run_script(python, root, script, script_env, deadline, Path(tmp)))
        found = read_results(out)
    return _result(found, ops, runs)


def _run_pytest(python: str, root: Path, targets: Sequence[str], env: Mapping[str, str],
                deadline: float, tmp: Path) -> ProcessRun:
    # tee-sys: what the tests print reaches the log as well as pytest's reports, so a
    # flood of output is seen (and stopped) instead of filling pytest's capture file.
    # --rootdir: node ids relative to the task's folder, as the scan names the tests, even
    # where a pyproject.toml further up would make pytest root them there.
    args = ["-x", "-q", "--capture=tee-sys", "--rootdir=.", "-p", PLUGIN, "-p",
            "no:cacheprovider", *targets]
    command = harness.command(python, "pytest", *args)
    ran = run_process(command, root, env, _left(deadline), tmp / "pytest.log", writable=[tmp])
    if ran.exit_code == _PYTEST_USAGE_ERROR and "not found" in ran.tail:
        raise KfbotError(f"capture: pytest cannot find the targets: {_not_found_line(ran.tail)}")
    return ProcessRun("pytest", " ".join(targets), ".", ran)


def _run_script(python: str, root: Path, script: str, env: Mapping[str, str],
                deadline: float, tmp: Path) -> ProcessRun:
    path = root / script
    command = harness.command(python, "script", str(path))
    log = tmp / f"script-{len(list(tmp.glob('script-*.log')))}.log"
    ran = run_process(command, path.parent, env, _left(deadline), log, writable=[tmp],
                      readable=[root])
    return ProcessRun("script", script, Path(script).parent.as_posix(), ran)


def _left(deadline: float) -> float:
    # A run started after the time is up still gets a moment, so it says so itself.
    return max(deadline - time.monotonic(), 1.0)


def capture_env(
    request: CaptureRequest,
    extra_env: Mapping[str, str] | None,
    import_dir: Path,
    staged: Sequence[StagedModule] = (),
) -> dict[str, str]:
    """The tests' environment: the allowlisted one, the request, kfbot importable and
    kfbot's builds staged."""
    env = untrusted_env(extra_env)
    old = [env["PYTHONPATH"]] if env.get("PYTHONPATH") else []
    env["PYTHONPATH"] = os.pathsep.join([str(import_dir), *old])
    env[CAPTURE_ENV] = json.dumps(request.to_json())
    env["PYTHONUNBUFFERED"] = "1"  # output reaches the log in time to be in the tail
    env["PYTHONDONTWRITEBYTECODE"] = "1"  # leave no __pycache__ behind in the repository
    if staged:
        env[STAGED_ENV] = encode(staged)
    return env


def kfbot_import_dir(tmp: Path) -> Path:
    """A folder in `tmp` where kfbot, and nothing else, can be imported from.

    kfbot's own parent folder may be a site-packages: on the tests' PYTHONPATH it
    would put our torch and friends in front of the repository's own.
    """
    folder = tmp / "import"
    folder.mkdir()
    (folder / "kfbot").symlink_to(Path(kfbot.__file__).resolve().parent, target_is_directory=True)
    return folder


def read_results(out: Path) -> CaptureFile | None:
    """The plugin's file merged with those of pytest-xdist workers; None if none exists."""
    paths = [out, *sorted(out.parent.glob(out.name + ".*"))]
    found: CaptureFile | None = None
    for path in paths:
        if not path.is_file() or path.name.endswith(".partial"):
            continue
        try:
            part = CaptureFile.from_json(json.loads(path.read_text(encoding="utf-8")))
        except (OSError, ValueError) as exc:
            raise KfbotError(f"capture: cannot read {path}: {exc}") from exc
        found = part if found is None else found.merged(part)
    return found


def _check_targets(root: Path, targets: Sequence[str]) -> None:
    if not root.is_dir():
        raise KfbotError(f"capture: {root} is not a directory")
    for target in targets:
        path = root / target.split("::", 1)[0]
        if not path.exists():
            raise KfbotError(f"capture: test target {target!r} not found under {root}")


def _check_pytest(python: str, folder: Path, env: Mapping[str, str]) -> None:
    # find_spec, not import: a clear message without paying for pytest's start-up. Run
    # in a folder of ours: in the repository, its own `pytest.py` would answer.
    probe = "import importlib.util, sys; sys.exit(importlib.util.find_spec('pytest') is None)"
    try:
        done = subprocess.run(
            [python, "-c", probe],
            cwd=folder,
            env=dict(env),
            stdin=subprocess.DEVNULL,
            capture_output=True,
            timeout=_CHECK_TIMEOUT_S,
        )
    except FileNotFoundError as exc:
        raise KfbotError(f"capture: no Python at {python}", EXIT_MISSING_TOOL) from exc
    except subprocess.TimeoutExpired as exc:
        raise KfbotError(f"capture: {python} did not start", EXIT_MISSING_TOOL) from exc
    if done.returncode != 0:
        raise KfbotError(
            f"capture: pytest is not installed for {python} (pip install pytest)",
            EXIT_MISSING_TOOL,
        )


def _not_found_line(tail: str) -> str:
    lines = [line.strip() for line in tail.splitlines() if "not found" in line]
    return lines[-1] if lines else tail.strip().splitlines()[-1]


def _result(
    found: CaptureFile | None, ops: Sequence[OpRef], runs: Sequence[ProcessRun]
) -> CaptureResult:
    errors = [_run_error(run) for run in runs if not run.ran.ok]
    if found is None:
        errors.append("the capture recorder wrote no results (see the output tail)")
        found = CaptureFile()
    else:
        errors.extend(_capture_errors(found, ops))
    failing = next((run for run in runs if not run.ran.ok), runs[-1] if runs else None)
    return CaptureResult(
        signatures=found.signatures,
        calls=found.calls,
        exit_code=failing.ran.exit_code if failing is not None else 0,
        output_tail=failing.ran.tail if failing is not None else "",
        errors=(*errors, *found.errors),
        timed_out=any(run.ran.timed_out for run in runs),
        op_calls=found.op_calls,
        raised_calls=found.raised_calls,
        runs=tuple(runs),
    )


def _run_error(run: ProcessRun) -> str:
    ran = run.ran
    if run.kind == "script":
        return f"the script {run.target} {ran.how()}"
    if ran.timed_out:
        return f"the tests did not finish in {ran.seconds:.0f} s and were killed"
    if ran.flooded:
        return f"the tests were killed for writing more than {ran.output_cap >> 20} MiB of output"
    return f"the tests failed (pytest exit code {ran.exit_code})"


def _capture_errors(found: CaptureFile, ops: Sequence[OpRef]) -> list[str]:
    errors = ["the tests never called the ops"] if found.calls == 0 else []
    # An op never wrapped was not imported, loaded or registered under that name.
    missing = [op.text for op in ops if op.text not in found.found]
    return errors + [f"{op}: never found while the tests ran" for op in missing]
