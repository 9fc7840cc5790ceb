"""kfbot.scan.scanner: what the scan leaves behind in the process that ran it."""

from __future__ import annotations

import gc
import os
import signal

import pytest

from kfbot.scan.scanner import _start_pool, paused_gc


def test_paused_gc_restores_the_collector_without_a_walk_of_what_it_made() -> None:
    assert gc.isenabled()
    with paused_gc():
        assert not gc.isenabled()
        made = [[i] for i in range(1000)]
    assert gc.isenabled()
    # Left in the youngest generation, they would all be walked by its next collection
    # (which the first allocation starts) and again by the middle one's.
    young = {id(o) for generation in (0, 1) for o in gc.get_objects(generation=generation)}
    assert not any(id(o) in young for o in made)
    oldest = {id(o) for o in gc.get_objects(generation=2)}
    assert all(id(o) in oldest for o in made)  # still collected, by a full collection


def test_paused_gc_leaves_a_disabled_collector_disabled() -> None:
    gc.disable()
    try:
        with paused_gc():
            pass
        assert not gc.isenabled()
    finally:
        gc.enable()


def _unwind(signum: int, frame: object) -> None:
    raise KeyboardInterrupt  # as the CLI's SIGTERM handler does


def _sigterm_action(_: int) -> tuple[int, object]:
    return os.getpid(), signal.getsignal(signal.SIGTERM)


@pytest.mark.skipif(not hasattr(os, "fork"), reason="the pool forks its workers")
def test_pool_workers_end_on_sigterm_whatever_handler_the_scan_ran_under() -> None:
    # Inherited, a handler that unwinds lets a worker die holding the task queue's lock
    # on `terminate`: the other worker then blocks on it and the scan never returns.
    previous = signal.signal(signal.SIGTERM, _unwind)
    try:
        pool = _start_pool(2)
    finally:
        signal.signal(signal.SIGTERM, previous)
    workers = list(pool._pool)  # type: ignore[attr-defined]
    actions = dict(pool.map(_sigterm_action, range(8), chunksize=1))
    pool.terminate()
    assert set(actions.values()) == {signal.SIG_DFL}
    # Ended by the signal, or by the sentinel `terminate` also queues: none unwound.
    assert {w.exitcode for w in workers} <= {0, -signal.SIGTERM}
