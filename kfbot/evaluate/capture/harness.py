"""The first code of every process that runs a repository's tests or scripts for kfbot.

    <python_module(python, HARNESS)> pytest <pytest arguments>   # as `python -m pytest`
    <python_module(python, HARNESS)> script <path> <arguments>   # as `python <file>`

The harness starts without the working folder (the repository) on `sys.path`
(`kfbot.evaluate.sandbox.python_module`): a repository that holds a `kfbot/` or a
`pytest.py` would replace kfbot's own modules. It imports what kfbot needs first,
and only then gives the repository the path it would have had when run by hand.

Before the repository's code runs, kfbot's builds are made importable under their
real names (`kfbot.evaluate.capture.imports`). A script runs as a script: `__name__` is
"__main__", its own folder is the working folder and `sys.path[0]`, and, when
`KFBOT_CAPTURE` asks for it, the op calls it makes are recorded and saved as they
come, so a script that fails or exits later keeps what it showed. When
`KFBOT_OBSERVE` asks for it, the kernels the whole script launched are recorded too
(`kfbot.evaluate.capture.launch_recorder`), with whether it exited cleanly.

This module imports neither torch nor, for scripts, pytest; the observer, when asked
for, imports torch before the script runs (its profiler must be running first).
"""

from __future__ import annotations

import os
import runpy
import sys
from pathlib import Path

from kfbot.evaluate.capture.imports import install_from_environment
from kfbot.evaluate.capture.launch_recorder import Recorder
from kfbot.evaluate.capture.launches import Outcome
from kfbot.evaluate.capture.launches import request_from_environment as observe_request
from kfbot.evaluate.capture.recorder import Capture, output_path, request_from_environment
from kfbot.evaluate.sandbox import python_module

HARNESS = "kfbot.evaluate.capture.harness"
# The script's path in the repository: its calls are recorded as made by that "test",
# which ties them to the reference the same script holds.
SCRIPT_ENV = "KFBOT_SCRIPT"


def command(python: str, mode: str, *args: str) -> list[str]:
    return [*python_module(python, HARNESS), mode, *args]


def main() -> None:
    mode, *args = sys.argv[1:] or [""]
    install_from_environment()
    if mode == "pytest":
        _pytest(args)
    elif mode == "script" and args:
        _script(Path(args[0]), args[1:])
    else:
        sys.exit(f"kfbot harness: unknown mode {mode!r}")


def _pytest(args: list[str]) -> None:
    import pytest  # before the repository is on the path (kfbot's own modules are found
    # through the kfbot package, already imported, whatever the path holds)

    sys.path.insert(0, os.getcwd())  # what `python -m pytest` gives the tests
    raise SystemExit(int(pytest.main(args)))


def _script(path: Path, args: list[str]) -> None:
    script = path.resolve()
    os.chdir(script.parent)
    sys.path.insert(0, str(script.parent))
    sys.argv = [path.name, *args]
    observer = _start_observer()
    capture = _start_capture()
    if capture is not None and observer is not None:
        capture.around = observer.op_range
    outcome: Outcome = "failed"
    try:
        runpy.run_path(str(script), run_name="__main__")
        outcome = "passed"
    except SystemExit as exc:
        outcome = "passed" if exc.code in (None, 0) else "failed"
        raise
    finally:
        if capture is not None:
            capture.save(output_path(capture.request.out))
        if observer is not None:
            observer.stop(outcome)


def _start_observer() -> Recorder | None:
    request = observe_request()
    if request is None:
        return None
    observer = Recorder(request)
    observer.start(os.environ.get(SCRIPT_ENV, ""))
    return observer


def _start_capture() -> Capture | None:
    request = request_from_environment()
    if request is None:
        return None
    capture = Capture(request, save_to=output_path(request.out))
    capture.test_id = os.environ.get(SCRIPT_ENV, "")
    capture.install()
    return capture


if __name__ == "__main__":
    main()
