"""Run jobs in an isolated, restartable worker subprocess.

Candidate code can crash, hang, corrupt the CUDA context or print without end, so it
never runs in the kfbot process. A `WorkerSession` keeps one child alive across jobs
(torch and built extensions are imported once) and turns every way a job can go wrong
into a `JobResult` value:

    with WorkerSession(gpu=0) as session:
        result = session.call("my_pkg.checks:run", {"n": 1024}, timeout_s=10.0)

Requests and answers travel over two private pipes as length-prefixed JSON (see
`main`); the child's stdout and stderr go to a file, of which each result keeps
the tail. After a timeout, crash, output flood or CUDA error the child is killed with
its whole process group and the next `call` starts a fresh one.

A session is not thread-safe: one `call` at a time.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import select
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Any, Literal

from kfbot.errors import KfbotError
from kfbot.evaluate.model import Diagnostic
from kfbot.evaluate.sandbox import confined, exit_code, python_module, untrusted_env
from kfbot.evaluate.sandbox.policy import finished
from kfbot.evaluate.sandbox.processes import has_exited, kill_group
from kfbot.evaluate.worker.main import (
    HEADER,
    MAX_FRAME_BYTES,
    PROFILE_ENV,
    RESTART_KEY,
    decode_body,
    encode_frame,
)

Status = Literal["ok", "error", "timeout", "crashed", "output_flood"]

DEFAULT_OUTPUT_CAP_BYTES = 64 * 1024 * 1024
DEFAULT_TAIL_BYTES = 8 * 1024
# Starting is separate from the job's own timeout: preloading torch can take seconds.
DEFAULT_STARTUP_TIMEOUT_S = 60.0
# How often the output file and the child are checked while waiting for an answer.
# A flood overshoots the cap by what the child writes in one tick plus the kill (tens
# of MiB at disk speed); the file is unlinked, so the space returns when we close it.
_TICK_S = 0.01
# How long a child asked to leave (request pipe closed) gets before it is killed.
_EXIT_GRACE_S = 2.0
# A process stuck in the driver may ignore SIGKILL for a while; we stop waiting then.
_REAP_TIMEOUT_S = 5.0
_READ_CHUNK = 1 << 20
_WRITE_CHUNK = 1 << 16

# Error texts (from the CUDA runtime, as torch words them) and the kind each becomes.
# Any of them retires the process: most leave the CUDA context unusable for good, and
# "oom", though not sticky, can leave cached blocks and live references behind that
# the next candidate would be measured against.
CUDA_ERROR_KINDS: tuple[tuple[str, str], ...] = (
    ("illegal memory access", "illegal_address"),
    ("out of memory", "oom"),
    ("unspecified launch failure", "launch_failure"),
    ("misaligned address", "misaligned_address"),
    ("device-side assert", "device_assert"),
    ("illegal instruction was encountered", "illegal_instruction"),
)
CUDA_KINDS = frozenset(kind for _, kind in CUDA_ERROR_KINDS)

_SIGNAL_KINDS: dict[int, str] = {
    signal.SIGSEGV: "segfault",
    signal.SIGABRT: "abort",
    signal.SIGKILL: "killed",
    signal.SIGBUS: "bus_error",
    signal.SIGFPE: "fpe",
    signal.SIGILL: "sigill",
}


@dataclass(frozen=True)
class JobResult:
    """What became of one job; `value` is the job's dict when `status` is "ok"."""

    status: Status
    value: dict[str, Any] | None
    kind: str  # "ok", "exception", "timeout", "segfault", "illegal_address", "oom", ...
    reason: str  # one line a person can read
    output_tail: str = ""  # the end of what the job wrote to stdout/stderr
    duration_s: float = 0.0
    traceback: str = ""  # the job's frames, when it raised

    @property
    def ok(self) -> bool:
        return self.status == "ok"

    def diagnostic(self) -> Diagnostic | None:
        """The failure as a runtime `Diagnostic`; None for a job that succeeded."""
        if self.ok:
            return None
        details = [("status", self.status), ("duration_s", f"{self.duration_s:.3f}")]
        if self.traceback:
            details.append(("traceback", self.traceback))
        if self.output_tail:
            details.append(("output_tail", self.output_tail[-2000:]))
        return Diagnostic("runtime", self.kind, self.reason, details=tuple(details))


