"""Run a repository's tests under the capture plugin and collect the call signatures.

    result = capture_signatures(repo, ["tests/test_softmax.py"],
                                [OpRef.parse("inline_softmax.softmax")])
    for sig in result.signatures: ...

The tests run as `python -m pytest -x -q -p kfbot.evaluate.capture <targets>` in the
repository root, in their own process group (killed whole at the timeout), with an
environment stripped of secrets. What the tests do is data: a failing run, a run that
times out or one that never calls the ops comes back as a `CaptureResult` saying so.
Only what a person must fix first raises `KfbotError`: no pytest for that Python, a
target that does not exist.

This module never imports torch.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import kfbot
from kfbot.errors import EXIT_MISSING_TOOL, KfbotError
from kfbot.evaluate.sandbox import untrusted_env
from kfbot.evaluate.signature import (
    CAPTURE_ENV,
    DEFAULT_MAX_CALLS,
    CallSignature,
    CaptureFile,
    CaptureRequest,
    OpRef,
)

PLUGIN = "kfbot.evaluate.capture"
TAIL_BYTES = 8 * 1024
# pytest's exit code for usage errors, which include targets it cannot find.
_PYTEST_USAGE_ERROR = 4
_CHECK_TIMEOUT_S = 60.0


@dataclass(frozen=True)
class CaptureResult:
    """The signatures one test run produced, and how the run went."""

    signatures: tuple[CallSignature, ...]
    calls: int  # every call of the ops, recorded or not
    exit_code: int  # pytest's; negative: the signal that ended it
    output_tail: str  # the end of pytest's output, for a person to read
    errors: tuple[str, ...]  # what went wrong, one line each
    timed_out: bool = False
    op_calls: tuple[tuple[str, int], ...] = ()  # calls per op
    raised_calls: tuple[tuple[str, int], ...] = ()  # of those, calls that raised

    @property
    def ok(self) -> bool:
        """The tests passed and called the ops."""
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
) -> CaptureResult:
    """Run the tests `targets` (paths or node ids, relative to `root`) and record `ops`."""
    root = root.resolve()
    if not ops:
        raise KfbotError("capture: name at least one op to record")
    _check_targets(root, targets)
    with tempfile.TemporaryDirectory(prefix="kfbot-capture-") as tmp:
        out = Path(tmp) / "capture.json"
        request = CaptureRequest(ops=tuple(ops), out=str(out), max_calls=max_calls,
                                 mutant=mutant)
        env = capture_env(request, extra_env, kfbot_import_dir(Path(tmp)))
        _check_pytest(python, root, env)
        command = [python, "-m", "pytest", "-x", "-q", "-p", PLUGIN, "-p", "no:cacheprovider"]
        exit_code, timed_out, tail = _run([*command, *targets], root, env, timeout_s, Path(tmp))
        if exit_code == _PYTEST_USAGE_ERROR and "not found" in tail:
            raise KfbotError(f"capture: pytest cannot find the targets: {_not_found_line(tail)}")
        found = read_results(out)
    return _result(found, ops, exit_code, timed_out, tail, timeout_s)


def capture_env(
    request: CaptureRequest, extra_env: Mapping[str, str] | None, import_dir: Path
) -> dict[str, str]:
    """The tests' environment: ours without secrets, the request, and kfbot importable."""
    env = untrusted_env(extra_env)
    old = [env["PYTHONPATH"]] if env.get("PYTHONPATH") else []
    env["PYTHONPATH"] = os.pathsep.join([str(import_dir), *old])
    env[CAPTURE_ENV] = json.dumps(request.to_json())
    env["PYTHONUNBUFFERED"] = "1"  # output reaches the log in time to be in the tail
    env["PYTHONDONTWRITEBYTECODE"] = "1"  # leave no __pycache__ behind in the repository
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


def _check_pytest(python: str, root: Path, env: Mapping[str, str]) -> None:
    # find_spec, not import: a clear message without paying for pytest's start-up.
    probe = "import importlib.util, sys; sys.exit(importlib.util.find_spec('pytest') is None)"
    try:
        done = subprocess.run(
            [python, "-c", probe],
            cwd=root,
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


def _run(
    command: Sequence[str], root: Path, env: Mapping[str, str], timeout_s: float, tmp: Path
) -> tuple[int, bool, str]:
    """Exit code, whether it timed out, and the output's tail."""
    log = tmp / "output.log"
    with log.open("wb") as sink:
        proc = subprocess.Popen(
            command,
            cwd=root,
            env=dict(env),
            stdin=subprocess.DEVNULL,
            stdout=sink,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # one process group to kill, workers included
        )
        timed_out = False
        try:
            proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            timed_out = True
            _kill_group(proc)
            proc.wait()
        except BaseException:
            _kill_group(proc)  # interrupted here: the tests must not run on unattended
            proc.wait()
            raise
    return proc.returncode, timed_out, _tail(log)


def _kill_group(proc: subprocess.Popen[bytes]) -> None:
    # Only before the child is reaped: after that its pid may be someone else's.
    if proc.returncode is not None:
        return
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        proc.kill()


def _tail(log: Path) -> str:
    with log.open("rb") as f:
        f.seek(max(0, log.stat().st_size - TAIL_BYTES))
        return f.read().decode("utf-8", errors="replace")


def _not_found_line(tail: str) -> str:
    lines = [line.strip() for line in tail.splitlines() if "not found" in line]
    return lines[-1] if lines else tail.strip().splitlines()[-1]


def _result(
    found: CaptureFile | None,
    ops: Sequence[OpRef],
    exit_code: int,
    timed_out: bool,
    tail: str,
    timeout_s: float,
) -> CaptureResult:
    errors = _run_errors(exit_code, timed_out, timeout_s)
    if found is None:
        errors.append("the capture plugin wrote no results (see the output tail)")
        found = CaptureFile()
    else:
        errors.extend(_capture_errors(found, ops))
    return CaptureResult(
        signatures=found.signatures,
        calls=found.calls,
        exit_code=exit_code,
        output_tail=tail,
        errors=(*errors, *found.errors),
        timed_out=timed_out,
        op_calls=found.op_calls,
        raised_calls=found.raised_calls,
    )


def _run_errors(exit_code: int, timed_out: bool, timeout_s: float) -> list[str]:
    if timed_out:
        return [f"the tests did not finish in {timeout_s:g} s and were killed"]
    if exit_code != 0:
        return [f"the tests failed (pytest exit code {exit_code})"]
    return []


def _capture_errors(found: CaptureFile, ops: Sequence[OpRef]) -> list[str]:
    errors = ["the tests never called the ops"] if found.calls == 0 else []
    # An op never wrapped was not imported, loaded or registered under that name.
    missing = [op.text for op in ops if op.text not in found.found]
    return errors + [f"{op}: never found while the tests ran" for op in missing]
