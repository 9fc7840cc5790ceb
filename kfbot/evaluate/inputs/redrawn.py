"""kfbot's side of the redrawn inputs and of the precision a candidate keeps.

`distribution_trials` adds to the contract (`evaluate.inputs.contract`) the captured shapes
with their floating inputs redrawn from each of `distributions.DISTRIBUTIONS`: every
distribution once, the signatures taken in turn, so every benchmarked shape meets one
where there are several. Like every input kfbot adds, each is tried on the original
first; where the original overflows, raises or is wrong, it leaves the contract as a
finding about the original, and no candidate is checked on it. The worker draws them
by the name the trial carries (`device.values`), from the run's contract seed.

This module never imports torch.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Any

from kfbot.anticheat.findings import Finding, Severity
from kfbot.evaluate.capture.signature import CallSignature
from kfbot.evaluate.inputs.contract import Trial, shape_label
from kfbot.evaluate.inputs.distributions import DISTRIBUTIONS, SeedSchedule, distribution_label

MAX_TRIALS = 8


def distribution_trials(signatures: Sequence[CallSignature], root: int) -> list[Trial]:
    """One trial per distribution (more where there are more signatures, up to
    `MAX_TRIALS`), in an order of the run's schedule."""
    if not signatures:
        return []
    count = min(max(len(DISTRIBUTIONS), len(signatures)), max(MAX_TRIALS, len(DISTRIBUTIONS)))
    order = SeedSchedule(root).distributions("correctness", count)
    trials: dict[str, Trial] = {}
    for k, name in enumerate(order):
        sig = signatures[k % len(signatures)]
        label = distribution_label(name, shape_label(sig))
        trials.setdefault(label, Trial(name, label, replace(sig, count=0), values=name))
    return list(trials.values())


def precision_finding(found: Mapping[str, Any] | None) -> list[Finding]:
    """The worker's precision verdict as a finding: a warning or a note (a rejecting
    verdict comes back as a failed `precision-loss` check instead)."""
    if not found or found.get("verdict") == "strict":
        return []
    severity: Severity = "warn" if found.get("verdict") == "warn" else "note"
    return [Finding("precision", "runtime", severity, str(found.get("line", "")),
                    str(found.get("input", "")))]