def cuda_error_kind(text: str) -> str | None:
    """The CUDA failure kind named in `text` (an exception or output), if any."""
    lowered = text.lower()
    for needle, kind in CUDA_ERROR_KINDS:
        if needle in lowered:
            return kind
    return None


def signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"


def _size_text(size: int) -> str:
    if size >= 1024 * 1024:
        return f"{size / (1024 * 1024):.1f} MiB"
    return f"{size / 1024:.1f} KiB"


def _first_line(text: str, limit: int = 300) -> str:
    line = text.strip().splitlines()[0] if text.strip() else ""
    return line if len(line) <= limit else line[: limit - 3] + "..."


def _last_line(text: str) -> str:
    lines = [line for line in text.splitlines() if line.strip()]
    return _first_line(lines[-1]) if lines else ""


class _ProtocolError(Exception):
    """The result channel carried something that is not a frame we sent ourselves."""


class _FrameReader:
    """Reassembles frames from the bytes the non-blocking result pipe hands over."""

    def __init__(self) -> None:
        self._buffer = bytearray()

    @property
    def pending(self) -> int:
        return len(self._buffer)

    def feed(self, data: bytes) -> None:
        self._buffer += data

    def pop(self) -> dict[str, Any] | None:
        """The next complete message, or None while it is still arriving."""
        if len(self._buffer) < HEADER.size:
            return None
        (size,) = HEADER.unpack_from(self._buffer)
        if size > MAX_FRAME_BYTES:
            raise _ProtocolError(f"a frame announced {size} bytes")
        end = HEADER.size + size
        if len(self._buffer) < end:
            return None
        body = bytes(self._buffer[HEADER.size : end])
        del self._buffer[:end]
        try:
            return decode_body(body)
        except ValueError as exc:
            raise _ProtocolError(f"unreadable frame: {exc}") from None


@dataclass
class _Child:
    """One live worker process and our ends of its pipes (mutable: it is live state)."""

    proc: subprocess.Popen[bytes]
    requests_fd: int
    results_fd: int
    output_fd: int
    argv: list[str] = field(default_factory=list)  # as confined: what `finished` needs
    reader: _FrameReader = field(default_factory=_FrameReader)


@dataclass(frozen=True)
class _Outcome:
    """How waiting on the child ended."""

    event: Literal["message", "timeout", "flood", "exited", "protocol"]
    message: dict[str, Any] | None = None
    detail: str = ""


def _output_file() -> int:
    """An anonymous file for the child's stdout/stderr, appended to so it can be emptied.

    With O_APPEND the child's writes land at the current end, so truncating the file
    between jobs really starts it over instead of leaving a hole.
    """
    fd, path = tempfile.mkstemp(prefix="kfbot-worker-", suffix=".out")
    os.unlink(path)
    fcntl.fcntl(fd, fcntl.F_SETFL, fcntl.fcntl(fd, fcntl.F_GETFL) | os.O_APPEND)
    return fd


def _next_message(child: _Child) -> _Outcome | None:
    """The next whole message the child sent, a protocol error, or None while none is in."""
    try:
        message = child.reader.pop()
    except _ProtocolError as exc:
        return _Outcome("protocol", detail=str(exc))
    return None if message is None else _Outcome("message", message)


def _read_available(fd: int) -> tuple[bytes, bool]:
    """What the non-blocking pipe holds now, and whether the writer has closed it."""
    chunks: list[bytes] = []
    for _ in range(16):  # bounded, so a chatty channel cannot starve the other checks
        try:
            chunk = os.read(fd, _READ_CHUNK)
        except BlockingIOError:
            break
        if not chunk:
            return b"".join(chunks), True
        chunks.append(chunk)
    return b"".join(chunks), False


