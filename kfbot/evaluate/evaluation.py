"""The answer for one candidate: how far it got, why, and how fast it is.

An `Evaluation` is always a value: a candidate that fails to build, computes the
wrong thing or crashes the worker is recorded with the stage it reached and a
one-line reason, plus structured diagnostics for the search and the reports.
"""

from __future__ import annotations

import math
import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from kfbot.anticheat.findings import Finding, Layer
from kfbot.evaluate.baseline.steps import StepReport
from kfbot.evaluate.model import Diagnostic
from kfbot.evaluate.verdict.light import (
    Floor,
    floating_dtype,
    floor_for,
    matmul_flops,
    percent,
    run_light,
)
from kfbot.evaluate.verdict.stats import Speedup, compare_times, geometric_mean

Stage = Literal[
    "static", "build", "baseline", "correctness", "anticheat", "runtime", "benchmark", "done"
]
Verdict = Literal["faster", "slower", "noise"]


@dataclass(frozen=True)
class Check:
    """One comparison of the op's output with the reference or the original."""

    input: str
    against: str  # "reference", "original", or "inputs" for an input-mutation check
    passed: bool
    error: str | None = None
    max_abs_error: float = 0.0
    max_rel_error: float = 0.0
    mismatch_fraction: float = 0.0
    where: str = "none"
    description: str = ""
    check: str = "correctness"  # or the runtime anti-cheating check that failed
    run: str = ""  # how the call was made, e.g. "outputs poisoned with NaN (0xFF bytes)"

    @classmethod
    def from_json(cls, record: Mapping[str, Any]) -> Check:
        comps = record.get("comparisons") or []
        worst: Mapping[str, Any] = max(comps, key=lambda c: c.get("max_abs_error", 0.0),
                                       default={})
        failing = next((c for c in comps if not c.get("passed")), worst)
        return cls(
            input=record["input"],
            against=record["against"],
            passed=record["passed"],
            error=record.get("error"),
            max_abs_error=float(worst.get("max_abs_error", 0.0)),
            max_rel_error=float(worst.get("max_rel_error", 0.0)),
            mismatch_fraction=float(failing.get("mismatch_fraction", 0.0)),
            where=str(failing.get("where", "none")),
            description=str(failing.get("description", "")),
            check=str(record.get("check", "correctness")),
            run=str(record.get("run", "")),
        )

    def finding(self) -> Finding:
        """A failed anti-cheating check as a finding with its evidence."""
        layer: Layer = "timing" if self.check in TIMING_CHECKS else "runtime"
        why = self.error or self.description or f"mismatch against the {self.against}"
        where = f"{self.input}; {self.run}" if self.run else self.input
        return Finding(self.check, layer, "strict", why, where)


TIMING_CHECKS = frozenset({"timed-output", "timer-disagreement"})


@dataclass(frozen=True)
class ShapeTiming:
    input: str
    speedup: Speedup
    bytes: int = 0
    bandwidth: float | None = None  # candidate bytes/s
    flop_rate: float | None = None  # candidate FLOP/s, when the task declares its FLOPs
    bound: str = ""  # memory-bound, compute-bound, latency-bound, under-utilised
    # The call signature the shape was timed with (CallSignature JSON): what a
    # reproduction makes its inputs from.
    signature: Mapping[str, Any] | None = field(default=None, compare=False)
    floor: Floor | None = None  # the speed of light on this GPU (see `light`)

    @property
    def light(self) -> float | None:
        """The candidate's % of the speed of light: floor time / its median time."""
        return percent(self.floor.us if self.floor else None, self.speedup.candidate.median)

    @property
    def original_light(self) -> float | None:
        return percent(self.floor.us if self.floor else None, self.speedup.baseline.median)


@dataclass(frozen=True)
class Evaluation:
    candidate: str  # content hash
    stage: Stage
    ok: bool
    reason: str
    diagnostics: tuple[Diagnostic, ...] = ()
    checks: tuple[Check, ...] = ()
    timings: tuple[ShapeTiming, ...] = ()
    build_seconds: float = 0.0
    eval_seconds: float = 0.0
    environment: Mapping[str, Any] = field(default_factory=dict)
    findings: tuple[Finding, ...] = ()  # anti-cheating: what rejected it, warnings, flags
    # Where the GPU worker's time went (load, inputs, verify, bench, probes...), seconds.
    phases: Mapping[str, float] = field(default_factory=dict)
    # The baseline's steps (pair, build, import, capture, reference, comparison).
    steps: tuple[StepReport, ...] = ()

    @property
    def needs_review(self) -> bool:
        """A physics-floor flag: published only as a draft that asks a person to look
        (or not at all, with `github.review_gate: block`)."""
        return any(f.layer == "physics" and f.severity == "warn" for f in self.findings)

    @property
    def publishable(self) -> bool:
        """Correct and significantly faster: a candidate a branch may hold. Whether it
        needs a person's review first is `needs_review`; the review gate decides."""
        return self.ok and self.verdict == "faster"

    @property
    def speedup(self) -> float | None:
        """Geometric mean over the benchmark shapes of original time / candidate time."""
        if not self.timings:
            return None
        return geometric_mean([t.speedup.ratio for t in self.timings])

    @property
    def light(self) -> float | None:
        """The candidate's % of the speed of light over the shapes that are not
        launch-bound (geometric mean), if any has a floor."""
        found = run_light([(t.floor.us if t.floor else None, t.speedup.candidate.median)
                           for t in self.timings])
        return None if found is None else 100.0 * found

    @property
    def original_light(self) -> float | None:
        found = run_light([(t.floor.us if t.floor else None, t.speedup.baseline.median)
                           for t in self.timings])
        return None if found is None else 100.0 * found

    @property
    def verdict(self) -> Verdict | None:
        """Faster only when some shape is significantly faster and none is slower.

        Shapes within noise (tiny, launch-bound inputs) neither make nor block the
        verdict; one shape that got significantly slower does.
        """
        if not self.timings:
            return None
        verdicts = {t.speedup.verdict for t in self.timings}
        if "slower" in verdicts:
            return "slower" if "faster" not in verdicts else "noise"
        return "faster" if "faster" in verdicts else "noise"


