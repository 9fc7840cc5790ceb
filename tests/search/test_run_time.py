"""A run keeps its time budget and never loses what it verified.

The budget's arithmetic and the island search on a simulated clock; the stop signals
in this process; and `kfbot optimize`'s search in a real process (tests/replay_search.py,
answered from recorded evaluations that take their recorded time, scaled down) sent
SIGTERM mid-search, resumed, and held to a time limit.
"""

from __future__ import annotations

import json
import os
import random
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path

import git
import pytest

from kfbot.evaluate.candidate import Candidate
from kfbot.github.action_io import search_seconds
from kfbot.search.budget import Budget, Limits, Pace
from kfbot.search.evolution.archive import Individual
from kfbot.search.evolution.islands import IslandSearch, Outcome, SearchSettings
from kfbot.search.model import Cell
from kfbot.search.stopping import RunStopped, shielded, stop_on

ROOT = Path(__file__).resolve().parents[2]
CELL = Cell("global", "none", "thread-per-element", "128")
ORIGINAL = Individual("original", None, 0, CELL, 1.0, "done", "the original", "original", 0)


# --- the arithmetic -------------------------------------------------------------------


def test_a_generation_takes_its_slowest_build_and_every_gpu_evaluation() -> None:
    pace = Pace()
    assert not pace.known and pace.generation_s(8) == 0.0
    pace.evaluated(3.0, 1.0)
    pace.evaluated(1.0, 2.0)
    assert pace.generation_s(4) == 3.0 + 4 * 1.5  # builds side by side, the GPU in turn
    assert pace.again_s() == 1.0 + 2.0  # a built candidate timed once more
    pace.generation(2, 20.0)  # what was measured wins over the model: 10 s a candidate
    assert pace.generation_s(4) == 40.0


def test_room_counts_from_the_run_start_and_keeps_the_reserve() -> None:
    now = [100.0]
    budget = Budget(Limits(seconds=60), clock=lambda: now[0], started=90.0, reserve_s=5.0)
    assert budget.seconds == 10.0  # the set-up before the search counts
    assert budget.room(8) == (8, "")  # nothing measured yet: the first generation shows it
    budget.pace.evaluated(4.0, 2.0)  # a generation of k: 4 + 2k s; reserve 2 * 6 + 5 s
    assert budget.room(8) == (8, "")  # 50 s left, 33 usable
    now[0] = 125.0
    assert budget.room(8) == (2, "")  # 25 s left, 8 usable: 4 + 2 * 2 = 8
    now[0] = 138.0
    room, why = budget.room(8)
    assert room == 0
    assert why == ("time nearly spent (12 s of 60 s left; an evaluation takes about 6 s and "
                   "17 s are kept to confirm the best and finish)")
    assert Budget(Limits(), clock=lambda: now[0]).room(8) == (8, "")  # no time limit


@pytest.mark.parametrize(("given", "searched"), [
    (None, 6 * 3600 - 900),  # GitHub's job limit, less the largest margin
    (50 * 60, 45 * 60),  # 10 %
    (600, 480),  # at least two minutes
    (100, 50),  # and never less than half
])
def test_the_action_keeps_a_margin_below_the_jobs_time(given: float | None,
                                                       searched: float) -> None:
    assert search_seconds(given) == searched


class Clocked:
    """Evaluations that take simulated time: the slowest build of a batch, then each
    candidate's GPU time in turn."""

    def __init__(self, build_s: float, gpu_s: float) -> None:
        self.now = 0.0
        self.build_s, self.gpu_s = build_s, gpu_s
        self.count = 0

    def propose(self, island: int, parent: Individual, rng: random.Random) -> list[Candidate]:
        self.count += 1
        return [Candidate(params={"N": str(self.count), "I": str(i)}, origin="params")
                for i in range(2)]

    def evaluate(self, cands: Sequence[Candidate]) -> Iterable[tuple[Candidate, Outcome]]:
        self.now += self.build_s
        for cand in cands:
            self.now += self.gpu_s
            yield cand, Outcome(CELL, 1.1, "done", "correct")


def test_the_search_starts_no_generation_that_cannot_finish() -> None:
    work = Clocked(build_s=4.0, gpu_s=1.5)
    budget = Budget(Limits(seconds=60.0), clock=lambda: work.now, reserve_s=5.0)
    through = IslandSearch(ORIGINAL, work.propose, _charged(work, budget), budget,
                           SearchSettings(islands=4, batch=2, seed=1))
    result = through.run()
    assert result.stopped.startswith("time nearly spent")
    # The winner's second evaluation and held-out timing (4 + 1.5 s each) still fit.
    assert work.now + 2 * 5.5 + 5.0 <= 60.0
    assert len(result.history) >= 16  # and the time was used: two full generations and more


def _charged(work: Clocked, budget: Budget
             ) -> Callable[[Sequence[Candidate]], Iterable[tuple[Candidate, Outcome]]]:
    def evaluate(cands: Sequence[Candidate]) -> Iterable[tuple[Candidate, Outcome]]:
        for cand, outcome in work.evaluate(cands):
            budget.pace.evaluated(work.build_s, work.gpu_s)
            yield cand, outcome
    return evaluate


# --- stopping -------------------------------------------------------------------------


def test_a_signal_stops_the_run_where_it_waits_and_stops_the_compilers_first() -> None:
    stopped: list[str] = []
    # What this process had before (a Ray node started by an earlier test of the same
    # worker leaves a handler of its own): the run must put that back.
    before = signal.getsignal(signal.SIGTERM)
    with pytest.raises(RunStopped) as caught, stop_on(on_stop=lambda: stopped.append("x")):
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(5)  # a wait (a GPU job, a build): the signal ends it
    assert caught.value.reason == "SIGTERM received" and caught.value.exit_code == 143
    assert stopped == ["x"]
    assert signal.getsignal(signal.SIGTERM) == before  # restored


