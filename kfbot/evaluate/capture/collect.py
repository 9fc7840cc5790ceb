"""Run a repository's tests and scripts under the capture recorder and collect the
call signatures.

    result = capture_signatures(repo, ["tests/test_softmax.py"],
                                [OpRef.parse("inline_softmax.softmax")],
                                scripts=["examples/check.py"])
    for sig in result.signatures: ...

Each test file runs as `pytest -q -p kfbot.evaluate.capture.plugin <file>` in the
repository root in a process of its own (`kfbot.evaluate.capture.suite` splits the targets
into files, and a file that tests several devices into its nodes), each script as a
script in its own folder (`kfbot.evaluate.capture.harness`), each in its own process group
(killed whole at the end and at its time limit), with an environment stripped of
secrets and kfbot's builds staged under their real names (`capture.imports`). Each file gets
at most `file_timeout_s`, and all of them together `timeout_s`. A file that cannot be
collected, hangs or crashes is one `ProcessRun` that says so (the module that is
missing and how to install it, the last lines of its output); the others go on, and
each process writes its records as they come, so a crash keeps what came before it.
Twins for another device (a Metal or CPU-only test file) are not run, and say why.

What the repository's code does is data: a failing run, a run that times out or one
that never calls the ops comes back as a `CaptureResult` saying so. Only what a person
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
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from pathlib import Path
from uuid import uuid4

import kfbot
from kfbot.errors import EXIT_MISSING_TOOL, KfbotError
from kfbot.evaluate.capture import harness, launches, suite
from kfbot.evaluate.capture.imports import STAGED_ENV, StagedModule, encode
from kfbot.evaluate.capture.launches import OBSERVE_ENV, ObserveRequest, RunRecord
from kfbot.evaluate.capture.protocol import (
    CAPTURE_ENV,
    DEFAULT_MAX_CALLS,
    CaptureFile,
    CaptureRequest,
)
from kfbot.evaluate.capture.signature import CallSignature, OpRef
from kfbot.evaluate.capture.suite import Skipped
from kfbot.evaluate.sandbox import untrusted_env
from kfbot.evaluate.sandbox.processes import Ran, last_lines, run_process

PLUGIN = "kfbot.evaluate.capture.plugin"
# pytest's exit codes for usage errors (which include targets it cannot find) and for a
# file in which no test was collected.
_PYTEST_USAGE_ERROR = 4
_PYTEST_NO_TESTS = 5
_CHECK_TIMEOUT_S = 60.0
_COLLECT_TIMEOUT_S = 120.0
# A test file gets at most this long, unless the caller says otherwise: a hanging file
# must leave time for the others.
DEFAULT_FILE_TIMEOUT_S = 300.0


@dataclass(frozen=True)
class ProcessRun:
    """One process capture ran: a test file (or some of its nodes), or one script."""

    kind: str  # "pytest" or "script"
    target: str  # what it ran: the test file or node ids, or the script's path
    folder: str  # its working folder, relative to the repository
    ran: Ran
    problem: str = ""  # what a person must know: a missing module, a hang, a crash

    def line(self) -> str:
        where = f" in {self.folder}/" if self.folder not in ("", ".") else ""
        said = f": {self.problem}" if self.problem else ""
        return f"{self.kind} {self.target}{where} {self.ran.how()}{said}"

    @property
    def ok(self) -> bool:
        # A file whose tests were all deselected or skipped ran nothing, and nothing failed.
        return self.ran.ok or (self.kind == "pytest" and self.ran.exit_code == _PYTEST_NO_TESTS
                               and not self.ran.timed_out and not self.ran.flooded)


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
    skipped: tuple[Skipped, ...] = ()  # test files and nodes not run: twins
    observed: tuple[RunRecord, ...] = ()  # per test, when observation was asked for

    @property
    def ok(self) -> bool:
        """Every run passed and the ops were called."""
        return self.exit_code == 0 and bool(self.signatures)


@dataclass(frozen=True)
class MutantRuns:
    """The tests `targets` run once per mutant of the op's result, recording nothing: what
    the test adequacy gate asks for (`kfbot.anticheat.adequacy.MutantRunner`). `staged`
    makes kfbot's build of the extension importable under its real name, `extra_env`
    is what the tree of the repository's own build needs."""

    root: Path
    targets: tuple[str, ...]
    op: OpRef
    timeout_s: float = 600
    staged: tuple[StagedModule, ...] = ()
    extra_env: Mapping[str, str] | None = None

    def run(self, mutant: str) -> CaptureResult:
        return capture_signatures(self.root, self.targets, [self.op], timeout_s=self.timeout_s,
                                  max_calls=0, mutant=mutant, staged=self.staged,
                                  extra_env=self.extra_env)


