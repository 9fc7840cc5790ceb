"""The cheat corpus: candidates that fake a speedup, and honest ones, with verdicts.

    fixtures/cheats/<name>/cheat.yaml            what it does and the expected verdict
    fixtures/cheats/<name>/files/<path>          the files it replaces in its fixture

`run_corpus` evaluates entries with the real engine (a GPU is needed) and says, for
each, which checks named it: the GPU test and `bench/anticheat.py` both use it. It sits
beside the benchmarks, above kfbot: it drives the evaluation engine with the checks of
`kfbot.anticheat`, which themselves import nothing of the engine.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import yaml

from kfbot.config import load_config
from kfbot.errors import KfbotError
from kfbot.evaluate.candidate import Candidate
from kfbot.evaluate.engine import Engine, EngineSettings
from kfbot.evaluate.evaluation import Evaluation
from kfbot.evaluate.task import KernelTask, make_task
from kfbot.scan.scanner import scan
from kfbot.scan.select import select_kernel

KEYS = {"exploit", "fixture", "kernel", "verdict", "check", "runtime_check", "tolerances"}


@dataclass(frozen=True)
class Entry:
    name: str
    exploit: str
    fixture: str
    kernel: str
    verdict: str  # "rejected" or "accepted"
    files: dict[str, str] = field(default_factory=dict)
    check: str | None = None
    runtime_check: str | None = None
    tolerances: dict[str, tuple[float, float]] = field(default_factory=dict)

    @property
    def cheat(self) -> bool:
        return self.verdict == "rejected"

    def candidate(self) -> Candidate:
        return Candidate(files=self.files, origin="user", rationale=self.exploit)


def load_corpus(folder: Path) -> list[Entry]:
    entries = [_entry(d) for d in sorted(folder.iterdir()) if (d / "cheat.yaml").is_file()]
    if not entries:
        raise KfbotError(f"{folder}: no cheat.yaml entries")
    return entries


def _entry(folder: Path) -> Entry:
    data = yaml.safe_load((folder / "cheat.yaml").read_text())
    if not isinstance(data, dict) or not set(data) <= KEYS:
        raise KfbotError(f"{folder}/cheat.yaml: expected a mapping with keys {sorted(KEYS)}")
    files_dir = folder / "files"
    files = {p.relative_to(files_dir).as_posix(): p.read_text()
             for p in sorted(files_dir.rglob("*")) if p.is_file()}
    tolerances = {k: (float(v[0]), float(v[1])) for k, v in (data.get("tolerances") or {}).items()}
    return Entry(folder.name, str(data["exploit"]), str(data["fixture"]), str(data["kernel"]),
                 str(data["verdict"]), files, data.get("check"), data.get("runtime_check"),
                 tolerances)


def named_checks(ev: Evaluation) -> set[str]:
    """The checks that rejected an evaluation (a plain mismatch is `correctness`): its
    strict findings and every check that failed on some input (an input drawn from one
    distribution may name a cheat `correctness`, one from another `non-finite`; the
    order of the redrawn inputs is the run's own)."""
    named = {f.check for f in ev.findings if f.severity == "strict"}
    named |= {c.check for c in ev.checks if not c.passed}
    if ev.stage in ("correctness", "runtime", "build"):
        named.add("correctness" if ev.stage == "correctness" else ev.stage)
    return named


@dataclass(frozen=True)
class Outcome:
    entry: Entry
    evaluation: Evaluation
    static: bool  # whether the static rules were on

    @property
    def expected_check(self) -> str | None:
        return self.entry.check if self.static else self.entry.runtime_check

    @property
    def correct(self) -> bool:
        """A cheat rejected by the expected check; an honest candidate accepted."""
        ev = self.evaluation
        if not self.entry.cheat:
            return ev.ok
        return not ev.ok and self.expected_check in named_checks(ev)


def run_corpus(
    fixtures: Path, entries: Sequence[Entry], settings: EngineSettings,
    on_result: Callable[[Outcome], None] | None = None,
) -> list[Outcome]:
    """Evaluate each entry against its fixture; one engine per fixture, kernel and
    tolerance, so baselines and builds are shared."""
    outcomes = []
    for engine, group in _engines(fixtures, entries, settings):
        with engine:
            base = engine.baseline()
            if not base.ok:
                raise KfbotError(f"{group[0].fixture}: the original fails: {base.reason}")
            by_hash = {e.candidate().hash: e for e in group}
            done: list[tuple[str, Evaluation]] = []
            # Builds run on every core while the GPU evaluates the ones already built.
            for candidate, ev in engine.evaluate_many([e.candidate() for e in group]):
                done.append((candidate.hash, ev))
            engine.settle()  # the last one's leftovers are named too
            for digest, ev in done:
                result = Outcome(by_hash[digest], _after_the_job(engine, digest, ev),
                                 settings.static_checks)
                outcomes.append(result)
                if on_result is not None:
                    on_result(result)
    return outcomes


def _after_the_job(engine: Engine, digest: str, ev: Evaluation) -> Evaluation:
    """`ev`, rejected if the job after it found the device broken by it."""
    found = engine.isolation.context_finding(digest)
    if found is None:
        return ev
    return replace(ev, ok=False, stage="anticheat", reason=found.line(),
                   findings=(*ev.findings, found))


def _engines(fixtures: Path, entries: Sequence[Entry], settings: EngineSettings
             ) -> Iterator[tuple[Engine, list[Entry]]]:
    groups: dict[tuple[Any, ...], list[Entry]] = {}
    for e in entries:
        groups.setdefault((e.fixture, e.kernel, tuple(sorted(e.tolerances.items()))),
                          []).append(e)
    for (fixture, kernel, _), group in groups.items():
        yield Engine(task_for(fixtures / fixture, kernel, group[0]), settings), group


def task_for(root: Path, kernel: str, entry: Entry) -> KernelTask:
    config = load_config(None, root)
    task = make_task(select_kernel(scan(root, config).kernels, kernel), root, config)
    if entry.tolerances:
        task = replace(task, tolerances={**task.tolerances, **entry.tolerances})
    return task
