"""Compute a string in a forked child process while this one does other work.

For work that reads a large structure already in memory, such as writing half of a
report: the child sees the structure as it is, where a process pool would first have
to pickle it. Where fork is missing, or the child fails, the work is done in this
process instead, so an error is raised here, with its traceback.

Only the forking thread runs in the child: the work must need no lock another thread
may hold (pure computation, as here, does not). `fork_safe()` tells a caller whose
children do more (a pool's workers wait on its queue's lock) whether a native thread
of a library could be holding one.
"""

from __future__ import annotations

import os
import signal
from collections.abc import Callable
from types import TracebackType
from typing import NoReturn


class Forked:
    """`with Forked(work) as child: ...; text = child.result()`.

    The child is started on entering; leaving the block without asking for the result
    stops it, so no process outlives the block.
    """

    def __init__(self, work: Callable[[], str]) -> None:
        self.work = work
        self._pid: int | None = None
        self._pipe = -1

    def __enter__(self) -> Forked:
        if hasattr(os, "fork"):
            read_end, write_end = os.pipe()
            pid = os.fork()
            if pid == 0:
                _child(self.work, read_end, write_end)
            os.close(write_end)
            self._pid, self._pipe = pid, read_end
        return self

    def result(self) -> str:
        if self._pid is None:
            return self.work()
        pipe, self._pipe = os.fdopen(self._pipe, "rb"), -1  # the file object closes it
        with pipe:
            data = pipe.read()
        _, status = os.waitpid(self._pid, 0)
        self._pid = None
        return data.decode() if status == 0 else self.work()

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        if self._pipe >= 0:
            os.close(self._pipe)
            self._pipe = -1
        if self._pid is not None:  # the result was not asked for, or not read to the end
            os.kill(self._pid, signal.SIGKILL)
            os.waitpid(self._pid, 0)
            self._pid = None


def _child(work: Callable[[], str], read_end: int, write_end: int) -> NoReturn:
    """Write what `work` returns to the pipe and exit: never return into the caller's
    code, nor run its clean-up (os._exit), whatever happens."""
    status = 1
    try:
        os.close(read_end)
        with os.fdopen(write_end, "wb") as pipe:
            pipe.write(work().encode())
        status = 0
    finally:
        os._exit(status)


def fork_safe() -> bool:
    """Whether every thread of this process is one `threading` knows of (Linux counts the
    native ones too): a library's native threads (a cluster client's) may hold a lock
    at any moment, Python's own threads hold none of the ones the child needs."""
    import threading
    try:
        return len(os.listdir("/proc/self/task")) <= threading.active_count()
    except OSError:
        return True