class WorkerSession:
    """One restartable worker process that runs jobs `(func_ref, payload)` in turn.

    `gpu` becomes CUDA_VISIBLE_DEVICES; `env` adds variables (secrets are dropped);
    `python_path` entries go in front of PYTHONPATH; `cwd` is the child's working
    directory, which `python -m` also puts first on its import path; `preload` names
    modules imported once at startup (e.g. "torch"), under `startup_timeout_s` rather
    than the first job's timeout. The child runs in the sandbox, which shows it `cwd`,
    `python_path` and `readable` (the folders of the builds it will load) read-only, and
    lets it write `writable` (folders that exist when it starts).
    """

    def __init__(
        self,
        *,
        gpu: int | str | None = None,
        env: Mapping[str, str] | None = None,
        python_path: Sequence[str | Path] = (),
        cwd: str | Path | None = None,
        preload: Sequence[str] = (),
        output_cap_bytes: int = DEFAULT_OUTPUT_CAP_BYTES,
        tail_bytes: int = DEFAULT_TAIL_BYTES,
        startup_timeout_s: float = DEFAULT_STARTUP_TIMEOUT_S,
        python: str = sys.executable,
        readable: Sequence[str | Path] = (),
        writable: Sequence[str | Path] = (),
    ) -> None:
        self._env = self._child_env(gpu, env, python_path)
        self._cwd = None if cwd is None else str(cwd)
        self._readable = tuple(readable)
        self._writable = tuple(writable)
        self._preload = tuple(preload)
        self._output_cap = output_cap_bytes
        self._tail_bytes = tail_bytes
        self._startup_timeout_s = startup_timeout_s
        self._python = python
        self._child: _Child | None = None

    def __enter__(self) -> WorkerSession:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    @property
    def pid(self) -> int | None:
        """The live child's pid, or None before the first job and after a failure."""
        return None if self._child is None else self._child.proc.pid

    def close(self) -> None:
        """Ask the child to leave, then kill what is left of its process group."""
        self._stop(graceful=True)

    def call(self, func_ref: str, payload: Mapping[str, Any], timeout_s: float) -> JobResult:
        """Run `func_ref(payload)` in the child; every outcome is a `JobResult`.

        Raises KfbotError only for the caller's own mistakes: a payload that is not
        JSON-able or a timeout that is not positive.
        """
        frame = _request_frame(func_ref, payload)
        if not timeout_s > 0:
            raise KfbotError(f"job timeout must be positive, got {timeout_s}")
        child = self._ready_child()
        if isinstance(child, JobResult):
            return child
        os.ftruncate(child.output_fd, 0)  # each result's tail is its own job's output
        started = time.monotonic()
        outcome = self._wait(child, started + timeout_s, frame)
        duration = time.monotonic() - started
        result, restart = self._job_result(child, outcome, duration, timeout_s)
        if restart or child.reader.pending:
            self._stop(graceful=False)  # leftover bytes mean the channel is not ours alone
            result = self._described_exit(result, child)
        return result

    # -- starting and stopping ---------------------------------------------------

    @staticmethod
    def _child_env(
        gpu: int | str | None, extra: Mapping[str, str] | None, python_path: Sequence[str | Path]
    ) -> dict[str, str]:
        env = untrusted_env(extra)
        env["PYTHONUNBUFFERED"] = "1"  # output reaches the file in time to be in the tail
        if gpu is not None:
            env["CUDA_VISIBLE_DEVICES"] = str(gpu)
        if python_path:
            old = [env["PYTHONPATH"]] if env.get("PYTHONPATH") else []
            env["PYTHONPATH"] = os.pathsep.join([*(str(p) for p in python_path), *old])
        return env

    def _spawn(self) -> _Child:
        requests_r, requests_w = os.pipe()
        results_r, results_w = os.pipe()
        output_fd = _output_file()
        command = python_module(self._python, "kfbot.evaluate.worker.main")
        command += ["--requests", str(requests_r), "--results", str(results_w)]
        for module in self._preload:
            command += ["--preload", module]
        # In the sandbox it writes nothing but its private /tmp and home, `writable` and
        # profiles when asked for: what it loads is kfbot's builds, what it says goes by
        # the pipes.
        profiles = [self._env[PROFILE_ENV]] if self._env.get(PROFILE_ENV) else []
        command = confined(command, self._cwd or os.getcwd(), [*self._writable, *profiles],
                           self._readable, self._env)
        try:
            proc = subprocess.Popen(
                command,
                stdin=subprocess.DEVNULL,
                stdout=output_fd,
                stderr=output_fd,
                pass_fds=(requests_r, results_w),
                start_new_session=True,  # one process group to kill, grandchildren too
                env=self._env,
                cwd=self._cwd,
            )
        except BaseException:
            for fd in (requests_w, results_r, output_fd):
                os.close(fd)
            raise
        finally:
            os.close(requests_r)
            os.close(results_w)
        os.set_blocking(requests_w, False)
        os.set_blocking(results_r, False)
        return _Child(proc, requests_w, results_r, output_fd, command)

    def _ready_child(self) -> _Child | JobResult:
        """The live child, started if needed; a startup failure comes back as a result."""
        if self._child is not None and (has_exited(self._child.proc) or self._idle_flood()):
            # It died, or something it left running kept writing, between jobs: not the
            # next job's fault, so that job gets a fresh process instead of the blame.
            self._stop(graceful=False)
        if self._child is not None:
            return self._child
        return self._start()

    def _idle_flood(self) -> bool:
        child = self._child
        return child is not None and os.fstat(child.output_fd).st_size > self._output_cap

    def _start(self) -> _Child | JobResult:
        started = time.monotonic()
        try:
            child = self._spawn()
        except OSError as exc:
            reason = f"worker failed to start: cannot run {self._python}: {exc}"
            return JobResult("crashed", None, "startup", reason)
        self._child = child
        outcome = self._wait(child, started + self._startup_timeout_s, b"")
        message = outcome.message or {}
        if outcome.event == "message" and message.get("type") == "ready":
            return child
        tail = self._tail(child)
        self._stop(graceful=False)
        reason = f"worker failed to start: {self._startup_problem(outcome, child, tail)}"
        return JobResult("crashed", None, "startup", reason, tail, time.monotonic() - started)

    def _startup_problem(self, outcome: _Outcome, child: _Child, tail: str) -> str:
        if outcome.event == "timeout":
            return f"no answer within {self._startup_timeout_s:.1f} s"
        if outcome.event == "flood":
            return f"wrote more than {_size_text(self._output_cap)} while starting"
        if outcome.event == "exited":
            code = None if child.proc.returncode is None else exit_code(child.proc.returncode)
            how = f"died with {signal_name(-code)}" if code and code < 0 else f"exit code {code}"
            return f"{how}: {_last_line(tail) or 'no output'}"
        return outcome.detail or f"unexpected first message {outcome.message!r:.100}"

    def _stop(self, *, graceful: bool) -> None:
        child, self._child = self._child, None
        if child is None:
            return
        os.close(child.requests_fd)  # end of requests: a healthy child exits by itself
        if graceful:
            deadline = time.monotonic() + _EXIT_GRACE_S
            while not has_exited(child.proc) and time.monotonic() < deadline:
                time.sleep(_TICK_S)
        kill_group(child.proc)  # the child if it lingers, and whatever it left running
        # A process stuck in the kernel cannot be helped from here; stop waiting for it.
        with contextlib.suppress(subprocess.TimeoutExpired):
            child.proc.wait(timeout=_REAP_TIMEOUT_S)
        finished(child.argv)  # what left the group (a separate user's setsid daemons)
        os.close(child.results_fd)
        os.close(child.output_fd)

    # -- waiting and reading -----------------------------------------------------

    def _wait(self, child: _Child, deadline: float, request: bytes) -> _Outcome:
        """Send `request` and wait for one message, watching time, output and the child."""
        poller = select.poll()
        poller.register(child.results_fd, select.POLLIN)
        unsent = memoryview(request)
        if unsent:
            poller.register(child.requests_fd, select.POLLOUT)
        while True:
            read = _next_message(child)
            if read is not None:
                return read
            if os.fstat(child.output_fd).st_size > self._output_cap:
                return _Outcome("flood")
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return _Outcome("timeout")
            closed = False
            for fd, _ in poller.poll(min(remaining, _TICK_S) * 1000):
                if fd == child.results_fd:
                    data, closed = _read_available(fd)
                    child.reader.feed(data)
                elif unsent:
                    unsent = _send_some(fd, unsent)
                    if not unsent:
                        poller.unregister(fd)
            if closed or has_exited(child.proc):
                return self._after_exit(child, closed)

    def _after_exit(self, child: _Child, closed: bool) -> _Outcome:
        """The child exited or closed the channel: read what it managed to send."""
        if not closed:
            data, closed = _read_available(child.results_fd)
            child.reader.feed(data)
        read = _next_message(child)
        if read is not None:
            return read
        deadline = time.monotonic() + _EXIT_GRACE_S
        while not has_exited(child.proc) and time.monotonic() < deadline:
            time.sleep(_TICK_S)
        if not has_exited(child.proc):
            return _Outcome("protocol", detail="the worker closed its result channel")
        return _Outcome("exited")

    def _tail(self, child: _Child) -> str:
        size = os.fstat(child.output_fd).st_size
        start = max(0, size - self._tail_bytes)
        return os.pread(child.output_fd, size - start, start).decode("utf-8", "replace")

    # -- turning outcomes into results ---------------------------------------------

    def _job_result(
        self, child: _Child, outcome: _Outcome, duration: float, timeout_s: float
    ) -> tuple[JobResult, bool]:
        """The result, and whether the child must be replaced before the next job."""
        tail = self._tail(child)
        if outcome.event == "message" and outcome.message is not None:
            return _answer_result(outcome.message, tail, duration)
        if outcome.event == "timeout":
            reason = f"killed after {timeout_s:.1f} s timeout"
            return JobResult("timeout", None, "timeout", reason, tail, duration), True
        if outcome.event == "flood":
            reason = f"killed after writing more than {_size_text(self._output_cap)} of output"
            return JobResult("output_flood", None, "output_flood", reason, tail, duration), True
        if outcome.event == "protocol":
            reason = f"worker broke the result channel: {outcome.detail}"
            return JobResult("crashed", None, "protocol", reason, tail, duration), True
        # "exited": the kind and reason need the exit status, known once it is reaped.
        return JobResult("crashed", None, "exited", "", tail, duration), True

    def _described_exit(self, result: JobResult, child: _Child) -> JobResult:
        """Fill in how a child that died during the job died (it is reaped by now)."""
        if result.status != "crashed" or result.kind != "exited":
            return result
        code = None if child.proc.returncode is None else exit_code(child.proc.returncode)
        cuda = cuda_error_kind(result.output_tail)
        if code is not None and code < 0:
            kind = cuda or _SIGNAL_KINDS.get(-code, "signal")
            reason = f"worker died with {signal_name(-code)}"
        else:
            kind = cuda or "exited"
            reason = f"worker exited with code {code} during the job"
        if cuda:
            reason += f" after a CUDA error ({cuda})"
        return JobResult("crashed", None, kind, reason, result.output_tail, result.duration_s)


