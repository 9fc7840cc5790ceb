"""The ways kfbot can confine a process, tried in order: its own PID and mount namespaces
made by bubblewrap, then by `unshare` with a user namespace, then (only when kfbot runs
as root) a separate unprivileged user (`separate_user`). `detect()` tries each on a
harmless command and returns a `Sandbox`: the one that works, with what was tried before
it and why that failed, or method "none" with every reason. An operator can name the one
method to use in `KFBOT_SANDBOX`.
"""

from __future__ import annotations

import glob
import json
import os
import shutil
import subprocess
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from kfbot.evaluate.sandbox import separate_user
from kfbot.evaluate.sandbox.view import HIDDEN, View

Method = Literal["bwrap", "unshare", "separate-user", "none"]
METHODS: tuple[Method, ...] = ("bwrap", "unshare", "separate-user")
CHOICE_VARIABLE = "KFBOT_SANDBOX"

LAUNCHER = str(Path(__file__).resolve().with_name("launch.py"))
# The disk a sandboxed process may fill: its private /tmp and /dev/shm live in memory
# and are capped; any one file it writes elsewhere (a writable folder) is capped too.
TMP_BYTES = 4 << 30
SHM_BYTES = 1 << 30
FILE_BYTES = 8 << 30
_PROBE_TIMEOUT_S = 20.0
# A command killed by signal N comes back as 128 + N through the sandbox's init.
_SIGNALLED = range(129, 129 + 64)

INSTALL = {
    "bwrap": "install bubblewrap (apt-get install bubblewrap, dnf install bubblewrap)",
    "unshare": "allow user namespaces (sysctl kernel.unprivileged_userns_clone=1 and "
               "user.max_user_namespaces > 0; on Ubuntu 24.04 also "
               "kernel.apparmor_restrict_unprivileged_userns=0), or run in a container "
               "started with a seccomp profile that permits unshare",
    "separate-user": "run kfbot as root (a container, a dedicated runner) with its "
                     "Python environment writable by root only, so that the code runs as "
                     "a user of its own",
}
_LABELS = {"separate-user": "separate user"}


@dataclass(frozen=True)
class Attempt:
    """A method tried, and why it cannot be used here."""

    method: str
    problem: str

    def line(self) -> str:
        return f"{_LABELS.get(self.method, self.method)}: {self.problem}"


@dataclass(frozen=True)
class Sandbox:
    """How kfbot confines untrusted processes on this machine."""

    method: Method
    tool: str | None  # the program that makes the namespaces
    failed: tuple[Attempt, ...] = ()  # methods tried before this one

    @property
    def available(self) -> bool:
        return self.method != "none"

    def command(self, argv: Sequence[str], view: View) -> list[str]:
        """`argv` as it runs inside the sandbox, seeing `view`."""
        if self.tool is None:
            return list(argv)
        if self.method == "separate-user":
            lent = separate_user.lease(view)
            return [*_launch(separate_user.spec(lent, view, FILE_BYTES)), *argv]
        spec = {"mode": self.method, "cwd": view.cwd, "file_bytes": FILE_BYTES,
                "env": {"TMPDIR": "/tmp"}}
        if self.method == "bwrap":
            return [*_bwrap(self.tool, view), *_launch(spec), *argv]
        spec.update({"uid": os.getuid(), "gid": os.getgid(), "parent": os.getpid(),
                     "tmp_bytes": TMP_BYTES,
                     "shm_bytes": SHM_BYTES, "hide": list(HIDDEN), "devices": gpu_devices(),
                     "binds": [list(b) for b in view.binds]})
        return [self.tool, "--user", "--map-root-user", "--mount", "--pid", "--fork",
                "--kill-child", "--propagation", "private", "--", *_launch(spec), *argv]

    def exit_code(self, code: int) -> int:
        """The command's own exit status: negative for a signal, as subprocess gives it."""
        return 128 - code if self.tool is not None and code in _SIGNALLED else code

    def finished(self, argv: Sequence[str]) -> None:
        """After a command made by `command` ended or was killed: kill what it left (a
        namespace's end does that by itself; a separate user's processes must be)."""
        if self.method == "separate-user":
            uid = separate_user.lease_of(argv)
            if uid is not None:
                separate_user.release(uid)

    def summary(self) -> str:
        """One line: what is used, or what was tried."""
        if self.method == "separate-user":
            return "sandbox: separate-user (a fresh unprivileged uid per command)"
        if self.available:
            return f"sandbox: {self.method} ({self.tool})"
        return "no sandbox: " + "; ".join(a.line() for a in self.failed)

    def advice(self) -> str:
        """What to install or allow so that a sandbox works here."""
        return "; or ".join(INSTALL[a.method] for a in self.failed if a.method in INSTALL)


