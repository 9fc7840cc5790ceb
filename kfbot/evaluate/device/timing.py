"""Timing inside the worker: CUDA events, L2 flushed, inputs rotated, order interleaved.

The original and the candidate are timed in the same process, alternating in a
random order each trial, so clock and thermal drift hit both alike.
"""

from __future__ import annotations

import math
import random
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

Op = Callable[..., Any]


HOLD_CYCLES = 1_000_000  # about half a millisecond of GPU time at Hopper clocks


@dataclass(frozen=True)
class TimingSettings:
    warmup: int = 3
    warmup_seconds: float = 0.5  # an idle GPU runs at a low clock until kept busy a while
    min_trials: int = 20
    max_trials: int = 200
    target_rse: float = 0.005
    max_seconds: float = 20.0


class L2Flusher:
    """Writes a buffer of twice the L2 size, so no input stays cached between trials."""

    def __init__(self) -> None:
        props = torch.cuda.get_device_properties(0)
        l2 = int(getattr(props, "L2_cache_size", 0)) or 64 * 1024 * 1024
        self.buffer = torch.empty(2 * l2 // 4, dtype=torch.float32, device="cuda")

    def flush(self) -> None:
        self.buffer.zero_()


def time_once(
    fn: Op, args: Sequence[Any], kwargs: Mapping[str, Any], flusher: L2Flusher
) -> tuple[float, Any]:
    """Microseconds of one call, between CUDA events on the current stream, and its output."""
    flusher.flush()
    start = torch.cuda.Event(enable_timing=True)
    end = torch.cuda.Event(enable_timing=True)
    # Keep the GPU busy while the host enqueues the op, so the events time the GPU work
    # and not the host's launch overhead (which varies from process to process).
    torch.cuda._sleep(HOLD_CYCLES)
    start.record()
    out = fn(*args, **kwargs)
    end.record()
    torch.cuda.synchronize()  # every stream, so work hidden on a side stream is waited for
    return float(start.elapsed_time(end)) * 1e3, out


_last_timed = -math.inf  # when this worker last timed anything (time.monotonic)
IDLE_BEFORE_WARMUP_S = 1.0


def _warm_up(fns: Mapping[str, Op], arg_sets: Sequence[tuple[list[Any], dict[str, Any]]],
             settings: TimingSettings) -> None:
    """At least `warmup` calls each; after the GPU idled, until `warmup_seconds` passed,
    so its clocks are up again before anything is timed."""
    global _last_timed
    idle = time.monotonic() - _last_timed > IDLE_BEFORE_WARMUP_S
    seconds = settings.warmup_seconds if idle else 0.0
    started, calls = time.monotonic(), 0
    while calls < settings.warmup or time.monotonic() - started < seconds:
        args, kwargs = arg_sets[calls % len(arg_sets)]
        for fn in fns.values():
            fn(*args, **kwargs)
        torch.cuda.synchronize()
        calls += 1


@dataclass
class Running:
    """The relative standard error of a growing sample, one O(1) update per value
    (Welford's method). The stopping rule reads it after every trial, with the GPU
    idle: `statistics.stdev`'s exact arithmetic over 200 samples takes about 0.15 ms,
    twice a trial, a tenth of an evaluation's time."""

    n: int = 0
    mean: float = 0.0
    m2: float = 0.0  # sum of squared deviations from the running mean

    def add(self, value: float) -> None:
        self.n += 1
        delta = value - self.mean
        self.mean += delta / self.n
        self.m2 += delta * (value - self.mean)

    def rse(self) -> float:
        if self.n < 2 or self.mean <= 0:
            return math.inf
        return math.sqrt(self.m2 / (self.n - 1) / self.n) / self.mean


# A trial's outputs by name and the index of its argument set -> None (fine), a problem,
# or a 0-dim bool tensor on the GPU (True: fine) that is read after the last trial, so
# checking costs no synchronize.
Check = Callable[[Mapping[str, Any], int], "str | torch.Tensor | None"]


@dataclass
class Timed:
    samples: dict[str, list[float]]
    mismatch: str | None = None  # what `check` said of the first timed outputs it rejected
    pending: list[tuple[int, torch.Tensor]] = field(default_factory=list)

    def settle(self) -> None:
        """Read the deferred verdicts: the first trial that failed one is the mismatch."""
        if self.pending and self.mismatch is None:
            flags = torch.stack([flag for _, flag in self.pending]).tolist()
            failed = next((trial for (trial, _), ok in zip(self.pending, flags, strict=True)
                           if not ok), None)
            if failed is not None:
                self.mismatch = (f"timed trial {failed}: an output is not within the "
                                 "tolerance of the original's")
        self.pending = []


def interleaved(
    fns: Mapping[str, Op],
    arg_sets: Sequence[tuple[list[Any], dict[str, Any]]],
    settings: TimingSettings,
    seed: int,
    check: Check | None = None,
) -> Timed:
    """Samples (µs) per named function; stops on precision, trial count or time.

    `check`, if given, sees every trial's outputs by name: an op that behaves
    differently when timed than when verified is caught on its timed outputs (a cheat
    may skip work on only some trials, so none is left out). The
    outputs of a trial are all alive until it is checked, so no op in the trial can be
    handed another's result as recycled memory.
    """
    rng = random.Random(seed)
    flusher = L2Flusher()
    _warm_up(fns, arg_sets, settings)
    timed = Timed({name: [] for name in fns})
    spread = {name: Running() for name in fns}
    started = time.monotonic()
    for trial in range(settings.max_trials):
        which = trial % len(arg_sets)
        args, kwargs = arg_sets[which]
        order = list(fns)
        rng.shuffle(order)
        outputs: dict[str, Any] = {}
        for name in order:
            micros, outputs[name] = time_once(fns[name], args, kwargs, flusher)
            timed.samples[name].append(micros)
            spread[name].add(micros)
        # Queued after the trial's wait, never during it: launching the check's kernels
        # while a timed op ran made the samples noisier on an H100 (the same candidates
        # needed 2,700 trials instead of 1,650 to reach the target precision).
        if check is not None and timed.mismatch is None:
            problem = check(outputs, which)
            if isinstance(problem, torch.Tensor):
                timed.pending.append((trial + 1, problem))
            elif problem is not None:
                timed.mismatch = f"timed trial {trial + 1}: {problem}"
        del outputs  # a deferred check's kernels are queued already: stream order holds
        if _done(spread, trial + 1, time.monotonic() - started, settings):
            break
    timed.settle()
    global _last_timed
    _last_timed = time.monotonic()
    return timed


def _done(
    spread: Mapping[str, Running], trials: int, spent: float, settings: TimingSettings
) -> bool:
    if trials < settings.min_trials:
        return False
    precise = all(r.rse() < settings.target_rse for r in spread.values())
    return precise or spent > settings.max_seconds
