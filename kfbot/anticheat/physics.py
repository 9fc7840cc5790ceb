"""The physics floor: speedups no honest kernel reaches are flagged for a person.

A candidate that moves its bytes faster than the device's measured copy bandwidth,
computes faster than its measured matmul FLOP/s, or runs more than `MAX_SPEEDUP`
times faster than the original is not rejected (fixing a naive kernel can do that)
but is never published without review.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

from kfbot.anticheat.findings import Finding

if TYPE_CHECKING:
    from kfbot.evaluate.evaluation import ShapeTiming

MAX_SPEEDUP = 10.0
# Measured peaks are themselves measurements of torch kernels; allow 10% over them
# before calling a rate impossible.
PEAK_MARGIN = 1.10


def physics_findings(
    timings: Sequence[ShapeTiming], peaks: Mapping[str, float] | None
) -> list[Finding]:
    found = []
    for t in timings:
        if t.speedup.ratio > MAX_SPEEDUP:
            found.append(_flag(t.input, f"{t.speedup.ratio:.1f}x faster than the original, "
                                        f"over the {MAX_SPEEDUP:.0f}x review threshold"))
        if not peaks:
            continue
        bandwidth = peaks.get("bandwidth_bytes_per_s")
        if t.bandwidth and bandwidth and t.bandwidth > bandwidth * PEAK_MARGIN:
            found.append(_flag(t.input, f"moves {t.bytes} bytes at {t.bandwidth / 1e9:.0f} GB/s, "
                                        f"above the measured {bandwidth / 1e9:.0f} GB/s"))
        flops = peaks.get("fp32_flop_per_s")
        if t.flop_rate and flops and t.flop_rate > flops * PEAK_MARGIN:
            found.append(_flag(t.input, f"computes at {t.flop_rate / 1e12:.1f} TFLOP/s, above "
                                        f"the measured {flops / 1e12:.1f} TFLOP/s"))
    return found


def _flag(shape: str, what: str) -> Finding:
    return Finding(
        check="physics-floor",
        layer="physics",
        severity="warn",
        reason=f"{what}: flagged for review, never published automatically",
        evidence=shape,
    )
