"""One thing an anti-cheating layer found, with the reason and the evidence."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Literal

Layer = Literal["static", "runtime", "timing", "physics", "adequacy"]
Severity = Literal["strict", "warn", "note"]


@dataclass(frozen=True)
class Finding:
    """`strict` rejects the candidate; `warn` is reported and keeps it; `note` is a fact
    for the reviewer that speaks neither for nor against the candidate (an input outside
    the original's contract, the precision it keeps)."""

    check: str  # a stable id: a rule id from rules/anticheat.yaml or a runtime check
    layer: Layer
    severity: Severity
    reason: str  # one line a kernel engineer can read in a pull request
    evidence: str = ""  # where and what: file:line and the source, or the numbers

    def to_json(self) -> dict[str, str]:
        return {
            "check": self.check,
            "layer": self.layer,
            "severity": self.severity,
            "reason": self.reason,
            "evidence": self.evidence,
        }

    @classmethod
    def from_json(cls, record: Mapping[str, Any]) -> Finding:
        return cls(
            check=str(record["check"]),
            layer=record["layer"],
            severity=record["severity"],
            reason=str(record["reason"]),
            evidence=str(record.get("evidence", "")),
        )

    def line(self) -> str:
        where = f" ({self.evidence})" if self.evidence else ""
        return f"[{self.check}] {self.reason}{where}"


def strict(findings: Iterable[Finding]) -> list[Finding]:
    return [f for f in findings if f.severity == "strict"]


def warnings(findings: Iterable[Finding]) -> list[Finding]:
    return [f for f in findings if f.severity == "warn"]
