"""Runtime anti-cheating probes inside the worker.

* Poison: before a call, every free block of the allocator cache is filled with a byte
  pattern, so any output element the op does not write (or memory it reuses from an
  earlier call or the reference) holds the pattern and cannot pass for a result.
* Inputs: snapshots before a call, compared bit for bit afterwards.
* Kernels: the kernels one call launches and the streams they run on (torch profiler).
* Wall clock: host time around a device-wide synchronize, the second timer.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from kfbot.evaluate.build.symbols import parse_symbol

Op = Callable[..., Any]

def poisoned_elements(t: torch.Tensor, byte: int) -> int:
    """Elements of `t` whose every byte is `byte`: never written since the poisoning."""
    if t.numel() == 0 or t.is_sparse:
        return 0
    raw = t.detach().contiguous().view(torch.uint8).reshape(t.numel(), t.element_size())
    return int((raw == byte).all(dim=1).sum().item())


def tensors_in(value: Any) -> list[torch.Tensor]:
    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, (list, tuple)):
        return [t for v in value for t in tensors_in(v)]
    if isinstance(value, dict):
        return [t for v in value.values() for t in tensors_in(v)]
    return []


def snapshot(values: Iterable[Any]) -> list[torch.Tensor]:
    return [t.detach().clone() for v in values for t in tensors_in(v)]


def mutated(before: Sequence[torch.Tensor], values: Iterable[Any]) -> list[int]:
    """Positions (in tensor order) of inputs that changed, bit for bit: one synchronize
    for all of them."""
    after = [t for v in values for t in tensors_in(v)]
    flags = [_same_bits(a, b) for a, b in zip(before, after, strict=True)]
    pending = [f for f in flags if isinstance(f, torch.Tensor)]
    read = iter(torch.stack(pending).tolist() if pending else [])
    same = [next(read) if isinstance(f, torch.Tensor) else f for f in flags]
    return [i for i, ok in enumerate(same) if not ok]


def _same_bits(a: torch.Tensor, b: torch.Tensor) -> bool | torch.Tensor:
    """Whether `a` and `b` hold the same bits: known at once from their metadata, or a
    0-dim bool tensor on the device."""
    if a.shape != b.shape or a.dtype != b.dtype or a.device != b.device:
        return False
    if a.numel() == 0:
        return True
    raw_a, raw_b = _words(a), _words(b)
    return ~raw_a.ne(raw_b).any()


def _words(t: torch.Tensor) -> torch.Tensor:
    """`t`'s bytes as the widest integers that tile them: the bitwise comparison then
    reads the same bytes but writes an eighth of the flags a byte view would."""
    raw = t.contiguous().reshape(-1).view(torch.uint8)
    for wide in (torch.int64, torch.int32, torch.int16):
        size = wide.itemsize
        if raw.numel() % size == 0 and raw.data_ptr() % size == 0:
            return raw.view(wide)
    return raw


# --- kernels launched ------------------------------------------------------------------


@dataclass(frozen=True)
class Launch:
    name: str  # demangled kernel name as the profiler reports it
    stream: int  # the profiler's stream id


_BENIGN = re.compile(r"FillFunctor|fill_kernel|memset|zero_", re.IGNORECASE)


def launches(fn: Op, args: Sequence[Any], kwargs: dict[str, Any]) -> list[Launch]:
    """The kernels one call of `fn` launches, in order, with their streams."""
    from torch.profiler import ProfilerActivity, profile

    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        fn(*args, **kwargs)
        torch.cuda.synchronize()
    found = []
    for event in prof.profiler.kineto_results.events() if prof.profiler else []:
        if event.device_type().name == "CUDA" and _is_kernel(event.name()):
            found.append(Launch(event.name(), int(event.device_resource_id())))
    return found


def _is_kernel(name: str) -> bool:
    return not name.startswith(("Memcpy", "Memset", "cuda"))


def kernel_identifier(name: str) -> str:
    """`void ns::softmax_kernel<128>(float const*, ...)` -> `softmax_kernel`: read as the
    build reads a library's symbols (`void a::(anonymous namespace)::k<float>(...)` too);
    a name that reading does not take comes back whole."""
    parsed = parse_symbol(name)
    return parsed.name if parsed is not None else name


def is_benign(name: str) -> bool:
    """Fills and memsets: an op may zero its output with a library fill."""
    return bool(_BENIGN.search(name))


# --- the second timer ------------------------------------------------------------------


def wall_clock_us(
    fns: Sequence[Op], args: Sequence[Any], kwargs: dict[str, Any], flush: Callable[[], None],
    calls: int = 30,
) -> list[float]:
    """The fastest host time (µs) of a call ended by a device-wide synchronize, per op.

    The ops alternate, so a busy host (builds run beside the worker) slows both alike,
    and the minimum is kept: whatever else the host does can only add time, while GPU
    work the CUDA events missed is in every sample. The L2 is flushed (and the flush
    waited for) before each call, as it is for the CUDA-event timing.
    """
    best = [float("inf")] * len(fns)
    for _ in range(calls):
        for i, fn in enumerate(fns):
            flush()
            torch.cuda.synchronize()
            started = time.perf_counter()
            fn(*args, **kwargs)
            torch.cuda.synchronize()
            best[i] = min(best[i], (time.perf_counter() - started) * 1e6)
    return best
