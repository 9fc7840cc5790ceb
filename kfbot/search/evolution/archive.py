"""A MAP-Elites archive: the best correct candidate per behaviour cell.

Every evaluation is recorded as an `Individual`. Correct, cheat-free ones compete for
their cell; those that lose are kept as a reserve of parents for when the elites have
nothing new left to propose (a rewrite that is not faster yet may become so with the
next one); failures are kept (with their reasons) so the same mistake is not proposed
twice. Parent selection favours cells whose children improved recently,
judged by the parent -> child fitness changes, and keeps some pure exploration.
"""

from __future__ import annotations

import random
from collections import deque
from collections.abc import Mapping
from dataclasses import asdict, dataclass, replace
from typing import Any

from kfbot.search.model import Cell

RECENT = 6  # fitness changes remembered per parent cell
EXPLORE = 0.2  # chance of a uniform pick among the elites


@dataclass(frozen=True)
class Individual:
    hash: str
    parent: str | None
    island: int
    cell: Cell
    fitness: float | None  # speedup over the original; None: failed or not trusted
    stage: str  # the evaluation's stage: "done", "correctness", "static", ...
    reason: str
    origin: str  # the mutator: "original", "params", "rules", "llm", "migrant"
    step: int  # the evaluation number, in the order they finished

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        data["cell"] = self.cell.to_json()
        return data

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Individual:
        fields = dict(data)
        fields["cell"] = Cell.from_json(data["cell"])
        return cls(**fields)


class Archive:
    def __init__(self) -> None:
        self.elites: dict[Cell, Individual] = {}
        self.failures: list[Individual] = []
        self.reserve: list[Individual] = []  # correct, but not (or no longer) an elite
        self._gains: dict[Cell, deque[float]] = {}

    def add(self, child: Individual, parent: Individual | None = None) -> bool:
        """Record an evaluation; True when it became its cell's elite."""
        if parent is not None:
            gain = (child.fitness or 0.0) - (parent.fitness or 0.0) if child.fitness else -1.0
            self._gains.setdefault(parent.cell, deque(maxlen=RECENT)).append(gain)
        if child.fitness is None:
            self.failures.append(child)
            return False
        current = self.elites.get(child.cell)
        if current is not None and current.fitness is not None \
                and current.fitness >= child.fitness:
            self.reserve.append(child)
            return False
        if current is not None:
            self.reserve.append(current)
        self.elites[child.cell] = child
        return True

    def best(self) -> Individual | None:
        ranked = [e for e in self.elites.values() if e.fitness is not None]
        return max(ranked, key=lambda e: (e.fitness, -e.step), default=None)

    def select(self, rng: random.Random) -> Individual | None:
        """A parent: usually from a cell whose children improved lately, sometimes any."""
        cells = sorted(self.elites)
        if not cells:
            return None
        if rng.random() < EXPLORE:
            return self.elites[rng.choice(cells)]
        weights = [self._promise(c) for c in cells]
        return self.elites[rng.choices(cells, weights=weights, k=1)[0]]

    def others(self, rng: random.Random, chosen: Individual | None) -> list[Individual]:
        """Parents to try when `chosen` had nothing new: the other elites in a random
        order, then the reserve, newest first."""
        elites = [self.elites[c] for c in sorted(self.elites) if self.elites[c] != chosen]
        rng.shuffle(elites)
        return elites + list(reversed(self.reserve))

    def _promise(self, cell: Cell) -> float:
        """Untried cells and cells with recent gains weigh more; stale cells still count."""
        gains = self._gains.get(cell)
        if not gains:
            return 2.0
        return 0.25 + sum(max(0.0, g) for g in gains) + 0.5 * sum(g > 0 for g in gains) / len(gains)

    def migrant(self, individual: Individual, island: int, step: int) -> Individual:
        """A copy of another island's best, as this island's own member."""
        return replace(individual, island=island, origin="migrant", step=step)
