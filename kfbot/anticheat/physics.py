"""The physics floor: speedups no honest kernel reaches, flagged or rejected.

Two tiers, because fixing a naive kernel honestly can look implausible:

- **review** (`physics-floor`, a warning): more than `MAX_SPEEDUP` times faster than
  the original, or moving bytes / computing faster than the device's measured copy
  bandwidth or matmul FLOP/s allow (by `PEAK_MARGIN`). The candidate is kept and may
  be published, but only as a draft that asks a person to look (the review gate).
- **rejection** (`physics-peak`, strict): a rate that no cache can explain. Inputs are
  cold (the L2 is flushed before every trial) and at most the L2's size of the
  outputs can stay in it, so an op whose bytes are at least twice the L2 moves at
  least half of them through memory: its rate over all its bytes cannot exceed twice
  the measured bandwidth (with the margin). FLOP/s above twice the measured fp32
  matmul rate is beyond any fp32 unit of the device. Such a candidate is timed wrong
  or does not do its work, and the anti-cheat layer rejects it with the numbers.

The measurements come in as plain `ShapeRate`s: this layer holds checks and knows
nothing of how the engine that runs them represents a benchmark.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from kfbot.anticheat.findings import Finding

MAX_SPEEDUP = 10.0
# Measured peaks are themselves measurements of torch kernels; allow 10% over them
# before calling a rate implausible.
PEAK_MARGIN = 1.10
# Beyond this many times the measured peak (with the margin), a rate is impossible.
IMPOSSIBLE = 2.0


@dataclass(frozen=True)
class ShapeRate:
    """What one benchmark shape measured, as the physics floor reads it."""

    input: str  # the shape's label, the evidence a person reads
    speedup: float  # original time / candidate time
    bytes: int = 0  # read and written by one call
    bandwidth: float | None = None  # the candidate's bytes/s
    flop_rate: float | None = None  # the candidate's FLOP/s, when the task declares FLOPs


def physics_findings(rates: Sequence[ShapeRate], peaks: Mapping[str, float] | None,
                     l2_bytes: int = 0) -> list[Finding]:
    found = []
    for r in rates:
        if r.speedup > MAX_SPEEDUP:
            found.append(_flag(r.input, f"{r.speedup:.1f}x faster than the original, over "
                                        f"the {MAX_SPEEDUP:.0f}x review threshold"))
        if peaks:
            found += _rate_findings(r, peaks, l2_bytes)
    return found


def _rate_findings(r: ShapeRate, peaks: Mapping[str, float], l2_bytes: int) -> list[Finding]:
    out = []
    bandwidth = peaks.get("bandwidth_bytes_per_s")
    if r.bandwidth and bandwidth and r.bandwidth > bandwidth * PEAK_MARGIN:
        what = (f"moves {r.bytes} bytes at {r.bandwidth / 1e9:.0f} GB/s, above the measured "
                f"{bandwidth / 1e9:.0f} GB/s")
        cold = l2_bytes > 0 and r.bytes >= 2 * l2_bytes
        if cold and r.bandwidth > bandwidth * PEAK_MARGIN * IMPOSSIBLE:
            out.append(_reject(r.input, f"{what} by more than {IMPOSSIBLE:.0f}x, with "
                                        f"{r.bytes / l2_bytes:.1f}x the L2's "
                                        f"{l2_bytes} bytes to move"))
        else:
            out.append(_flag(r.input, what))
    flops = peaks.get("fp32_flop_per_s")
    if r.flop_rate and flops and r.flop_rate > flops * PEAK_MARGIN:
        what = (f"computes at {r.flop_rate / 1e12:.1f} TFLOP/s, above the measured "
                f"{flops / 1e12:.1f} TFLOP/s")
        if r.flop_rate > flops * PEAK_MARGIN * IMPOSSIBLE:
            out.append(_reject(r.input, f"{what} by more than {IMPOSSIBLE:.0f}x"))
        else:
            out.append(_flag(r.input, what))
    return out


def _flag(shape: str, what: str) -> Finding:
    return Finding(
        check="physics-floor",
        layer="physics",
        severity="warn",
        reason=f"{what}: a person must review it before it is merged",
        evidence=shape,
    )


def _reject(shape: str, what: str) -> Finding:
    return Finding(
        check="physics-peak",
        layer="physics",
        severity="strict",
        reason=f"{what}: no honest kernel on this device is that fast, so the timing "
               "or the work is not what it seems",
        evidence=shape,
    )
