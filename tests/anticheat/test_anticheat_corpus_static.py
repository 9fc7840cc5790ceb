"""The static layer on the whole cheat corpus, on CPU: cheats that target a static
rule are rejected by it before anything is built, honest candidates pass, and the
cheats meant for the runtime layer are not caught statically (so the GPU test really
exercises the runtime checks)."""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

import pytest

from bench.corpus import Entry, load_corpus, task_for
from kfbot.anticheat.rules import load_rules
from kfbot.evaluate.candidate import NVCC_FLAGS_PARAM, Candidate
from kfbot.evaluate.engine import Engine, EngineSettings

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures"
ENTRIES = load_corpus(FIXTURES / "cheats")
STATIC_IDS = {r.id for r in load_rules()}


def _findings(entry: Entry, tmp_path: Path, candidate: Candidate | None = None
              ) -> list[tuple[str, str]]:
    task = task_for(FIXTURES / entry.fixture, entry.kernel, entry)
    engine = Engine(task, EngineSettings(cache_dir=tmp_path))
    return [(f.check, f.severity) for f in engine.static_check(candidate or entry.candidate())]


def test_the_corpus_is_big_enough_and_covers_every_static_rule() -> None:
    cheats = [e for e in ENTRIES if e.cheat]
    assert len(cheats) >= 16 and len(ENTRIES) - len(cheats) >= 8
    targeted = {e.check for e in cheats}
    strict_rules = {r.id for r in load_rules() if r.severity == "strict"}
    assert strict_rules - targeted == set(), "every strict rule has a cheat that trips it"


@pytest.mark.parametrize("entry", ENTRIES, ids=[e.name for e in ENTRIES])
def test_static_layer_on_the_corpus(entry: Entry, tmp_path: Path) -> None:
    found = _findings(entry, tmp_path)
    strict = {check for check, severity in found if severity == "strict"}
    if not entry.cheat:
        assert strict == set(), found
    elif entry.check in STATIC_IDS:
        assert entry.check in strict, found
    else:
        assert strict == set(), f"meant for the runtime layer, but caught statically: {found}"


def test_a_fast_math_flag_is_reported_but_left_to_the_tolerance_gate(tmp_path: Path) -> None:
    gelu = next(e for e in ENTRIES if e.fixture == "load_elementwise")
    flagged = Candidate(params={NVCC_FLAGS_PARAM: "--use_fast_math"})
    assert _findings(gelu, tmp_path, flagged) == [("fast-math", "warn")]


def test_a_batch_builds_only_what_the_static_layer_let_through(tmp_path: Path) -> None:
    """`prepare_many` (a Ray actor's build-ahead): the cheat is rejected before it is
    staged or compiled, and the honest candidate beside it is built."""
    by_name = {e.name: e for e in ENTRIES}
    cheat, honest = by_name["cheat-side-stream"], by_name["honest-gelu-unrolled"]
    assert cheat.fixture == honest.fixture and cheat.kernel == honest.kernel
    engine = Engine(task_for(FIXTURES / cheat.fixture, cheat.kernel, cheat),
                    EngineSettings(cache_dir=tmp_path))
    rejected, built = engine.prepare_many([cheat.candidate(), honest.candidate()])
    assert rejected.built is None
    assert "concurrency" in {f.check for f in rejected.findings if f.severity == "strict"}
    assert built.built is not None and built.built.stage in ("compile", "link", "done")
    # What was staged (the honest candidate's sources, and the fast path's split of them)
    # holds nothing of the cheat's own text.
    staged = [f.read_text(errors="replace") for f in (tmp_path / "build" / "stage").rglob("*")
              if f.is_file()]
    def lines(texts: Iterable[str]) -> set[str]:
        return {line.strip() for text in texts for line in text.splitlines()}

    original = [(FIXTURES / cheat.fixture / path).read_text() for path in cheat.files]
    cheat_lines = lines(cheat.files.values()) - lines(honest.files.values()) - lines(original)
    cheat_lines = {line for line in cheat_lines if len(line) > 12}
    assert staged and cheat_lines
    assert not any(line in text for line in cheat_lines for text in staged)
