"""Island-based evolution: several MAP-Elites archives evolving apart, with ring migration.

    search = IslandSearch(original, propose, evaluate, budget, SearchSettings(seed=7),
                          RunLog(folder))
    result = search.run()

`propose(island, parent, rng)` returns candidate edits of a parent (the mutators);
`evaluate(candidates)` builds, verifies and times them and says where each sits and
how fast it is (`Outcome`). Each island draws from its own seeded generator, so a
run is repeatable given the seed and deterministic mutators. Every finished
evaluation is appended to the run log; a resumed run replays the log instead of
evaluating again, and so continues exactly where the killed one stopped.
"""

from __future__ import annotations

import json
import random
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from kfbot.evaluate.candidate import Candidate
from kfbot.search.archive import Archive, Individual
from kfbot.search.budget import Budget
from kfbot.search.model import Cell


@dataclass(frozen=True)
class Outcome:
    cell: Cell
    fitness: float | None
    stage: str
    reason: str


Propose = Callable[[int, Individual, random.Random], Sequence[Candidate]]
Evaluate = Callable[[Sequence[Candidate]], Iterable[tuple[Candidate, Outcome]]]


@dataclass(frozen=True)
class SearchSettings:
    islands: int = 4
    migrate_every: int = 3  # generations between ring migrations
    batch: int = 2  # candidates an island proposes per generation
    seed: int = 0
    patience: int = 8  # generations in a row with nothing new proposed before giving up


@dataclass
class SearchResult:
    best: Individual | None
    archives: list[Archive]
    history: list[Individual] = field(default_factory=list)
    stopped: str = ""


class RunLog:
    """`evaluations.jsonl` in the run folder: one finished evaluation per line."""

    def __init__(self, folder: Path | None) -> None:
        self.path = folder / "evaluations.jsonl" if folder is not None else None

    def load(self) -> dict[str, Individual]:
        if self.path is None or not self.path.is_file():
            return {}
        done = {}
        for line in self.path.read_text().splitlines():
            if line.strip():  # a kill mid-write leaves at most a partial last line
                try:
                    ind = Individual.from_json(json.loads(line))
                except (ValueError, KeyError, TypeError):
                    continue
                done[ind.hash] = ind
        return done

    def append(self, individual: Individual) -> None:
        if self.path is None:
            return
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with self.path.open("a") as out:
            out.write(json.dumps(individual.to_json(), sort_keys=True) + "\n")


class IslandSearch:
    def __init__(self, original: Individual, propose: Propose, evaluate: Evaluate,
                 budget: Budget, settings: SearchSettings, log: RunLog | None = None,
                 on_result: Callable[[Individual], None] | None = None) -> None:
        self.original = original
        self.propose, self.evaluate = propose, evaluate
        self.budget, self.settings = budget, settings
        self.log = log or RunLog(None)
        self.on_result = on_result
        self.archives = [Archive() for _ in range(settings.islands)]
        for archive in self.archives:
            archive.add(original)
        self.rngs = [random.Random(f"{settings.seed}:{i}") for i in range(settings.islands)]
        self.seen = {original.hash}
        self.history: list[Individual] = []
        self._replay = self.log.load()

    def run(self) -> SearchResult:
        generation, idle, stopped = 0, 0, ""
        while not stopped:
            proposed = 0
            for island in range(self.settings.islands):
                stopped = self.budget.exhausted() or ""
                if stopped:
                    break
                proposed += self._step(island)
            generation += 1
            idle = idle + 1 if proposed == 0 else 0
            if not stopped and idle >= self.settings.patience:
                stopped = "no mutator proposes anything new"
            if generation % self.settings.migrate_every == 0:
                self._migrate()
        bests = [b for b in (a.best() for a in self.archives) if b is not None]
        best = max(bests, key=lambda e: (e.fitness or 0.0, -e.step), default=None)
        return SearchResult(best, self.archives, self.history, stopped)

    def _step(self, island: int) -> int:
        archive, rng = self.archives[island], self.rngs[island]
        parent = archive.select(rng) or self.original
        fresh: list[Candidate] = []
        for cand in self.propose(island, parent, rng):
            if cand.hash not in self.seen and len(fresh) < self._room():
                self.seen.add(cand.hash)
                fresh.append(cand)
        for cand, outcome in self._evaluated(fresh):
            child = self._record(cand, outcome, island, parent)
            archive.add(child, parent)
        return len(fresh)

    def _room(self) -> int:
        left = self.budget.evaluations_left()
        return self.settings.batch if left is None else min(self.settings.batch, left)

    def _evaluated(self, fresh: Sequence[Candidate]) -> Iterable[tuple[Candidate, Outcome]]:
        """Finished evaluations from the run log, the rest from the evaluator."""
        todo = [c for c in fresh if c.hash not in self._replay]
        done = {c.hash: c for c in fresh if c.hash in self._replay}
        for cand in fresh:
            if cand.hash in done:
                old = self._replay[cand.hash]
                yield cand, Outcome(old.cell, old.fitness, old.stage, old.reason)
        if todo:
            self.budget.charge(evaluations=len(todo))
            yield from self.evaluate(todo)

    def _record(self, cand: Candidate, outcome: Outcome, island: int,
                parent: Individual) -> Individual:
        child = Individual(cand.hash, parent.hash, island, outcome.cell, outcome.fitness,
                           outcome.stage, outcome.reason, cand.origin, len(self.history) + 1)
        self.history.append(child)
        if child.hash not in self._replay:
            self.log.append(child)
        if self.on_result is not None:
            self.on_result(child)
        return child

    def _migrate(self) -> None:
        """Ring migration: each island's best joins the next island."""
        bests = [a.best() for a in self.archives]
        n = len(self.archives)
        for i, best in enumerate(bests):
            if best is not None and best.hash != self.original.hash:
                target = (i + 1) % n
                self.archives[target].add(self.archives[target].migrant(best, target, best.step))
