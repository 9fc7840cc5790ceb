"""The speed of light: the least time one call can take on this GPU, from the bytes it
must move and the FLOPs it must do.

    floor = max(bytes / measured copy bandwidth, FLOPs / measured peak FLOP/s of the dtype)

Bytes are what the call reads and writes at least once (its inputs and outputs, each
element of a view counted once); FLOPs are the task's declared expression, else those
of a matrix product when the call is shaped like one ((.., M, K) by (.., K, N): 2 M N K
per batch), else unknown, and the floor is the memory floor alone. The peaks are the
worker's measurements of PyTorch's own copy and matmul on this device, so a kernel can
come out a little above 100%; far above is the physics floor's business.

`percent` is floor / median time: how close a kernel is to what the hardware allows,
beside how much faster it is than the original. Shapes whose candidate takes under
`LATENCY_US` are launch-bound: their floor says nothing, and `run_light` leaves them out.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

LATENCY_US = 10.0
# Measured peak FLOP/s per dtype, by the key the worker's probe reports it under.
PEAK_KEYS = {"float32": "fp32_flop_per_s", "float16": "fp16_flop_per_s",
             "bfloat16": "bf16_flop_per_s"}


@dataclass(frozen=True)
class Floor:
    """The floor of one shape and what sets it."""

    us: float
    bound: str  # "memory" or "compute"
    flops: float | None = None
    flops_from: str = ""  # "declared", "matmul shape", or "" when unknown


def floor_for(nbytes: int, flops: float | None, dtype: str | None,
              peaks: Mapping[str, float] | None, flops_from: str = "") -> Floor | None:
    """The floor of one call, or None without a measured bandwidth."""
    bandwidth = (peaks or {}).get("bandwidth_bytes_per_s")
    if not bandwidth or nbytes <= 0:
        return None
    memory_us = nbytes / bandwidth * 1e6
    peak = (peaks or {}).get(PEAK_KEYS.get(dtype or "", ""))
    compute_us = flops / peak * 1e6 if flops and peak else 0.0
    if compute_us > memory_us:
        return Floor(compute_us, "compute", flops, flops_from)
    return Floor(memory_us, "memory", flops, flops_from)


def matmul_flops(signature: Mapping[str, Any] | None) -> float | None:
    """2 M N K (times the batch) when the call's first two floating tensors are shaped
    (.., M, K) and (.., K, N); None otherwise."""
    mats = [a for a in (signature or {}).get("args", [])
            if isinstance(a, Mapping) and a.get("kind") == "tensor"
            and str(a.get("dtype", "")).startswith(("float", "bfloat"))]
    if len(mats) < 2:
        return None
    a, b = (tuple(int(d) for d in m["shape"]) for m in mats[:2])
    if len(a) < 2 or len(b) < 2 or len(a) != len(b) or a[-1] != b[-2] or a[:-2] != b[:-2]:
        return None
    m, k, n = a[-2], a[-1], b[-1]
    if min(m, k, n) < 2:
        return None
    return 2.0 * m * n * k * math.prod(a[:-2])


def floating_dtype(signature: Mapping[str, Any] | None) -> str | None:
    """The dtype of the call's first floating tensor."""
    for a in (signature or {}).get("args", []):
        if isinstance(a, Mapping) and a.get("kind") == "tensor" \
                and str(a.get("dtype", "")).startswith(("float", "bfloat")):
            return str(a["dtype"])
    return None


def percent(floor_us: float | None, median_us: float) -> float | None:
    if floor_us is None or median_us <= 0:
        return None
    return 100.0 * floor_us / median_us


def run_light(pairs: Sequence[tuple[float | None, float]]) -> float | None:
    """The geometric mean of floor / time over shapes (floor µs, median µs) that are not
    launch-bound; None when no shape has both."""
    ratios = [f / t for f, t in pairs if f is not None and t >= LATENCY_US and f > 0]
    if not ratios:
        return None
    return math.exp(sum(math.log(r) for r in ratios) / len(ratios))


def light_text(value: float | None) -> str:
    """`63% of light`-style cell text: '–' when unknown."""
    return "–" if value is None else f"{value:.0f}%"
