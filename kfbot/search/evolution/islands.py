"""Island-based evolution: several MAP-Elites archives evolving apart, with ring migration.

    search = IslandSearch(original, propose, evaluate, budget, SearchSettings(seed=7),
                          RunLog(folder))
    result = search.run()

`propose(island, parent, rng)` returns candidate edits of a parent (the mutators);
`evaluate(candidates)` builds, verifies and times them and says where each sits and
how fast it is (`Outcome`). Each generation's candidates, from every island, go to
`evaluate` as one batch (so several GPUs can share it) and are recorded in island
then proposal order, whatever order the answers came in. Each island draws from its
own seeded generator, so a run is repeatable given the seed and deterministic
mutators, on one GPU or many. Every finished
evaluation is appended to the run log; a resumed run replays the log instead of
evaluating again, and so continues exactly where the killed one stopped.
"""

from __future__ import annotations

import json
import random
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from kfbot.evaluate.candidate import Candidate
from kfbot.search.budget import Budget
from kfbot.search.evolution.archive import Archive, Individual
from kfbot.search.model import Cell

# Parents asked after the chosen one had nothing new, per island and generation: each
# asks every mutator (an LLM call among them), so a few at most.
FALLBACK_PARENTS = 6


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
                 on_result: Callable[[Individual], None] | None = None,
                 reached: Callable[[], str | None] | None = None) -> None:
        """`reached`, asked beside the budget, says why there is nothing left worth
        searching for (a kernel close to the speed of light), or None."""
        self.original = original
        self.reached = reached
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
        self._generation_room = 0  # evaluations this generation may still start

    def run(self) -> SearchResult:
        generation, idle, stopped = 0, 0, ""
        while not stopped:
            planned, stopped = self._plan()
            self._settle(planned)
            generation += 1
            proposed = sum(len(fresh) for _, _, fresh in planned)
            idle = idle + 1 if proposed == 0 else 0
            if not stopped and idle >= self.settings.patience:
                stopped = "no mutator proposes anything new"
            if generation % self.settings.migrate_every == 0:
                self._migrate()
        return self.result(stopped)

    def result(self, stopped: str) -> SearchResult:
        """The search as it stands: also what a run that was stopped mid-way reports."""
        bests = [b for b in (a.best() for a in self.archives) if b is not None]
        best = max(bests, key=lambda e: (e.fitness or 0.0, -e.step), default=None)
        return SearchResult(best, self.archives, list(self.history), stopped)

    def _plan(self) -> tuple[list[tuple[int, Individual, list[Candidate]]], str]:
        """Every island's fresh candidates for this generation, and why to stop, if so:
        no more are planned than can finish in the time left."""
        planned: list[tuple[int, Individual, list[Candidate]]] = []
        self._generation_room, why = self.budget.room(self.settings.islands *
                                                      self.settings.batch)
        if why:
            return planned, why
        for island in range(self.settings.islands):
            stopped = self.budget.exhausted() or (self.reached() if self.reached else None) \
                or ""
            if stopped:
                return planned, stopped
            parent, fresh = self._propose(island)
            # Charged when planned, so the next island sees what is left; a resumed
            # run's logged evaluations were counted when its budget was made.
            new = sum(c.hash not in self._replay for c in fresh)
            self.budget.charge(evaluations=new)
            self._generation_room -= new
            planned.append((island, parent, fresh))
        return planned, ""

    def _propose(self, island: int) -> tuple[Individual, list[Candidate]]:
        """A parent and its fresh candidates; when the chosen parent has none, the
        island's other elites and then its reserve are asked, a few at most."""
        archive, rng = self.archives[island], self.rngs[island]
        chosen = archive.select(rng) or self.original
        parent, fresh = chosen, self._fresh(island, chosen)
        for other in archive.others(rng, chosen)[:FALLBACK_PARENTS] if not fresh else []:
            parent, fresh = other, self._fresh(island, other)
            if fresh:
                break
        return (parent, fresh) if fresh else (chosen, fresh)

    def _fresh(self, island: int, parent: Individual) -> list[Candidate]:
        fresh: list[Candidate] = []
        for cand in self.propose(island, parent, self.rngs[island]):
            if cand.hash not in self.seen and len(fresh) < self._room():
                self.seen.add(cand.hash)
                fresh.append(cand)
        return fresh

    def _room(self) -> int:
        left = self.budget.evaluations_left()
        room = min(self.settings.batch, max(0, self._generation_room))
        return room if left is None else min(room, left)

    def _settle(self, planned: Sequence[tuple[int, Individual, list[Candidate]]]) -> None:
        """One batch for the whole generation, recorded in island then proposal order, so
        neither the evaluator nor the order its answers come in changes the run. Each
        answer is recorded (and logged) as soon as all before it in that order are, so a
        killed run keeps what had finished."""
        order = [(island, parent, c) for island, parent, fresh in planned for c in fresh]
        outcomes = {c.hash: self._logged(c.hash) for _, _, c in order if c.hash in self._replay}
        todo = [c for _, _, c in order if c.hash not in outcomes]
        recorded = self._record_ready(order, outcomes, 0)
        started = self.budget.now()
        for cand, outcome in self.evaluate(todo) if todo else ():
            outcomes[cand.hash] = outcome
            recorded = self._record_ready(order, outcomes, recorded)
        self.budget.pace.generation(len(todo), self.budget.now() - started)
        if recorded < len(order):
            missing = ", ".join(c.short for _, _, c in order[recorded:] if c.hash not in outcomes)
            raise RuntimeError(f"the evaluator left out candidates {missing}")

    def _record_ready(self, order: Sequence[tuple[int, Individual, Candidate]],
                      outcomes: Mapping[str, Outcome], start: int) -> int:
        """Record the answered run of `order` from `start`; where the next one starts."""
        while start < len(order) and order[start][2].hash in outcomes:
            island, parent, cand = order[start]
            child = self._record(cand, outcomes[cand.hash], island, parent)
            self.archives[island].add(child, parent)
            start += 1
        return start

    def _logged(self, digest: str) -> Outcome:
        old = self._replay[digest]
        return Outcome(old.cell, old.fitness, old.stage, old.reason)

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
