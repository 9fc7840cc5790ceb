"""Ending a run early without losing it: a signal (a CI job's timeout sends SIGTERM,
Ctrl-C SIGINT) or the hard end of the time limit.

    with stop_on(limit_s=600, started=t0, on_stop=builder.stop):
        outcome = optimize(...)    # writes what is verified so far, then says it stopped

Inside the block, each of these raises `RunStopped` in the main thread, wherever it
waits (a GPU job, a build): the search catches it, writes the report of what it has
verified and hands the reason back, and the command exits non-zero. `on_stop` runs
first, from the handler, and kills what runs in other threads (the compilers), so
that nothing keeps the run alive after its report. A second signal does what the
signal does by default: a person who presses Ctrl-C twice means it.
"""

from __future__ import annotations

import signal
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from types import FrameType

from kfbot.errors import EXIT_FAILURE

STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)
TIME_LIMIT = "time limit"


class RunStopped(BaseException):
    """The run must end now. A BaseException, as KeyboardInterrupt is, so that no
    `except Exception` on the way up takes it for a failure of its own."""

    def __init__(self, reason: str, exit_code: int, where: str = "") -> None:
        super().__init__(reason)
        self.reason = reason
        self.exit_code = exit_code
        self.where = where  # kfbot's code the stop came in, for a stop no step caught


def _where(frame: FrameType | None) -> str:
    """The innermost of kfbot's own frames (`kfbot/search/variants.py:88 in time_all`)."""
    while frame is not None:
        name = frame.f_code.co_filename.replace("\\", "/")
        if "/kfbot/" in name and not name.endswith("/stopping.py"):
            short = "kfbot/" + name.rsplit("/kfbot/", 1)[1]
            return f"{short}:{frame.f_lineno} in {frame.f_code.co_name}"
        frame = frame.f_back
    return ""


class _State:
    """While a report is written, a stop waits for it (`shielded`)."""

    shields = 0
    pending: RunStopped | None = None


@contextmanager
def stop_on(limit_s: float | None = None, started: float | None = None,
            on_stop: Callable[[], None] | None = None) -> Iterator[None]:
    """SIGTERM, SIGINT and, with `limit_s`, the limit counted from `started` (default:
    now) raise `RunStopped` inside the block. Outside the main thread nothing is
    installed (Python delivers signals to the main thread only)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    fired: list[bool] = []

    def handler(signum: int, frame: FrameType | None) -> None:
        if fired:
            return  # already stopping
        fired.append(True)
        for number in STOP_SIGNALS:  # a second signal does what it does by default
            signal.signal(number, signal.SIG_DFL)
        if on_stop is not None:
            on_stop()
        if signum == signal.SIGALRM:
            stop = RunStopped(f"the {TIME_LIMIT} ({limit_s:g} s) was reached", EXIT_FAILURE,
                              _where(frame))
        else:
            stop = RunStopped(f"{signal.Signals(signum).name} received", 128 + signum,
                              _where(frame))
        if _State.shields:
            _State.pending = stop
            return
        raise stop

    saved = {number: signal.signal(number, handler) for number in (*STOP_SIGNALS,
                                                                   signal.SIGALRM)}
    if limit_s is not None:
        left = limit_s - (time.monotonic() - (started if started is not None else
                                              time.monotonic()))
        signal.setitimer(signal.ITIMER_REAL, max(left, 0.001))
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        for number, previous in saved.items():
            signal.signal(number, previous)


@contextmanager
def shielded() -> Iterator[None]:
    """Write something whole (a report) before a stop that comes meanwhile is raised.
    The time limit, reached while the run's result is being written, is dropped: the
    run is finished. A signal is raised once the block is done."""
    _State.shields += 1
    try:
        yield
    finally:
        _State.shields -= 1
    stop, _State.pending = _State.pending, None
    if stop is not None and _State.shields == 0 and TIME_LIMIT not in stop.reason:
        raise stop


def call_all(functions: list[Callable[[], None]]) -> None:
    for function in functions:
        function()
