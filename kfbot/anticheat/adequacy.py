"""The test adequacy gate: would the repository's own test notice a wrong op?

Each mutant (see `kfbot.anticheat.mutants`: no computation at all, a lower precision,
NaN everywhere, an answer from the inputs' statistics, statistics on a strided
subsample, the last call's result replayed) replaces the op's result inside the
repository's tests. A test run that still passes has accepted a kernel that does not
compute, or cheats in that way: the test is too weak to trust alone. kfbot then leans
on its own randomized checks, and the report and the pull request say which mutants
the test lets through.

The gate decides; it does not run anything. It asks for the runs through
`MutantRunner`, which the evaluation engine implements with its capture of the tests
(`kfbot.evaluate.capture.collect.MutantRuns`): anti-cheating imports nothing of the engine.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, Protocol

from kfbot.anticheat.findings import Finding

MUTANTS = ("zeros", "constant", "passthrough", "uninitialized", "half-precision", "tf32",
           "bfloat16", "nan-output", "closed-form", "strided-subsample", "last-call-replay")
# What a kernel the test lets through in each mutant's place would be doing.
MEANING = {
    "zeros": "writes zeros",
    "constant": "writes a constant",
    "passthrough": "returns an input unchanged",
    "uninitialized": "writes nothing",
    "half-precision": "computes in half precision",
    "tf32": "computes float32 through TF32",
    "bfloat16": "computes in bfloat16",
    "nan-output": "writes NaN",
    "closed-form": "answers from the inputs' mean and spread, not from their values",
    "strided-subsample": "reads every second element",
    "last-call-replay": "returns the previous call's result",
}
# Said by the replay mutant for each call it answered truly (`mutants.IDLE`, repeated
# here: this module runs without torch).
IDLE = "nothing earlier of this shape to replay"
UNMUTATED = "mutant not applicable"
MutantVerdictKind = Literal["rejected", "accepted", "not-run"]


class MutantRun(Protocol):
    """What one run of the repository's tests reports, the op's result replaced."""

    @property
    def op_calls(self) -> tuple[tuple[str, int], ...]: ...  # calls per op
    @property
    def errors(self) -> tuple[str, ...]: ...
    @property
    def timed_out(self) -> bool: ...
    @property
    def exit_code(self) -> int: ...
    @property
    def output_tail(self) -> str: ...


class MutantRunner(Protocol):
    """The repository's tests `targets`, run with the op's result replaced by a mutant."""

    @property
    def targets(self) -> tuple[str, ...]: ...
    def run(self, mutant: str) -> MutantRun: ...


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
                reason=f"the repository's test passes when the op returns the {m!r} mutant "
                f"(a kernel that {MEANING.get(m, 'does not compute')}): it cannot tell "
                "that from the op, so kfbot relies on its own randomized checks",
                evidence=", ".join(self.targets),
            )
            for m in self.accepted
        ]

    def summary(self) -> str:
        if not any(v.verdict != "not-run" for v in self.verdicts):
            return "the repository's test could not be run against trivial mutants"
        rejected = sum(v.verdict == "rejected" for v in self.verdicts)
        ran = sum(v.verdict != "not-run" for v in self.verdicts)
        verdict = "trusted" if self.trusted else \
            f"too weak (it would let through: {', '.join(self.accepted)})"
        return f"the repository's test rejects {rejected} of {ran} mutants: {verdict}"

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


def cache_tag() -> str:
    """Part of a cached verdict's name: a cache made with other mutants is not reused."""
    return hashlib.sha256(",".join(MUTANTS).encode()).hexdigest()[:8]


def check_adequacy(tests: MutantRunner, mutants: Sequence[str] = MUTANTS) -> Adequacy:
    """Run the tests once per mutant, the op's result replaced by it."""
    verdicts = [judge(mutant, tests.run(mutant)) for mutant in mutants]
    return Adequacy(tuple(tests.targets), tuple(verdicts))


def unmutated(op: str, reason: str, call: str) -> str:
    """What the capture says of a call a mutant left as it was; `call` names the call,
    so that each is a message of its own and the gate counts every one."""
    return f"{op}: {UNMUTATED}: {reason} (call {call})"


def _unmutated_reason(error: str) -> str | None:
    """The reason of an `unmutated` message; None for any other error."""
    if UNMUTATED not in error:
        return None
    return error.split(f"{UNMUTATED}: ", 1)[-1].rsplit(" (call ", 1)[0]


def judge(mutant: str, result: MutantRun) -> MutantVerdict:
    calls = sum(n for _, n in result.op_calls)
    # The calls a mutant left as they were (no floating input on a one-element call, no
    # earlier result to replay): it ran if it changed any other call.
    unchanged = [r for e in result.errors if (r := _unmutated_reason(e)) is not None]
    if result.timed_out:
        return MutantVerdict(mutant, "not-run", "the tests timed out")
    if calls == 0:
        return MutantVerdict(mutant, "not-run", "the tests never called the op")
    if len(unchanged) >= calls:
        reason = next((r for r in unchanged if r != IDLE), None)
        return MutantVerdict(mutant, "not-run", reason or (
            "no call of the op repeats the shape of an earlier one: there is nothing to replay"))
    if result.exit_code == 0:
        return MutantVerdict(mutant, "accepted", f"the tests passed ({calls} calls)")
    last = result.output_tail.strip().splitlines()[-1:] or [f"exit {result.exit_code}"]
    return MutantVerdict(mutant, "rejected", last[0][:160])


def load_cached(path: Path) -> Adequacy | None:
    try:
        return Adequacy.from_json(json.loads(path.read_text()))
    except (OSError, ValueError, KeyError, TypeError):
        return None