def failed(
    candidate: str, stage: Stage, reason: str, diagnostics: Sequence[Diagnostic] = (), **extra: Any
) -> Evaluation:
    return Evaluation(
        candidate=candidate,
        stage=stage,
        ok=False,
        reason=reason,
        diagnostics=tuple(diagnostics),
        **extra,
    )


# A shape whose time moved by less than this, either way, neither makes nor blocks the
# verdict: at launch-bound sizes the timer resolves differences no caller can see (on
# an H200, a tiled transpose was 3x faster at 4096x4096 and 0.26 µs slower, 3.90 µs
# against 4.16 µs, at 33x1001, which alone kept it from being committed).
LAUNCH_JITTER_US = 0.5


def shape_timings(
    records: Sequence[Mapping[str, Any]], seed: int, peaks: Mapping[str, float] | None
) -> tuple[ShapeTiming, ...]:
    rng = random.Random(seed)
    out = []
    for rec in records:
        speed = compare_times(rec["original_us"], rec["candidate_us"], rng,
                              abs_floor_us=LAUNCH_JITTER_US)
        seconds = speed.candidate.median / 1e6
        bandwidth = rec.get("bytes", 0) / seconds if seconds > 0 else None
        flops = rec.get("flops")
        rate = flops / seconds if flops and seconds > 0 else None
        inferred = None if flops else matmul_flops(rec.get("signature"))
        floor = floor_for(int(rec.get("bytes", 0)), flops or inferred,
                          floating_dtype(rec.get("signature")), peaks,
                          "declared" if flops else "matmul shape" if inferred else "")
        out.append(
            ShapeTiming(
                input=rec["input"],
                speedup=speed,
                bytes=int(rec.get("bytes", 0)),
                bandwidth=bandwidth,
                flop_rate=rate,
                bound=_bound(bandwidth, rate, seconds, peaks),
                signature=rec.get("signature"),
                floor=floor,
            )
        )
    return tuple(out)


def _bound(bandwidth: float | None, flop_rate: float | None, seconds: float,
           peaks: Mapping[str, float] | None) -> str:
    """A coarse roofline class from achieved bandwidth and FLOP/s against measured peaks."""
    if seconds < 10e-6:
        return "latency-bound"
    if not peaks:
        return "unknown"
    if flop_rate and flop_rate / peaks["fp32_flop_per_s"] >= 0.5:
        return "compute-bound"
    if bandwidth and math.isfinite(bandwidth) and \
            bandwidth / peaks["bandwidth_bytes_per_s"] >= 0.5:
        return "memory-bound"
    return "under-utilised"


def evidence_of(first: Finding, checks: Sequence[Check]) -> tuple[Finding, ...]:
    """Every anti-cheating check that failed, the one that decided first: a cheat often
    trips more than one (a library call is both a foreign kernel and, through its host
    overhead, a timer disagreement), and the report shows all of them."""
    seen, out = {first.check}, [first]
    for check in checks:
        if not check.passed and check.check not in seen and check.check != "correctness":
            seen.add(check.check)
            out.append(check.finding())
    return tuple(out)


def rejected(digest: str, bad: Check, baseline: bool, resources: Sequence[Any],
             checks: tuple[Check, ...], env: Mapping[str, Any],
             timings: tuple[Any, ...]) -> Evaluation:
    """The evaluation a failed check makes: a baseline or correctness failure, or an
    anti-cheating rejection with every failed check as evidence (`evidence_of`)."""
    why = bad.error or bad.description or f"mismatch on {bad.input}"
    if baseline or bad.check == "correctness":
        stage: Stage = "baseline" if baseline else "correctness"
        return failed(digest, stage, f"{bad.input} vs {bad.against}: {why}", resources,
                      checks=checks, environment=env)
    first = bad.finding()
    return failed(digest, "anticheat", first.line(), resources, checks=checks,
                  environment=env, timings=timings, findings=evidence_of(first, checks))