def _request_frame(func_ref: str, payload: Mapping[str, Any]) -> bytes:
    try:
        return encode_frame({"type": "job", "func": func_ref, "payload": dict(payload)})
    except (TypeError, ValueError) as exc:
        raise KfbotError(f"the payload for job {func_ref} is not JSON-able: {exc}") from None


def _send_some(fd: int, unsent: memoryview) -> memoryview:
    """Write what the request pipe takes now; a dead reader leaves nothing to send."""
    try:
        written = os.write(fd, unsent[:_WRITE_CHUNK])
    except BlockingIOError:
        return unsent
    except BrokenPipeError:
        return unsent[len(unsent) :]  # the child is gone; waiting will notice
    return unsent[written:]


def _answer_result(message: dict[str, Any], tail: str, duration: float) -> tuple[JobResult, bool]:
    """The result for an answer from the child, and whether the child must be replaced."""
    kind = message.get("type")
    if kind == "result" and isinstance(message.get("value"), dict):
        value: dict[str, Any] = message["value"]
        restart = value.pop(RESTART_KEY, False) is True
        reason = f"finished in {duration:.2f} s"
        return JobResult("ok", value, "ok", reason, tail, duration), restart
    if kind == "error":
        return _error_result(message, tail, duration)
    reason = f"worker broke the result channel: unexpected message {message!r:.100}"
    return JobResult("crashed", None, "protocol", reason, tail, duration), True


def _error_result(message: dict[str, Any], tail: str, duration: float) -> tuple[JobResult, bool]:
    """A job that raised; a CUDA error poisons the context, so the child is replaced."""
    exc_type = str(message.get("exc_type", "Exception"))
    text = str(message.get("message", ""))
    kind = str(message.get("kind", "exception"))
    cuda = (cuda_error_kind(text) or cuda_error_kind(tail)) if kind == "exception" else None
    reason = f"{exc_type}: {_first_line(text)}" if text.strip() else exc_type
    trace = str(message.get("traceback", ""))
    result = JobResult("error", None, cuda or kind, reason, tail, duration, trace)
    return result, cuda is not None


def run_job(
    func_ref: str,
    payload: Mapping[str, Any],
    timeout_s: float,
    gpu: int | str | None = None,
    *,
    env: Mapping[str, str] | None = None,
    python_path: Sequence[str | Path] = (),
    cwd: str | Path | None = None,
) -> JobResult:
    """One job in a fresh worker that is gone when this returns."""
    with WorkerSession(gpu=gpu, env=env, python_path=python_path, cwd=cwd) as session:
        return session.call(func_ref, payload, timeout_s)
