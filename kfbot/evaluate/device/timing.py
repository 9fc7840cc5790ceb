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
    warmup_sets: Sequence[tuple[list[Any], dict[str, Any]]] | None = None,
    before_trial: Callable[[int, int], None] | None = None,
) -> Timed:
    """Samples (µs) per named function; stops on precision, trial count or time.

    `check`, if given, sees every trial's outputs by name: an op that behaves
    differently when timed than when verified is caught on its timed outputs (a cheat
    may skip work on only some trials, so none is left out). The
    outputs of a trial are all alive until it is checked, so no op in the trial can be
    handed another's result as recycled memory. `warmup_sets` are the warm-up's own
    inputs (default: `arg_sets`), so nothing learnt while warming up answers a timed
    call; `before_trial(trial, which)` may change the inputs of the trial's argument
    set in place before the trial (see `Swaps`).
    """
    rng = random.Random(seed)
    flusher = L2Flusher()
    _warm_up(fns, warmup_sets or arg_sets, settings)
    timed = Timed({name: [] for name in fns})
    spread = {name: Running() for name in fns}
    started = time.monotonic()
    for trial in range(settings.max_trials):
        which = trial % len(arg_sets)
        if before_trial is not None:
            before_trial(trial, which)
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


class Swaps:
    """Changes the timed inputs between trials: before about one trial in `every`, a few
    random pairs of elements of each contiguous floating input trade places. The values
    (and so their distribution and range) stay the inputs' own, the original and the
    candidate see the same change in the same trial, and an op that answers a repeated
    input from memory (computed once, or during the warm-up, and replayed by pointer or
    by a fingerprint of a few elements) returns an output that no longer fits its input.
    `dirty` collects the argument sets changed since the check last looked at them."""

    def __init__(self, arg_sets: Sequence[tuple[list[Any], dict[str, Any]]], seed: int,
                 every: int = 4, pairs: int = 8) -> None:
        self.arg_sets = arg_sets
        self.rng = random.Random(seed)
        self.every = every
        self.pairs = pairs
        self.dirty: set[int] = set()
        self.swapped = 0
        self._gen: dict[str, torch.Generator] = {}

    def __call__(self, trial: int, which: int) -> None:
        if trial < len(self.arg_sets) or self.rng.randrange(self.every):
            return  # each set's first trial is checked on the inputs it was made with
        args, kwargs = self.arg_sets[which]
        changed = False
        for t in _floating([*args, *kwargs.values()]):
            changed |= self._swap(t)
        if changed:
            self.dirty.add(which)
            self.swapped += 1

    def _swap(self, t: torch.Tensor) -> bool:
        if t.numel() < 2 or not t.is_contiguous() or t.requires_grad:
            return False
        key = str(t.device)
        if key not in self._gen:
            self._gen[key] = torch.Generator(device=t.device).manual_seed(self.rng.getrandbits(48))
        flat = t.view(-1)
        idx = torch.randint(0, flat.numel(), (2, self.pairs), generator=self._gen[key],
                            device=t.device)
        a, b = flat[idx[0]].clone(), flat[idx[1]].clone()
        flat[idx[0]] = b
        flat[idx[1]] = a
        return True


def _floating(values: Sequence[Any]) -> list[torch.Tensor]:
    out: list[torch.Tensor] = []
    for v in values:
        if isinstance(v, torch.Tensor) and v.is_floating_point():
            out.append(v)
        elif isinstance(v, (list, tuple)):
            out += _floating(list(v))
    return out
