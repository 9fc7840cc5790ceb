"""A second timing path, written apart from `timing`: what `kfbot reproduce` times with.

Both timers measure the same thing, one call's GPU time with the L2 cold, so their
medians should agree; they share no code and differ in how they get there:

- the search's timer holds the GPU with a spin kernel before each call, shuffles the
  order of the ops every trial and waits after every call;
- this one lets the L2 flush itself hold the GPU: the flush (a read of more than the
  L2) is queued right before each timed call, so the GPU is busy while the host
  launches the op and the events see GPU time only. The ops alternate in a fixed
  ABBA order, a whole batch of calls is queued before the host waits once, and the
  events are read afterwards. It stops when the median of every op has settled.

torch is imported here: this module runs inside the worker only.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from kfbot.evaluate.capture.signature import CallSignature
from kfbot.evaluate.device.verify import InputSet
from kfbot.evaluate.inputs.fresh import make_args

Op = Callable[..., Any]
Args = tuple[list[Any], dict[str, Any]]
FLUSH_FACTOR = 2.5  # times the L2 size written before every call


@dataclass(frozen=True)
class RetimeSettings:
    batch: int = 16  # calls of each op queued before the host waits
    min_calls: int = 64
    max_calls: int = 400
    max_seconds: float = 4.0  # per shape
    settle: float = 0.002  # the medians moved less than this (relative) in a batch
    warmup_seconds: float = 0.3


class _Flush:
    """Reads more than the L2 holds, so the timed call finds it cold and clean.

    A write flush leaves the L2 full of dirty lines that the timed call must write
    back to make room: on an H200 that added the same ~15 µs to both ops of a 64 MB
    elementwise kernel and pulled a 1.57x speedup down to 1.29x, where the search's
    timer (whose zero fill Hopper writes back cheaply) saw 1.57x. A read leaves clean
    lines, which are dropped for free, and also evicts the previous call's outputs."""

    def __init__(self) -> None:
        props = torch.cuda.get_device_properties(torch.cuda.current_device())
        l2 = int(getattr(props, "L2_cache_size", 0)) or 64 * 1024 * 1024
        self.buffer = torch.ones(int(FLUSH_FACTOR * l2) // 4, dtype=torch.int32, device="cuda")
        self.total = torch.zeros((), dtype=torch.int64, device="cuda")

    def __call__(self) -> None:
        torch.sum(self.buffer, 0, dtype=torch.int64, out=self.total)


def measure(ops: Mapping[str, Op], arg_sets: Sequence[Args],
            settings: RetimeSettings = RetimeSettings()) -> dict[str, list[float]]:
    """Microseconds per call of each op, over the argument sets in turn."""
    names = list(ops)
    flush = _Flush()
    _warm(ops, arg_sets, settings.warmup_seconds)
    samples: dict[str, list[float]] = {name: [] for name in names}
    medians: dict[str, float] = {}
    started = time.monotonic()
    calls = 0
    while calls < settings.max_calls:
        pending = []
        for i in range(settings.batch):
            args, kwargs = arg_sets[(calls + i) % len(arg_sets)]
            for name in names if i % 2 == 0 else reversed(names):  # A B, B A, A B ...
                start = torch.cuda.Event(enable_timing=True)
                end = torch.cuda.Event(enable_timing=True)
                flush()
                start.record()
                ops[name](*args, **kwargs)
                end.record()
                pending.append((name, start, end))
        torch.cuda.synchronize()
        for name, start, end in pending:
            samples[name].append(float(start.elapsed_time(end)) * 1e3)
        calls += settings.batch
        now = {name: statistics.median(values) for name, values in samples.items()}
        settled = bool(medians) and all(abs(now[n] / medians[n] - 1) < settings.settle
                                        for n in names)
        medians = now
        if calls >= settings.min_calls and (settled or
                                            time.monotonic() - started > settings.max_seconds):
            break
    return samples


def _warm(ops: Mapping[str, Op], arg_sets: Sequence[Args], seconds: float) -> None:
    """A few calls of each op, for at least `seconds`: the clocks come up first."""
    started, n = time.monotonic(), 0
    while n < 3 or time.monotonic() - started < seconds:
        args, kwargs = arg_sets[n % len(arg_sets)]
        for op in ops.values():
            op(*args, **kwargs)
        torch.cuda.synchronize()
        n += 1


@dataclass(frozen=True)
class RetimeShape:
    """One shape of a re-timing job: the argument sets of every seed, timed in turn, and
    the first of them as the inputs an output is checked on before any timing."""

    label: str
    arg_sets: list[Args]
    inputs: InputSet


def retime_shapes(payload: Mapping[str, Any]) -> Iterator[RetimeShape]:
    """The shapes a re-timing job's payload names, their inputs made on the GPU one
    shape at a time (the reproduction's and the variants' jobs alike)."""
    for entry in payload["shapes"]:
        sig = CallSignature.from_json(entry["signature"])
        arg_sets: list[Args] = [make_args(sig, seed, "cuda") for seed in payload["seeds"]]
        yield RetimeShape(entry["label"], arg_sets, InputSet(entry["label"], *arg_sets[0]))
