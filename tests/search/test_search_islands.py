"""The island search on CPU against a replaying evaluation runner: recorded outcomes
for a small tunable space stand in for the GPU, so determinism, the budget, duplicate
handling, migration and resume are checked exactly."""

from __future__ import annotations

import random
from collections.abc import Iterable, Sequence
from pathlib import Path

import pytest

from kfbot.evaluate.candidate import Candidate
from kfbot.search.budget import Budget, Limits, parse_duration
from kfbot.search.evolution.archive import Archive, Individual
from kfbot.search.evolution.islands import IslandSearch, Outcome, RunLog, SearchSettings
from kfbot.search.model import Cell

BLOCKS = (32, 64, 128, 256, 512, 1024)
UNROLLS = (1, 2, 4, 8)


def recorded(block: int, unroll: int) -> Outcome:
    """A recorded evaluation: best at 256 x 4; unroll 8 with 1024 threads fails to verify."""
    cell = Cell("global", "none", "thread-per-element", str(min(block, 1024)))
    if block == 1024 and unroll == 8:
        return Outcome(cell, None, "correctness", "last partial block differs")
    speed = 2.0 - abs(BLOCKS.index(block) - 3) * 0.3 - abs(UNROLLS.index(unroll) - 2) * 0.2
    return Outcome(cell, round(speed, 3), "done", "correct")


def params_of(c: Candidate | Individual, table: dict[str, tuple[int, int]]) -> tuple[int, int]:
    return table.get(c.hash, (128, 1))


class Replay:
    """Evaluates by looking up the recorded outcome; counts what it was asked."""

    def __init__(self, fail_after: int | None = None) -> None:
        self.params: dict[str, tuple[int, int]] = {}
        self.calls: list[str] = []
        self.fail_after = fail_after

    def candidate(self, block: int, unroll: int) -> Candidate:
        cand = Candidate(params={"BLOCK": str(block), "UNROLL": str(unroll)}, origin="params")
        self.params[cand.hash] = (block, unroll)
        return cand

    def propose(self, island: int, parent: Individual, rng: random.Random) -> list[Candidate]:
        block, unroll = self.params.get(parent.hash, (128, 1))
        moves = [(b, unroll) for b in BLOCKS if abs(BLOCKS.index(b) - BLOCKS.index(block)) == 1]
        moves += [(block, u) for u in UNROLLS if abs(UNROLLS.index(u) - UNROLLS.index(unroll)) == 1]
        moves += [(rng.choice(BLOCKS), rng.choice(UNROLLS))]
        rng.shuffle(moves)
        return [self.candidate(b, u) for b, u in moves]

    def evaluate(self, cands: Sequence[Candidate]) -> Iterable[tuple[Candidate, Outcome]]:
        for cand in cands:
            if self.fail_after is not None and len(self.calls) >= self.fail_after:
                raise KeyboardInterrupt("killed")
            self.calls.append(cand.hash)
            yield cand, recorded(*self.params[cand.hash])


ORIGINAL = Individual("original", None, 0, Cell("global", "none", "thread-per-element", "128"),
                      1.0, "done", "the original", "original", 0)


def search(replay: Replay, evals: int, seed: int = 7, log: Path | None = None,
           spent: int = 0) -> IslandSearch:
    budget = Budget(Limits(evaluations=evals), spent={"evaluations": spent})
    return IslandSearch(ORIGINAL, replay.propose, replay.evaluate, budget,
                        SearchSettings(islands=3, migrate_every=2, batch=2, seed=seed),
                        RunLog(log))


def test_the_same_seed_gives_the_same_run() -> None:
    a = search(Replay(), 16).run()
    b = search(Replay(), 16).run()
    c = search(Replay(), 16, seed=8).run()
    assert [i.hash for i in a.history] == [i.hash for i in b.history]
    assert [i.hash for i in a.history] != [i.hash for i in c.history]


def test_the_budget_stops_the_run_exactly_and_says_why() -> None:
    replay = Replay()
    result = search(replay, 10).run()
    assert len(result.history) == len(replay.calls) == 10
    assert result.stopped == "evaluations spent (10/10)"


def test_no_candidate_is_evaluated_twice_and_the_space_runs_out() -> None:
    replay = Replay()
    result = search(replay, 500).run()
    assert len(replay.calls) == len(set(replay.calls)) == len(BLOCKS) * len(UNROLLS)
    assert result.stopped == "no mutator proposes anything new"
    assert result.best is not None and result.best.fitness == 2.0
    assert replay.params[result.best.hash] == (256, 4)


