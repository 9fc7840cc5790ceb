"""The cheat corpus on a real GPU: every cheat is rejected by the check it targets,
every honest candidate is accepted; and the runtime layer alone still catches the
cheats it is meant to catch when the static rules are switched off."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from bench.corpus import Outcome, load_corpus, named_checks, run_corpus, task_for
from kfbot.evaluate.engine import Engine, EngineSettings

pytestmark = pytest.mark.gpu

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures"
ENTRIES = load_corpus(FIXTURES / "cheats")
RUNTIME = [e for e in ENTRIES if e.runtime_check]
TIMING = {"max_trials": 40, "min_trials": 10, "max_seconds": 5.0}


def _settings(cache: Path, static: bool) -> EngineSettings:
    return EngineSettings(cache_dir=cache, timing=TIMING, job_timeout_s=120,
                          static_checks=static, measure_peaks=True)


@pytest.fixture(scope="module")
def cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    kept = os.environ.get("KFBOT_TEST_CACHE")  # a kept cache skips input capture and builds
    return Path(kept) if kept else tmp_path_factory.mktemp("kfbot-corpus")


def _selected(request: pytest.FixtureRequest, test: str) -> set[str]:
    """The entries this session runs `test` on (`-k` picks a few: only they are
    evaluated, not the whole corpus)."""
    names = set()
    for item in request.session.items:
        callspec = getattr(item, "callspec", None)
        if callspec is not None and item.originalname == test:
            names.add(str(callspec.params.get("name")))
    return names


@pytest.fixture(scope="module")
def full(cache: Path, request: pytest.FixtureRequest) -> dict[str, Outcome]:
    wanted = _selected(request, "test_every_layer_on") or {e.name for e in ENTRIES}
    if any(i.originalname == "test_honest_candidates_are_timed_and_none_slower_than_noise"
           for i in request.session.items):
        wanted = {e.name for e in ENTRIES}
    entries = [e for e in ENTRIES if e.name in wanted]
    return {o.entry.name: o for o in run_corpus(FIXTURES, entries, _settings(cache, True))}


@pytest.fixture(scope="module")
def runtime_only(cache: Path, request: pytest.FixtureRequest) -> dict[str, Outcome]:
    wanted = _selected(request, "test_runtime_layer_alone") or {e.name for e in RUNTIME}
    entries = [e for e in RUNTIME if e.name in wanted]
    return {o.entry.name: o for o in run_corpus(FIXTURES, entries, _settings(cache, False))}


def _explain(o: Outcome) -> str:
    ev = o.evaluation
    return f"{o.entry.name}: ok={ev.ok} stage={ev.stage} named={sorted(named_checks(ev))} " \
           f"reason={ev.reason[:400]}"


@pytest.mark.parametrize("name", [e.name for e in ENTRIES])
def test_every_layer_on(full: dict[str, Outcome], name: str) -> None:
    outcome = full[name]
    assert outcome.correct, _explain(outcome)
    if outcome.entry.cheat:  # named where a reader sees it: the reason or a failed check
        failed = {c.check for c in outcome.evaluation.checks if not c.passed}
        assert f"[{outcome.entry.check}]" in outcome.evaluation.reason \
            or outcome.evaluation.stage == outcome.entry.check \
            or outcome.entry.check in failed, _explain(outcome)


@pytest.mark.parametrize("name", [e.name for e in RUNTIME])
def test_runtime_layer_alone(runtime_only: dict[str, Outcome], name: str) -> None:
    outcome = runtime_only[name]
    assert outcome.correct, _explain(outcome)
    assert outcome.evaluation.stage != "static"


def test_honest_candidates_are_timed_and_none_slower_than_noise(full: dict[str, Outcome]) -> None:
    honest = [o for o in full.values() if not o.entry.cheat]
    assert len(honest) >= 8
    for o in honest:
        assert o.evaluation.timings, _explain(o)
        assert not [f for f in o.evaluation.findings if f.severity == "strict"], _explain(o)


def test_the_gelu_fixture_test_rejects_trivial_mutants(cache: Path) -> None:
    gelu = next(e for e in ENTRIES if e.fixture == "load_elementwise" and not e.tolerances)
    with Engine(task_for(FIXTURES / gelu.fixture, gelu.kernel, gelu), _settings(cache, True)) as e:
        gate = e.adequacy()
    assert gate is not None
    verdicts = {v.mutant: v.verdict for v in gate.verdicts}
    # Its test calls each shape once: there is nothing for a replay to replay.
    assert verdicts.pop("last-call-replay") == "not-run", gate.verdicts
    unrun = [v for v in gate.verdicts if v.verdict == "not-run" and v.mutant != "last-call-replay"]
    assert not unrun, unrun  # each with the reason it did not run
    for mutant in ("zeros", "constant", "passthrough", "half-precision", "tf32", "bfloat16",
                   "nan-output", "closed-form", "strided-subsample"):
        assert verdicts[mutant] == "rejected", gate.verdicts
