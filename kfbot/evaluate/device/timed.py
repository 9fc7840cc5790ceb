"""The timed trials' own checks: every timed output against the original's, and the
host's wall clock against the CUDA events.

`timed_check` is handed to `timing.interleaved`; `second_timer` runs after the first
shape's trials. Both run inside the worker.
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence
from typing import Any

import torch

from kfbot.evaluate.device.answers import tensors
from kfbot.evaluate.device.probes import wall_clock_us
from kfbot.evaluate.device.timing import Check, L2Flusher
from kfbot.evaluate.device.verify import (
    Context,
    InputSet,
    Op,
    Record,
    clone,
    close_flag,
    compare_outputs,
    record,
)

# The second timer may see the candidate's GPU time as at most this much longer than
# the CUDA events did (host launch and synchronize costs vary a little between ops).
WALL_TOLERANCE = 0.25
WALL_SLACK_US = 15.0  # launchers differ by a few allocations or checks on the host
# Calls per op of the second timer: a short look first; only a disagreement pays for
# the long one, which must disagree too before it counts.
WALL_CALLS = (10, 100)


def timed_check(ctx: Context, dirty: set[int] | None = None) -> Check:
    """Each timed trial's candidate output against the original's from the same trial:
    queued on the GPU and read after the last trial (see `interleaved`). The first
    trial of each argument set is checked in full and says whether the original's
    outputs there are all finite; a later trial whose outputs are bit for bit the
    candidate's outputs of that first trial is as right as they are (one pass over the
    output), any other takes the four-pass check against the original's. A candidate
    whose outputs vary from call to call (atomics) stops paying for the comparison
    after its first miss. An argument set in `dirty` had its inputs changed since
    (`Swaps`): what was learnt of its outputs is forgotten, and learnt again."""
    finite: dict[int, bool] = {}
    # Copies, in memory the candidate never saw, so nothing it does can change them.
    first: dict[int, list[Any]] = {}

    def check(outputs: Mapping[str, Any], which: int) -> str | torch.Tensor | None:
        if dirty and which in dirty:
            dirty.discard(which)
            finite.pop(which, None)
            first.pop(which, None)
        got = tensors(outputs["candidate"])
        if which in first:
            if _bitwise_same(got, first[which]):
                return None  # a failure of the first trial is still read from its flag
            del first[which]
        flag = close_flag(outputs["candidate"], outputs["original"], ctx.overrides,
                          finite=finite.get(which, False))
        if flag is not False:
            if which not in finite:
                finite[which] = _all_finite(tensors(outputs["original"]))
                first[which] = [clone(t) for t in got]
            return flag if isinstance(flag, torch.Tensor) else None
        comps = compare_outputs(outputs["candidate"], outputs["original"], ctx.overrides,
                                ctx.block)
        bad = next((c for c in comps if not c.passed), None)
        return None if bad is None else bad.description or "mismatch"

    return check


def _bitwise_same(got: Sequence[Any], held: Sequence[Any]) -> bool:
    """Whether every output holds the same bits as the held one (a NaN is never equal,
    so an output holding one takes the tolerance check)."""
    return len(got) == len(held) and all(
        isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor)
        and a.shape == b.shape and a.dtype == b.dtype and a.device == b.device
        and torch.equal(a, b)
        for a, b in zip(got, held, strict=True))


def _all_finite(outputs: Sequence[torch.Tensor]) -> bool:
    """One synchronize per argument set: no NaN or Inf in any floating output."""
    return all(bool(t.isfinite().all()) for t in outputs if t.is_floating_point())


def second_timer(original: Op, candidate: Op, args: tuple[list[Any], dict[str, Any]],
                  entry: dict[str, Any], label: str) -> list[Record]:
    """Host wall clock around a device-wide synchronize must agree with the events.

    The host overhead of a call (launch, synchronize) is the original's wall time minus
    its event time, but never below the wall time of a one-element fill: for an original
    of milliseconds, its minimum wall time can fall tens of µs below its median event
    time (measured on H200: 2548 µs wall against 2610 µs events), and such a negative
    overhead once charged honest 20 µs candidates with 100 µs of unseen work. The
    candidate's wall time minus the overhead is the GPU time the host saw, which may
    exceed its event time by WALL_TOLERANCE + WALL_SLACK_US. A disagreement is measured
    again, longer, before it counts.
    """
    flusher = L2Flusher()
    event_o = statistics.median(entry["original_us"])
    event_c = statistics.median(entry["candidate_us"])
    scratch = torch.empty(1, device="cuda")

    def fill(*_args: Any, **_kwargs: Any) -> None:
        scratch.zero_()

    for calls in WALL_CALLS:
        wall_o, wall_c, wall_fill = wall_clock_us([original, candidate, fill], *args,
                                                  flush=flusher.flush, calls=calls)
        overhead = max(wall_o - event_o, wall_fill)
        seen = wall_c - overhead
        entry.update(wall_original_us=wall_o, wall_candidate_us=wall_c,
                     wall_overhead_us=overhead)
        if seen <= event_c * (1 + WALL_TOLERANCE) + WALL_SLACK_US:
            return []
    return [record(InputSet(label, [], {}), "original", False, "timer-disagreement",
                   error=f"the host wall clock saw {seen:.1f} µs of GPU work per call where the "
                         f"CUDA events saw {event_c:.1f} µs (original: wall {wall_o:.1f} µs, "
                         f"events {event_o:.1f} µs; host overhead taken as {overhead:.1f} µs): "
                         "work the events do not cover")]
