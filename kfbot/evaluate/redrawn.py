"""kfbot's side of the redrawn inputs: the run's private seed root, which redrawn sets the
original holds to, and what a job's result says about precision and the contract.

The worker makes the sets (`kfbot.evaluate.device.contract`); this process asks once
per run, before the first candidate, which of them the original holds to
(`Redrawn.admit`). A job that dies of a CUDA error while asking is asked again one
set at a time, so the set that did it is named and the others are kept. The sets
left out become notes about the original, shown with every candidate's evaluation.
"""

from __future__ import annotations

import secrets
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from kfbot.anticheat.findings import Finding, Severity
from kfbot.evaluate.worker import CUDA_KINDS, JobResult

ADMIT_JOB = "kfbot.evaluate.device.contract:admit"
Call = Callable[[Mapping[str, Any]], JobResult]


@dataclass
class Redrawn:
    """The run's schedule root and, once asked, the admitted sets (mutable: asked once)."""

    enabled: bool = True
    root: int = field(default_factory=lambda: secrets.randbits(63))
    admitted: tuple[str, ...] | None = None
    outside: tuple[Finding, ...] = ()
    failure: str | None = None  # why the original could not be asked at all

    def payload(self) -> dict[str, Any]:
        return {"schedule": self.root,
                "distributions": list(self.admitted or ()) if self.enabled else []}

    def admit(self, call: Call, base: Mapping[str, Any]) -> None:
        """Ask the worker which sets the original holds to (`call` runs the admit job)."""
        if not self.enabled or self.admitted is not None:
            return
        job = call({**base, "root": self.root})
        if job.ok and job.value is not None:
            self._take(job.value)
            return
        if job.kind not in CUDA_KINDS:
            self.admitted, self.failure = (), f"the original could not be tried on " \
                                              f"redrawn inputs: {job.reason}"
            return
        self.admitted = ()
        for label in _labels(call, base, self.root):
            one = call({**base, "root": self.root, "only": [label]})
            if one.ok and one.value is not None:
                self._take(one.value)
            else:
                self.outside += (outside_finding(label, f"the original fails there: "
                                                        f"{one.reason}"),)

    def _take(self, value: Mapping[str, Any]) -> None:
        self.admitted = (*(self.admitted or ()), *value.get("admitted", ()))
        self.outside += tuple(outside_finding(o["input"], o["detail"])
                              for o in value.get("outside", ()))


def _labels(call: Call, base: Mapping[str, Any], root: int) -> Sequence[str]:
    """Every planned label, from a job that makes none of the sets."""
    job = call({**base, "root": root, "list_only": True})
    return list(job.value.get("planned", ())) if job.ok and job.value is not None else []


def outside_finding(label: str, detail: str) -> Finding:
    return Finding("outside-contract", "adequacy", "note",
                   f"a redrawn input left the contract: {detail}; no candidate is "
                   "checked on it", label)


def precision_finding(found: Mapping[str, Any] | None) -> list[Finding]:
    """The worker's precision verdict as a finding: a warning or a note (a rejecting
    verdict comes back as a failed `precision-loss` check instead)."""
    if not found or found.get("verdict") == "strict":
        return []
    severity: Severity = "warn" if found.get("verdict") == "warn" else "note"
    return [Finding("precision", "runtime", severity, str(found.get("line", "")),
                    str(found.get("input", "")))]
