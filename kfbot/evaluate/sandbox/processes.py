"""Run one of the repository's own processes (its tests, a script, its build) and
bring back how it ended.

The process runs in the sandbox (`kfbot.evaluate.sandbox`), writing only the folders it
is given, and leads its own process group: the group is killed when the process ends,
when it outlives its time, or when it writes more than `output_cap` bytes (an import
that prints without end must not fill the disk); with the sandbox's namespace goes
whatever it left running, `setsid` daemons included. Its output goes to a file, of
which the result keeps the tail: the evidence a person reads when the step fails.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from kfbot.evaluate.sandbox.policy import confined, exit_code, finished

TAIL_BYTES = 8 * 1024
OUTPUT_CAP_BYTES = 64 * 1024 * 1024
_TICK_S = 0.05


@dataclass(frozen=True)
class Ran:
    """How one process ended."""

    exit_code: int  # negative: the signal that ended it
    timed_out: bool
    flooded: bool  # killed for writing more than the cap
    tail: str  # the end of its output
    seconds: float
    output_cap: int = OUTPUT_CAP_BYTES

    @property
    def ok(self) -> bool:
        return self.exit_code == 0 and not self.timed_out and not self.flooded

    def how(self) -> str:
        """How it ended, in a few words."""
        if self.timed_out:
            return f"did not finish in {self.seconds:.0f} s and was killed"
        if self.flooded:
            return f"was killed for writing more than {self.output_cap // (1 << 20)} MiB of output"
        if self.exit_code < 0:
            return f"died with {_signal_name(-self.exit_code)}"
        return f"exited with code {self.exit_code}"


def run_process(
    command: Sequence[str],
    cwd: Path,
    env: Mapping[str, str],
    timeout_s: float,
    log: Path,
    output_cap: int = OUTPUT_CAP_BYTES,
    writable: Sequence[Path] = (),
    readable: Sequence[Path] = (),
) -> Ran:
    """Run `command` to its end (or its limits), then kill what is left of its group.
    It may write only `writable`; the rest is read-only, and /tmp private but for `cwd`,
    `readable` and what the command and `env` name."""
    argv = confined(command, cwd, writable, readable, env)
    started = time.monotonic()
    with log.open("wb") as sink:
        proc = subprocess.Popen(
            argv,
            cwd=cwd,
            env=dict(env),
            stdin=subprocess.DEVNULL,
            stdout=sink,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # one process group to kill, grandchildren too
        )
        try:
            timed_out, flooded = _watch(proc, log, started + max(timeout_s, 0.1), output_cap)
        finally:
            kill_group(proc)  # also on an interrupt: nothing runs on unattended
            proc.wait()
            finished(argv)  # what left the group (a separate user's setsid daemons)
    seconds = time.monotonic() - started
    return Ran(exit_code(proc.returncode), timed_out, flooded, tail(log), seconds, output_cap)


def _watch(
    proc: subprocess.Popen[bytes], log: Path, deadline: float, output_cap: int
) -> tuple[bool, bool]:
    """Wait for the process to exit; (timed out, flooded) when it had to be stopped."""
    while not has_exited(proc):
        if log.stat().st_size > output_cap:
            return False, True
        if time.monotonic() > deadline:
            return True, False
        time.sleep(_TICK_S)
    return False, False


def has_exited(proc: subprocess.Popen[bytes]) -> bool:
    """Whether the process has exited, without reaping it: its pid, and so its group's
    id, stays ours until we have killed what it left running."""
    if proc.returncode is not None:
        return True
    try:
        state = os.waitid(os.P_PID, proc.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT)
    except ChildProcessError:
        return True
    return state is not None


def kill_group(proc: subprocess.Popen[bytes]) -> None:
    """SIGKILL the child and everything it started (it leads its own session); the
    child itself too, in case its group could not be reached (it is still ours)."""
    if proc.returncode is not None:
        return  # reaped: the id may belong to someone else by now
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)
    with contextlib.suppress(ProcessLookupError):
        proc.kill()


def tail(log: Path, size: int = TAIL_BYTES) -> str:
    """The last `size` bytes of `log`, as text. A writer the kill has not reached yet may
    still be adding to it, so the cut is made after the read, not only before it."""
    with log.open("rb") as f:
        f.seek(max(0, log.stat().st_size - size))
        return f.read()[-size:].decode("utf-8", errors="replace")


def last_lines(text: str, count: int = 15) -> str:
    """The last `count` non-empty lines: what a person reads first."""
    lines = [line.rstrip() for line in text.splitlines() if line.strip()]
    return "\n".join(lines[-count:])


def _signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"
