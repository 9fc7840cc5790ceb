"""The other ops a change to shared code reaches, verified with the candidate.

A candidate may need to change code its kernel shares with other kernels of the same
build: a device function both call, a constant or a macro both read. The task's own
reference cannot vouch for the other ops, so such a change stands only when every
kernel it reaches has an op kfbot can verify (a task of its own, `KernelTask.neighbours`,
whose original passes its reference) and that op, built from the candidate's files,
passes its reference on its own captured shapes and is not significantly slower on any
of them. A change that reaches a kernel the task's kernel does not share code with stays
out of scope (`scope.py`); so does one reaching a kernel that has no verifiable op.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Protocol

from kfbot.anticheat.findings import Finding
from kfbot.evaluate.candidate import Candidate
from kfbot.evaluate.evaluation import Evaluation, failed
from kfbot.evaluate.scope import CHECK, Reached
from kfbot.evaluate.task import KernelTask

log = logging.getLogger(__name__)


class NeighbourEngine(Protocol):
    """What verifying another op needs of its engine (`Engine`)."""

    def baseline(self) -> Evaluation: ...

    def evaluate_shared(self, candidate: Candidate, bench: bool = True) -> Evaluation: ...

    def __exit__(self, *exc: object) -> None: ...


@dataclass(frozen=True)
class Scope:
    """A candidate's changes outside its kernel: their findings, and the kernels whose ops
    must pass with it."""

    findings: tuple[Finding, ...]
    verify: tuple[str, ...]


class Neighbours:
    """The engines of the task's neighbour ops, started when a candidate first needs one."""

    def __init__(self, tasks: Sequence[KernelTask],
                 engine: Callable[[KernelTask], NeighbourEngine]) -> None:
        self.tasks = {_bare(t.kernel_name): t for t in tasks}
        self._engine = engine
        self._engines: dict[str, NeighbourEngine] = {}
        self._baselines: dict[str, Evaluation] = {}

    def scope(self, found: Sequence[Reached]) -> Scope:
        """Strict findings for the changes no neighbour op can vouch for; a warning, and
        the kernel to verify, for each change to shared code whose kernel has an op."""
        findings: list[Finding] = []
        verify: list[str] = []
        for reach in found:
            if reach.shared and reach.other in self.tasks:
                findings.append(reach.finding(verified=True))
                verify.append(reach.other)
            else:
                findings.append(_unverifiable(reach) if reach.shared else reach.finding())
        return Scope(tuple(dict.fromkeys(findings)), tuple(dict.fromkeys(verify)))

    def verify(self, candidate: Candidate, kernels: Sequence[str], result: Evaluation,
               bench: bool = True) -> Evaluation:
        """`result` (the task's own, passed) unless a neighbour op fails with the
        candidate, is slower with it, or cannot be verified."""
        evidence: list[Finding] = []
        for kernel in kernels:
            outcome = self._verify_one(candidate, kernel, bench)
            if isinstance(outcome, Evaluation):
                return outcome
            evidence.append(outcome)
        return replace(result, findings=(*result.findings, *evidence))

    def close(self) -> None:
        for engine in self._engines.values():
            engine.__exit__(None, None, None)
        self._engines.clear()

    def _verify_one(self, candidate: Candidate, kernel: str,
                    bench: bool) -> Evaluation | Finding:
        task = self.tasks[kernel]
        engine = self._started(kernel)
        base = self._baselines.get(kernel)
        if base is None:
            base = self._baselines[kernel] = engine.baseline()
        if not base.ok:
            return failed(candidate.hash, "static", f"[{CHECK}] changes code {kernel} uses "
                          f"too, and {task.kernel_id}'s op cannot be verified: its original "
                          f"fails its own reference ({base.reason})")
        got = engine.evaluate_shared(candidate, bench)
        log.info("%s: neighbour %s with the candidate: %s", candidate.short, kernel, got.reason)
        if not got.ok:
            return replace(got, candidate=candidate.hash,
                           reason=f"changes code {kernel} uses too, and {task.kernel_id}'s op "
                                  f"then fails: {got.reason}")
        slower = [t for t in got.timings if t.speedup.verdict == "slower"]
        if slower:
            return failed(candidate.hash, "benchmark",
                          f"changes code {kernel} uses too, and {task.kernel_id}'s op is "
                          f"slower with it at {slower[0].input} "
                          f"({slower[0].speedup.ratio:.3f}x)", timings=got.timings)
        ratio = f", {got.speedup:.3f}x" if got.speedup is not None else ""
        return Finding(CHECK, "static", "warn", f"{task.kernel_id}'s op, whose code the "
                       f"candidate changes too, passes with it: {got.reason}{ratio}",
                       kernel)

    def _started(self, kernel: str) -> NeighbourEngine:
        if kernel not in self._engines:
            self._engines[kernel] = self._engine(self.tasks[kernel])
        return self._engines[kernel]


def _unverifiable(reach: Reached) -> Finding:
    return Finding(CHECK, "static", "strict",
                   f"changes {reach.what} {reach.name}, which {reach.other} uses too, and "
                   f"{reach.other} has no op kfbot can verify (no reference test pairs with "
                   "it): code shared with it must stay as it is", reach.evidence)


def _bare(name: str) -> str:
    return name.rsplit("::", 1)[-1]
