"""kfbot.scan.scanner: what the scan leaves behind in the process that ran it."""

from __future__ import annotations

import gc

from kfbot.scan.scanner import paused_gc


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