@dataclass(frozen=True)
class _Planned:
    """One process to run: its command, folder and the environment it adds."""

    kind: str
    target: str
    folder: Path
    command: list[str]
    env: dict[str, str]


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
    file_timeout_s: float = DEFAULT_FILE_TIMEOUT_S,
    jobs: int = 1,
    observe: ObserveRequest | None = None,
) -> CaptureResult:
    """Run the tests `targets` (paths or node ids, relative to `root`) and the
    `scripts`, each test file in its own process, and record `ops`; calls made inside
    the wrappers `outer` say so. With `observe`, every process also writes what each
    test launched (`observe.out` is a folder then)."""
    root = root.resolve()
    if not ops and observe is None:
        raise KfbotError("capture: name at least one op to record")
    _check_targets(root, [*targets, *scripts])
    deadline = time.monotonic() + timeout_s
    with tempfile.TemporaryDirectory(prefix="kfbot-capture-") as tmp:
        out = Path(tmp) / "capture.json"
        request = CaptureRequest(ops=tuple(ops), out=str(out), max_calls=max_calls,
                                 mutant=mutant, outer=tuple(outer))
        env = capture_env(request if ops else None, extra_env, kfbot_import_dir(Path(tmp)),
                          staged)
        if targets:
            _check_pytest(python, Path(tmp), env)
        plan, skipped = _plan(root, targets, scripts, python, env, Path(tmp))
        planned = [_with_outputs(p, i, request if ops else None, observe)
                   for i, p in enumerate(plan)]
        # The sandboxed processes write only here: the results, and what they observe.
        written = [Path(tmp), *([Path(observe.out)] if observe is not None and observe.out
                                else [])]
        runs = _run_all(planned, env, deadline, file_timeout_s, jobs, written, root)
        found = read_results(out) if ops else CaptureFile()
        observed = _observed(observe, len(planned), runs)
    return _result(found, ops, runs, skipped, observed)


def _plan(root: Path, targets: Sequence[str], scripts: Sequence[str], python: str,
          env: Mapping[str, str], tmp: Path) -> tuple[list[_Planned], list[Skipped]]:
    """The processes to run, one per test file (per node where a file mixes devices),
    one per script; and the files and nodes left out, with why."""
    planned: list[_Planned] = []
    skipped: list[Skipped] = []
    files = [(target, suite.twin_of(root, target.file)) for target in suite.expand(root, targets)]
    uses_cuda = any(twin.cuda for _, twin in files)
    for target, twin in files:
        why = twin.skip_in(uses_cuda)
        if why is not None:
            skipped.append(Skipped(target.file, why))
            continue
        groups: list[tuple[str, ...]] = [target.args]
        if twin.mixed:
            nodes = list(target.nodes) or _collect(root, target.file, python, env, tmp)
            kept = []
            for node in nodes:
                why = suite.twin_node(node, twin.twin_names)
                if why is None:
                    kept.append(node)
                else:
                    skipped.append(Skipped(node, why))
            groups = suite.node_groups(kept) if kept else []
        planned += [_Planned("pytest", " ".join(g), root, _pytest_command(python, g), {})
                    for g in groups]
    for script in scripts:
        path = root / script
        planned.append(_Planned("script", script, path.parent,
                                harness.command(python, "script", str(path)),
                                {harness.SCRIPT_ENV: script}))
    return planned, skipped