def test_failures_are_kept_apart_from_the_elites() -> None:
    replay = Replay()
    result = search(replay, 500).run()
    failed = [f for a in result.archives for f in a.failures]
    assert failed and all(f.fitness is None and f.stage == "correctness" for f in failed)
    assert all(e.fitness is not None for a in result.archives for e in a.elites.values())


def test_ring_migration_carries_an_islands_best_to_the_next() -> None:
    result = search(Replay(), 12).run()
    migrants = [e for a in result.archives for e in a.elites.values() if e.origin == "migrant"]
    assert migrants
    for m in migrants:
        source = next(i for i in result.history if i.hash == m.hash)
        assert m.island == (source.island + 1) % 3


def test_a_killed_run_resumes_without_redoing_finished_evaluations(tmp_path: Path) -> None:
    whole = search(Replay(), 14).run()
    killed = Replay(fail_after=6)
    with pytest.raises(KeyboardInterrupt):
        search(killed, 14, log=tmp_path).run()
    assert len(RunLog(tmp_path).load()) == 6
    resumed_replay = Replay()
    resumed = search(resumed_replay, 14, log=tmp_path, spent=6).run()
    assert [i.hash for i in resumed.history] == [i.hash for i in whole.history]
    assert len(resumed_replay.calls) == 8  # only what the killed run had not finished
    assert len(RunLog(tmp_path).load()) == 14


def test_selection_favours_cells_whose_children_improved() -> None:
    archive = Archive()
    hot = Individual("h", None, 0, Cell("vectorized", "none", "grid-stride", "256"), 1.5,
                     "done", "", "rules", 1)
    cold = Individual("c", None, 0, Cell("global", "none", "thread-per-element", "128"), 1.4,
                      "done", "", "params", 2)
    archive.add(hot)
    archive.add(cold)
    for k in range(4):
        better = Individual(f"h{k}", "h", 0, hot.cell, None, "correctness", "", "llm", 3 + k)
        archive.add(better, cold)  # cold's children keep failing
        archive.add(Individual(f"g{k}", "h", 0, Cell("shared-tiling", "barriers",
                                                      "block-per-tile", str(k)),
                               1.6 + k / 10, "done", "", "rules", 10 + k), hot)
    rng = random.Random(0)
    picks = [archive.select(rng) for _ in range(2000)]
    assert sum(p is not None and p.hash == "h" for p in picks) > \
        2 * sum(p is not None and p.hash == "c" for p in picks)


def test_individuals_round_trip_through_json() -> None:
    assert Individual.from_json(ORIGINAL.to_json()) == ORIGINAL


def test_budget_limits_and_resume() -> None:
    now = [100.0]
    budget = Budget(Limits(seconds=60, tokens=1000, usd=1.0), clock=lambda: now[0],
                    spent={"seconds": 30})
    assert budget.exhausted() is None
    budget.charge(tokens=999, usd=0.5)
    assert budget.exhausted() is None
    now[0] += 31
    assert budget.exhausted() == "time spent (61/60 s)"
    assert Budget(Limits(tokens=10), spent={"tokens": 10}).exhausted() == \
        "LLM tokens spent (10/10)"
    assert Budget(Limits(usd=1.0), spent={"usd": 1.5}).exhausted() == "money spent ($1.50/$1.00)"
    with pytest.raises(ValueError):
        budget.charge(evaluations=-1)
    assert budget.spent()["tokens"] == 999


@pytest.mark.parametrize(("text", "seconds"), [("90s", 90), ("30m", 1800), ("2h", 7200),
                                               ("1h30m", 5400), ("1.5m", 90)])
def test_durations(text: str, seconds: float) -> None:
    assert parse_duration(text) == seconds


@pytest.mark.parametrize("text", ["", "soon", "10x", "0s", "45", "1h30"])
def test_bad_durations_say_what_is_accepted(text: str) -> None:
    with pytest.raises(ValueError, match="try "):
        parse_duration(text)


def test_a_bare_number_needs_a_unit() -> None:
    with pytest.raises(ValueError, match=r"'30' needs a unit \(try 30s or 30m\)"):
        parse_duration("30")
