"""The test adequacy gate: would the repository's own test notice a wrong op?

Each trivial mutant (zeros, a constant, an input passed through, an uninitialized
output, the result rounded to half precision) replaces the op's result inside the
repository's tests. A test run that still passes has accepted a kernel that does not
compute: the test is too weak to trust alone. kfbot then leans on its own randomized
checks, and the finding goes into the pull request.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from kfbot.anticheat.findings import Finding
from kfbot.evaluate.capture_run import CaptureResult, capture_signatures
from kfbot.evaluate.signature import OpRef
from kfbot.evaluate.staged import StagedModule

MUTANTS = ("zeros", "constant", "passthrough", "uninitialized", "half-precision")
MutantVerdictKind = Literal["rejected", "accepted", "not-run"]


@dataclass(frozen=True)
class MutantVerdict:
    mutant: str
    verdict: MutantVerdictKind
    detail: str = ""


@dataclass(frozen=True)
class Adequacy:
    targets: tuple[str, ...]
    verdicts: tuple[MutantVerdict, ...]

    @property
    def accepted(self) -> list[str]:
        return [v.mutant for v in self.verdicts if v.verdict == "accepted"]

    @property
    def trusted(self) -> bool:
        """Every mutant that could run was rejected, and at least one ran."""
        ran = [v for v in self.verdicts if v.verdict != "not-run"]
        return bool(ran) and not self.accepted

    def findings(self) -> list[Finding]:
        return [
            Finding(
                check="test-adequacy",
                layer="adequacy",
                severity="warn",
                reason=f"the repository's test passes when the op returns the {m!r} mutant: "
                "it cannot tell a computing kernel from one that does not, so kfbot "
                "relies on its own randomized checks",
                evidence=", ".join(self.targets),
            )
            for m in self.accepted
        ]

    def summary(self) -> str:
        if not any(v.verdict != "not-run" for v in self.verdicts):
            return "the repository's test could not be run against trivial mutants"
        rejected = sum(v.verdict == "rejected" for v in self.verdicts)
        ran = sum(v.verdict != "not-run" for v in self.verdicts)
        verdict = "trusted" if self.trusted else f"too weak (accepts {', '.join(self.accepted)})"
        return f"the repository's test rejects {rejected} of {ran} trivial mutants: {verdict}"

    def markdown(self) -> str:
        rows = [f"| `{v.mutant}` | {v.verdict} | {v.detail} |" for v in self.verdicts]
        return "\n".join(["| mutant | test verdict | detail |", "|---|---|---|", *rows])

    def to_json(self) -> dict[str, Any]:
        return {"targets": list(self.targets),
                "verdicts": [[v.mutant, v.verdict, v.detail] for v in self.verdicts]}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Adequacy:
        return cls(tuple(data["targets"]),
                   tuple(MutantVerdict(m, v, d) for m, v, d in data["verdicts"]))


def check_adequacy(
    root: Path, targets: Sequence[str], op: OpRef, timeout_s: float = 600,
    mutants: Sequence[str] = MUTANTS, staged: Sequence[StagedModule] = (),
    extra_env: Mapping[str, str] | None = None,
) -> Adequacy:
    """Run the tests `targets` once per mutant, the op's result replaced by it; `staged`
    makes kfbot's build of the extension importable under its real name (`extra_env`
    what the tree of the repository's own build needs)."""
    verdicts = []
    for mutant in mutants:
        result = capture_signatures(root, targets, [op], timeout_s=timeout_s, max_calls=0,
                                    mutant=mutant, staged=staged, extra_env=extra_env)
        verdicts.append(judge(mutant, result))
    return Adequacy(tuple(targets), tuple(verdicts))


def judge(mutant: str, result: CaptureResult) -> MutantVerdict:
    calls = sum(n for _, n in result.op_calls)
    skipped = next((e for e in result.errors if "mutant not applicable" in e), None)
    if result.timed_out:
        return MutantVerdict(mutant, "not-run", "the tests timed out")
    if skipped is not None:
        return MutantVerdict(mutant, "not-run", skipped.split("mutant not applicable: ")[-1])
    if calls == 0:
        return MutantVerdict(mutant, "not-run", "the tests never called the op")
    if result.exit_code == 0:
        return MutantVerdict(mutant, "accepted", f"the tests passed ({calls} calls)")
    last = result.output_tail.strip().splitlines()[-1:] or [f"exit {result.exit_code}"]
    return MutantVerdict(mutant, "rejected", last[0][:160])


def load_cached(path: Path) -> Adequacy | None:
    try:
        return Adequacy.from_json(json.loads(path.read_text()))
    except (OSError, ValueError, KeyError, TypeError):
        return None