def test_the_time_limit_stops_the_run_at_its_end() -> None:
    started = time.monotonic()
    with pytest.raises(RunStopped) as caught, stop_on(limit_s=0.3, started=started):
        time.sleep(5)
    took = time.monotonic() - started
    assert 0.25 < took < 2.0
    assert caught.value.reason == "the time limit (0.3 s) was reached"
    assert signal.getitimer(signal.ITIMER_REAL) == (0.0, 0.0)  # disarmed


def test_a_report_being_written_is_finished_before_a_stop() -> None:
    written: list[str] = []
    with pytest.raises(RunStopped) as caught, stop_on():
        with shielded():
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(0.2)
            written.append("report")
        written.append("after")  # never: the stop is raised once the report is whole
    assert written == ["report"] and caught.value.reason == "SIGTERM received"
    started = time.monotonic()
    with stop_on(limit_s=0.1, started=started), shielded():
        time.sleep(0.5)  # the limit comes while the result is written: the run is done
    assert not written[1:]


# --- a replayed search in a real process ----------------------------------------------


@pytest.fixture(scope="module")
def learned(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """A git copy of a fixture, and what its replayed search proposes (learnt once)."""
    base = tmp_path_factory.mktemp("replayed")
    repo = base / "repo"
    shutil.copytree(ROOT / "fixtures" / "load_elementwise", repo)
    made = git.Repo.init(repo)
    made.git.add("-A")
    made.git.commit("-m", "initial", author="Dev <dev@example.com>",
                    env={"GIT_COMMITTER_NAME": "Dev", "GIT_COMMITTER_EMAIL": "dev@example.com"})
    runs = base / "learn"
    done = _replay(repo, runs)
    assert done.returncode == 0, done.stderr
    return repo, runs / "learned.json"


def _replay(repo: Path, runs: Path, *timing: str) -> subprocess.CompletedProcess[str]:
    command = [sys.executable, str(ROOT / "tests" / "replay_search.py"), str(repo),
               "gelu_kernel", "40", str(runs), *timing]
    return subprocess.run(command, capture_output=True, text=True, timeout=300,
                          env={**os.environ, "PYTHONPATH": str(ROOT)})


def _start(repo: Path, runs: Path, *timing: str) -> subprocess.Popen[str]:
    command = [sys.executable, str(ROOT / "tests" / "replay_search.py"), str(repo),
               "gelu_kernel", "40", str(runs), *timing]
    return subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, env={**os.environ, "PYTHONPATH": str(ROOT)})


def _logged(runs: Path) -> list[dict[str, object]]:
    path = runs / "replayed" / "evaluations.jsonl"
    if not path.is_file():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def test_sigterm_mid_search_writes_what_is_verified_and_resume_continues(
        learned: tuple[Path, Path], tmp_path: Path) -> None:
    repo, knowledge = learned
    runs = tmp_path / "runs"
    runs.mkdir()
    shutil.copy(knowledge, runs / "learned.json")
    proc = _start(repo, runs, "0.5")  # a generation of 4: (3 + 4 * 1.25) * 0.5 = 4 s
    deadline = time.monotonic() + 120
    while not any(float(str(e["fitness"] or 0)) > 1.0 for e in _logged(runs)):
        assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
        time.sleep(0.1)
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 128 + signal.SIGTERM, (out, err)
    folder = runs / "replayed"
    record = json.loads((folder / "report.json").read_text())
    assert record["interrupted"] == "SIGTERM received" and record["candidate"] is None
    logged = {str(e["hash"]): float(str(e["fitness"] or 0)) for e in _logged(runs)}
    named = record["unconfirmed"]["candidate"]  # the fastest a branch could hold (files only)
    assert record["unconfirmed"]["speedup_in_search"] == pytest.approx(logged[named])
    assert logged[named] > 1.0
    report = (folder / "report.md").read_text()
    assert "nothing confirmed yet" in report and named[:10] in report
    assert "+++ b/csrc/gelu_kernel.cu" in (folder / "unconfirmed.patch").read_text()
    assert not (folder / "best.patch").exists()

    resumed = _replay(repo, runs)  # the same run folder: the log is replayed, not redone
    assert resumed.returncode == 0, resumed.stderr
    after = _logged(runs)
    assert [str(e["hash"]) for e in after[:len(logged)]] == list(logged)
    assert len({e["hash"] for e in after}) == len(after)
    record = json.loads((folder / "report.json").read_text())
    assert record["interrupted"] is None and record["candidate"] is not None
    assert (folder / "best.patch").is_file() and not (folder / "unconfirmed.patch").exists()


def test_a_time_limit_ends_the_run_within_one_evaluation(
        learned: tuple[Path, Path], tmp_path: Path) -> None:
    repo, knowledge = learned
    runs = tmp_path / "runs"
    runs.mkdir()
    shutil.copy(knowledge, runs / "learned.json")
    done = _replay(repo, runs, "0.3", "12")  # a generation of 4: 2.4 s; limit 12 s
    assert done.returncode == 0, done.stderr  # stopped in time, not by the hard stop
    last = done.stdout.strip().splitlines()[-1]
    assert "stopped: time nearly spent" in last
    took = float(last.rsplit("took ", 1)[1].removesuffix(" s"))
    assert took <= 12.0 + (3 + 1.25) * 0.3  # the limit and at most one evaluation more
    record = json.loads((runs / "replayed" / "report.json").read_text())
    assert record["candidate"] is not None  # the winner was confirmed within the limit