def detect() -> Sandbox:
    """The first method that runs a command here, with why each before it failed; only
    the one named in `KFBOT_SANDBOX` where that is set."""
    failed: list[Attempt] = []
    for method in chosen():
        tool, problem = _tool(method)
        if tool is None:
            failed.append(Attempt(method, problem or "cannot be used"))
            continue
        box = Sandbox(method, tool, tuple(failed))
        problem = _probe(box)
        if problem is None:
            return box
        failed.append(Attempt(method, problem))
    return Sandbox("none", None, tuple(failed))


def chosen() -> tuple[Method, ...]:
    """The methods to try: all, or those an operator named (comma-separated, in that
    order). Raises ValueError for a name that is not a method."""
    names = [n.strip() for n in os.environ.get(CHOICE_VARIABLE, "").split(",") if n.strip()]
    if not names:
        return METHODS
    unknown = [n for n in names if n not in METHODS]
    if unknown:
        raise ValueError(f"{CHOICE_VARIABLE}={','.join(names)!r}: {', '.join(unknown)} names "
                         f"no sandbox; use one or more of {', '.join(METHODS)}")
    return tuple(m for n in names for m in METHODS if m == n)


def _tool(method: Method) -> tuple[str | None, str | None]:
    """The program that makes `method`'s sandbox, or why there is none."""
    if method == "separate-user":
        problem = separate_user.problem()
        return (None, problem) if problem else (LAUNCHER, None)
    tool = shutil.which(method)
    return (tool, None) if tool else (None, f"`{method}` is not on PATH")


def gpu_devices() -> list[str]:
    """The NVIDIA device nodes: what CUDA opens."""
    return sorted(glob.glob("/dev/nvidia*"))


def _probe(box: Sandbox) -> str | None:
    """Why `box` cannot run a command here, or None when it can."""
    probe = [sys.executable, "-I", "-S", "-c", "import os; os.listdir('/proc/1')"]
    command: list[str] = []
    try:
        command = box.command(probe, View.of("/"))
        done = subprocess.run(command, stdin=subprocess.DEVNULL, capture_output=True,
                              timeout=_PROBE_TIMEOUT_S, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"{box.tool} could not be started: {exc}"
    finally:
        box.finished(command)
    if done.returncode == 0:
        return None
    said = done.stderr.decode(errors="replace").strip().splitlines()
    return said[-1] if said else f"{box.tool} exited with code {done.returncode}"


def _bwrap(tool: str, view: View) -> list[str]:
    args = [tool, "--unshare-user", "--unshare-pid", "--die-with-parent", "--new-session",
            "--ro-bind", "/", "/", "--proc", "/proc", "--dev", "/dev"]
    for device in gpu_devices():
        args += ["--dev-bind-try", device, device]
    args += ["--size", str(SHM_BYTES), "--tmpfs", "/dev/shm",
             "--size", str(TMP_BYTES), "--tmpfs", "/tmp",
             "--size", str(1 << 20), "--tmpfs", "/run"]
    for path, mode in view.binds:
        args += ["--bind" if mode == "rw" else "--ro-bind", path, path]
    return [*args, "--chdir", view.cwd, "--"]


def _launch(spec: dict[str, object]) -> list[str]:
    return [sys.executable, "-I", "-S", LAUNCHER, json.dumps(spec)]
