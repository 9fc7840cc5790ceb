"""The worker child: `kfbot.evaluate.worker.main --requests FD --results FD`, run as
`__main__` by the parent's bootstrap (`worker/session.py`).

It runs candidate code, so it is the only process that ever imports it. It reads
length-prefixed JSON requests from one inherited pipe and answers each on another;
stdout and stderr belong to the candidate (the parent sends them to a file), so
nothing a job prints can be mistaken for an answer.

Only the standard library is imported here: the parent imports the framing helpers
from this module, and a child that fails to import its own entry point cannot report
anything.
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import faulthandler
import importlib
import json
import os
import struct
import sys
import traceback
from collections.abc import Callable, Sequence
from typing import Any

# Frames are an 8-byte big-endian length then that many bytes of UTF-8 JSON.
HEADER = struct.Struct(">Q")
# A frame longer than this is a corrupted channel, not a result worth the memory.
MAX_FRAME_BYTES = 256 * 1024 * 1024
# A job that sets this key to true in its result asks for a fresh process before the
# next job (it caught a sticky CUDA error itself, or left global state behind).
RESTART_KEY = "_restart_worker"
# Enough traceback to find the failing line without flooding a report.
TRACEBACK_LINES = 20
TRACEBACK_CHARS = 4000


def encode_frame(message: dict[str, Any]) -> bytes:
    """One message as a frame; raises ValueError/TypeError if it is not JSON-able."""
    body = json.dumps(message, allow_nan=True).encode("utf-8")
    return HEADER.pack(len(body)) + body


def decode_body(body: bytes) -> dict[str, Any]:
    """The message in a frame body; ValueError unless it is a JSON object."""
    message = json.loads(body.decode("utf-8"))
    if not isinstance(message, dict):
        raise ValueError(f"frame holds {type(message).__name__}, not an object")
    return message


def _read_exactly(fd: int, size: int) -> bytes | None:
    """`size` bytes from `fd`, or None at end of file (the parent went away)."""
    chunks: list[bytes] = []
    left = size
    while left > 0:
        chunk = os.read(fd, min(left, 1 << 20))
        if not chunk:
            return None
        chunks.append(chunk)
        left -= len(chunk)
    return b"".join(chunks)


def read_frame(fd: int) -> dict[str, Any] | None:
    """The next message on a blocking fd; None when the writer closed it."""
    header = _read_exactly(fd, HEADER.size)
    if header is None:
        return None
    (size,) = HEADER.unpack(header)
    if size > MAX_FRAME_BYTES:
        raise ValueError(f"request frame of {size} bytes is over the limit")
    body = _read_exactly(fd, size)
    return None if body is None else decode_body(body)


def write_frame(fd: int, frame: bytes) -> None:
    """Send a whole frame, looping because a pipe accepts at most its buffer at once."""
    view = memoryview(frame)
    while view:
        written = os.write(fd, view)
        view = view[written:]


def resolve(func_ref: str) -> Callable[..., Any]:
    """The callable named by "package.module:function" (the function may be dotted)."""
    module_name, sep, qualname = func_ref.partition(":")
    if not sep or not module_name or not qualname:
        raise LookupError(f"{func_ref!r} is not of the form 'package.module:function'")
    target: Any = importlib.import_module(module_name)
    for part in qualname.split("."):
        target = getattr(target, part)
    if not callable(target):
        raise LookupError(f"{func_ref} is a {type(target).__name__}, not a callable")
    return target  # type: ignore[no-any-return]


def short_traceback(exc: BaseException) -> str:
    """The job's frames only: the leading frames are this module's, which say nothing."""
    tb = exc.__traceback__
    while tb is not None and tb.tb_frame.f_code.co_filename == __file__:
        tb = tb.tb_next
    lines = traceback.format_exception(type(exc), exc, tb)
    text = "".join(lines).splitlines()[-TRACEBACK_LINES:]
    return "\n".join(text)[-TRACEBACK_CHARS:]


def _exception_text(exc: BaseException) -> str:
    # A candidate's exception may even fail to print; that must not kill the worker.
    try:
        return str(exc)
    except Exception:  # anything from untrusted __str__
        return f"<unprintable {type(exc).__name__}>"


def error_message(kind: str, exc: BaseException) -> dict[str, Any]:
    """The answer for a job that raised, or whose reference or result was unusable."""
    return {
        "type": "error",
        "kind": kind,
        "exc_type": type(exc).__name__,
        "message": _exception_text(exc),
        "traceback": short_traceback(exc),
    }


def _flush_output() -> None:
    """Push buffered job output to the file before answering, so the tail is complete."""
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(OSError, ValueError):  # a job may have closed them
            stream.flush()
    # C extensions print through libc's own buffers, which Python's flush misses.
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None).fflush(None)


def run_job(request: dict[str, Any]) -> dict[str, Any]:
    """Run one request and build its answer; never raises for anything the job does."""
    try:
        func = resolve(str(request.get("func")))
    except BaseException as exc:  # an import may raise anything
        return error_message("bad_ref", exc)
    try:
        value = _profiled(func, request.get("payload", {}))
    except BaseException as exc:  # SystemExit from a job is a job error
        return error_message("exception", exc)
    if not isinstance(value, dict):
        problem = TypeError(f"job returned {type(value).__name__}, expected a dict")
        return error_message("bad_result", problem)
    return {"type": "result", "value": value}


# Set to a folder, each job's Python profile is written there (`<pid>-<n>.prof`, read
# with `python -m pstats`): where a worker's time goes, down to the function.
PROFILE_ENV = "KFBOT_WORKER_PROFILE"
_profiled_jobs = 0


def _profiled(func: Callable[..., Any], payload: Any) -> Any:
    folder = os.environ.get(PROFILE_ENV)
    if not folder:
        return func(payload)
    import cProfile

    global _profiled_jobs
    _profiled_jobs += 1
    profile = cProfile.Profile()
    try:
        return profile.runcall(func, payload)
    finally:
        os.makedirs(folder, exist_ok=True)
        profile.dump_stats(os.path.join(folder, f"{os.getpid()}-{_profiled_jobs}.prof"))


def answer_frame(answer: dict[str, Any]) -> bytes:
    """`answer` as a frame, or an error frame if its value cannot be sent as JSON."""
    try:
        return encode_frame(answer)
    except Exception as exc:  # TypeError, ValueError (cycles), RecursionError (depth)
        return encode_frame(error_message("bad_result", exc))


def serve(requests_fd: int, results_fd: int) -> int:
    """Answer requests until the parent closes the request pipe."""
    write_frame(results_fd, encode_frame({"type": "ready", "pid": os.getpid()}))
    while True:
        request = read_frame(requests_fd)
        if request is None:
            return 0
        frame = answer_frame(run_job(request))
        _flush_output()
        write_frame(results_fd, frame)


def _parse_args(argv: Sequence[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="kfbot.evaluate.worker.main")
    parser.add_argument("--requests", type=int, required=True)
    parser.add_argument("--results", type=int, required=True)
    parser.add_argument("--preload", action="append", default=[])
    return parser.parse_args(list(argv))


def main(argv: Sequence[str] | None = None) -> int:
    args = _parse_args(sys.argv[1:] if argv is None else argv)
    # Processes a job starts must not hold the channel: a leftover grandchild keeping
    # the result pipe open would hide this process's death from the parent.
    os.set_inheritable(args.requests, False)
    os.set_inheritable(args.results, False)
    # A segfault then leaves a Python stack in the output tail; the signal still kills us.
    faulthandler.enable()
    for module in args.preload:
        importlib.import_module(module)  # a failure here is a startup failure, on stderr
    return serve(args.requests, args.results)


if __name__ == "__main__":
    sys.exit(main())
