"""The worker's answer judged: a candidate's checks, timings and physics made into an
`Evaluation`, with the findings every report carries.

Pure reading of values the worker returned: the engine sends the job, this module
says what its answer means. It imports records of `kfbot.evaluate` and the
anti-cheating checks, nothing that runs a process.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Any

from kfbot.anticheat.findings import Finding, strict
from kfbot.anticheat.physics import ShapeRate, physics_findings
from kfbot.evaluate.baseline.steps import NO_REFERENCE
from kfbot.evaluate.evaluation import (
    Check,
    Evaluation,
    ShapeTiming,
    failed,
    rejected,
    shape_timings,
)
from kfbot.evaluate.inputs.contract import lenient_findings
from kfbot.evaluate.task import KernelTask
from kfbot.evaluate.worker.session import JobResult


def judge(digest: str, value: Mapping[str, Any], resources: Sequence[Any],
          device: Mapping[str, Any], *, baseline: bool) -> Evaluation:
    """The worker's answer for one candidate (or the original, `baseline`) as an
    Evaluation: its first failed check, else the physics of its timings on `device`."""
    records = value.get("baseline" if baseline else "verify", [])
    checks = tuple(Check.from_json(r) for r in [*records, *value.get("probes", [])])
    env = value.get("environment", {})
    if not records:
        return failed(
            digest,
            "baseline" if baseline else "correctness",
            "no inputs to check: the op's inputs could not be made from the captured "
            "signatures or the declared shapes",
            resources,
            environment=env,
        )
    timings = shape_timings(value.get("bench") or [], seed=0, peaks=device.get("peaks"))
    bad = next((c for c in checks if not c.passed), None)
    phases = {k: float(v) for k, v in value.get("phases", {}).items()}
    if bad is not None:
        return replace(rejected(digest, bad, baseline, resources, checks, env, timings),
                       phases=phases)
    physics = [*_physics(timings, device), *lenient_findings(records)]
    impossible = strict(physics)
    if impossible:
        return failed(digest, "anticheat", impossible[0].line(), resources, checks=checks,
                      environment=env, timings=timings, findings=tuple(physics),
                      phases=phases)
    return Evaluation(
        phases=phases,
        candidate=digest,
        stage="done",
        ok=True,
        reason=f"correct on {len(checks)} checks",
        diagnostics=tuple(resources),
        checks=checks,
        timings=timings,
        environment=env,
        findings=tuple(physics),
    )

def _physics(timings: Sequence[ShapeTiming], device: Mapping[str, Any]) -> list[Finding]:
    rates = [ShapeRate(t.input, t.speedup.ratio, t.bytes, t.bandwidth, t.flop_rate)
             for t in timings]
    return physics_findings(rates, device.get("peaks"),
                            int(device.get("l2_bytes") or 0))


def no_reference_finding(task: KernelTask) -> Finding:
    """Every report of a kernel checked without a reference says so: the original was
    the judge."""
    if task.references:
        why = ("no carried reference takes the op's own arguments (a test's reference is "
               "written over the arguments of the function it calls, a wrapper of the op)")
    else:
        why = "; ".join(task.unusable_references) or "the tests name no reference computation"
    return Finding("no-reference", "adequacy", "warn", NO_REFERENCE, why)


def runtime_failure(digest: str, job: JobResult, resources: Sequence[Any]) -> Evaluation:
    diag = job.diagnostic()
    return failed(
        digest, "runtime", job.reason, [*resources, *([diag] if diag is not None else [])]
    )