def _pytest_command(python: str, args: Sequence[str]) -> list[str]:
    # tee-sys: what the tests print reaches the log as well as pytest's reports, so a
    # flood of output is seen (and stopped) instead of filling pytest's capture file.
    # --rootdir: node ids relative to the task's folder, as the scan names the tests, even
    # where a pyproject.toml further up would make pytest root them there.
    return harness.command(python, "pytest", "-q", "--capture=tee-sys", "--rootdir=.", "-p",
                           PLUGIN, "-p", "no:cacheprovider", *args)


def _collect(root: Path, file: str, python: str, env: Mapping[str, str], tmp: Path) -> list[str]:
    """The node ids of one file, or the file itself when they cannot be listed (its own
    run then says why)."""
    command = harness.command(python, "pytest", "--collect-only", "-q", "--rootdir=.", "-p",
                              "no:cacheprovider", file)
    ran = run_process(command, root, env, _COLLECT_TIMEOUT_S, tmp / f"collect-{uuid4().hex}.log",
                      writable=[tmp])
    nodes = [line.strip() for line in ran.tail.splitlines()
             if line.startswith(file + "::")]
    return nodes or [file]


def _with_outputs(p: _Planned, index: int, request: CaptureRequest | None,
                  observe: ObserveRequest | None) -> _Planned:
    """Each process writes its own files: a crash in one cannot cut another's short."""
    env = dict(p.env)
    if request is not None:
        env[CAPTURE_ENV] = json.dumps({**request.to_json(), "out": f"{request.out}.p{index}"})
    if observe is not None:
        env[OBSERVE_ENV] = json.dumps(replace(observe, out=_observed_file(observe, index))
                                      .to_json())
    return replace(p, env=env)


def _observed_file(observe: ObserveRequest, index: int) -> str:
    return str(Path(observe.out) / f"observed.{index}.jsonl")


def _run_all(planned: Sequence[_Planned], env: Mapping[str, str], deadline: float,
             file_timeout_s: float, jobs: int, written: Sequence[Path],
             root: Path) -> list[ProcessRun]:
    """Each process may write `written` (the first holds the logs) and read `root` (a
    script runs from its own folder, and imports from the root)."""
    def one(index: int) -> ProcessRun:
        p = planned[index]
        limit = min(file_timeout_s, _left(deadline))
        ran = run_process(p.command, p.folder, {**env, **p.env}, limit,
                          written[0] / f"run-{index}.log", writable=written, readable=[root])
        run = ProcessRun(p.kind, p.target, _folder(p), ran)
        if p.kind == "pytest" and ran.exit_code == _PYTEST_USAGE_ERROR and "not found" in ran.tail:
            raise KfbotError(f"capture: pytest cannot find the targets: "
                             f"{_not_found_line(ran.tail)}")
        return replace(run, problem=_problem(run))

    if jobs <= 1 or len(planned) <= 1:
        return [one(i) for i in range(len(planned))]
    with ThreadPoolExecutor(max_workers=jobs) as pool:
        return list(pool.map(one, range(len(planned))))


def _folder(p: _Planned) -> str:
    if p.kind == "pytest":
        return "."
    return Path(p.target).parent.as_posix()


def _problem(run: ProcessRun) -> str:
    """What went wrong with one process, in a line a person acts on."""
    ran = run.ran
    if ran.timed_out:
        return "stopped at its time limit; its last lines: " + _last(ran.tail)
    if run.ok:
        return ""
    if run.kind == "pytest":
        found = suite.collect_problem(ran.tail)
        if found is not None:
            return found
    module = suite.missing_module(ran.tail) if run.kind == "script" else None
    if module is not None:
        return f"an import failed: no module named {module!r} ({suite.pip_line(module)})"
    if ran.exit_code < 0:
        return "crashed; its last lines: " + _last(_before_dump(ran.tail))
    return ""


def _last(tail: str) -> str:
    return " | ".join(last_lines(tail, 3).splitlines())[:400]


def _before_dump(tail: str) -> str:
    """A crash's output up to Python's fatal error line, without the stack dump after
    it (frames of the interpreter's own start-up): what the test printed last, and the
    error."""
    head, fatal, rest = tail.partition("Fatal Python error:")
    if not fatal:
        return tail
    return head + fatal + rest.splitlines()[0]


def _observed(observe: ObserveRequest | None, count: int,
              runs: Sequence[ProcessRun]) -> tuple[RunRecord, ...]:
    """What each process wrote per test; a process that died in a test gets a record
    for that test's file saying so (the test itself cannot be named)."""
    if observe is None:
        return ()
    out: list[RunRecord] = []
    for index, run in enumerate(runs[:count]):
        records = launches.read([Path(_observed_file(observe, index))])
        out += records
        if run.ran.exit_code < 0 or run.ran.timed_out:
            out.append(RunRecord(run.target, "crashed", note=run.ran.how()))
    return tuple(out)


def _left(deadline: float) -> float:
    # A run started after the time is up still gets a moment, so it says so itself.
    return max(deadline - time.monotonic(), 1.0)


def capture_env(
    request: CaptureRequest | None,
    extra_env: Mapping[str, str] | None,
    import_dir: Path,
    staged: Sequence[StagedModule] = (),
) -> dict[str, str]:
    """The tests' environment: the allowlisted one, the request, kfbot importable and
    kfbot's builds staged."""
    env = untrusted_env(extra_env)
    old = [env["PYTHONPATH"]] if env.get("PYTHONPATH") else []
    env["PYTHONPATH"] = os.pathsep.join([str(import_dir), *old])
    if request is not None:
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
    found: CaptureFile | None, ops: Sequence[OpRef], runs: Sequence[ProcessRun],
    skipped: Sequence[Skipped] = (), observed: Sequence[RunRecord] = (),
) -> CaptureResult:
    errors = [_run_error(run) for run in runs if not run.ok]
    if found is None:
        errors.append("the capture recorder wrote no results (see the output tail)")
        found = CaptureFile()
    elif ops:
        errors.extend(_capture_errors(found, ops))
    failing = next((run for run in runs if not run.ok), runs[-1] if runs else None)
    return CaptureResult(
        signatures=found.signatures,
        calls=found.calls,
        exit_code=0 if failing is None or failing.ok else failing.ran.exit_code,
        output_tail=failing.ran.tail if failing is not None else "",
        errors=(*errors, *found.errors),
        timed_out=any(run.ran.timed_out for run in runs),
        op_calls=found.op_calls,
        raised_calls=found.raised_calls,
        runs=tuple(runs),
        skipped=tuple(skipped),
        observed=tuple(observed),
    )


def _run_error(run: ProcessRun) -> str:
    ran = run.ran
    if run.kind == "script":
        said = f": {run.problem}" if run.problem and not ran.timed_out else ""
        return f"the script {run.target} {ran.how()}{said}"
    if ran.timed_out:
        return (f"the tests in {run.target} did not finish in {ran.seconds:.0f} s and were "
                f"killed")
    if ran.flooded:
        return (f"the tests in {run.target} were killed for writing more than "
                f"{ran.output_cap >> 20} MiB of output")
    if run.problem:
        return f"{run.target} {run.problem}"
    return f"the tests in {run.target} failed (pytest exit code {ran.exit_code})"


def _capture_errors(found: CaptureFile, ops: Sequence[OpRef]) -> list[str]:
    errors = ["the tests never called the ops"] if found.calls == 0 else []
    # An op never wrapped was not imported, loaded or registered under that name.
    missing = [op.text for op in ops if op.text not in found.found]
    return errors + [f"{op}: never found while the tests ran" for op in missing]
