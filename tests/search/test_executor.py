"""The executor seam on CPU: stand-in GPUs (engines that sleep, note their GPU and fail
on demand) behind the real queueing, re-queueing and ordering of `LocalGpuExecutor`,
and the search giving the same answer through every executor."""

from __future__ import annotations

import os
import random
import subprocess
import sys
import threading
import time
from collections.abc import Iterator, Sequence
from pathlib import Path

import pytest

from kfbot.errors import KfbotError
from kfbot.evaluate.candidate import Candidate
from kfbot.evaluate.evaluation import Evaluation, failed
from kfbot.evaluate.model import Diagnostic
from kfbot.search.budget import Budget, Limits
from kfbot.search.evolution.archive import Individual
from kfbot.search.evolution.islands import IslandSearch, Outcome, SearchResult, SearchSettings
from kfbot.search.executors.gpus import choose_gpus, visible_gpus
from kfbot.search.executors.local import EngineExecutor, Executor, LocalGpuExecutor, ReplayExecutor
from kfbot.search.model import Cell
from kfbot.search.runner import through

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures"
SIZES = (1, 2, 3, 4, 5, 6, 7, 8)
CELL = Cell("global", "none", "thread-per-element", "128")


def cand(x: int, y: int) -> Candidate:
    return Candidate(params={"X": str(x), "Y": str(y)}, origin="params")


SPACE = {cand(x, y).hash: (x, y) for x in SIZES for y in SIZES}


def recorded(c: Candidate) -> Evaluation:
    """The record of a run: best at (5, 3); x == 8 fails its reference."""
    x, y = SPACE[c.hash]
    if x == 8:
        return failed(c.hash, "correctness", "tail block differs")
    return Evaluation(c.hash, "done", True, f"{2.0 - abs(x - 5) * 0.2 - abs(y - 3) * 0.1:.2f}")


RECORDS = {h: recorded(cand(*xy)) for h, xy in SPACE.items()}


def crashed(c: Candidate, kind: str, why: str) -> Evaluation:
    return failed(c.hash, "runtime", why, [Diagnostic("runtime", kind, why)])


class StandInGpu:
    """An engine on one stand-in GPU: answers from the record after a short sleep.

    `dies_after`: after that many evaluations its worker no longer starts;
    `bad_probe`: it has no usable GPU; `crashes`: candidates whose code kills its
    worker; `sticky`: after that many evaluations every job dies with a CUDA error.
    """

    def __init__(self, gpu: int, seed: int = 0, dies_after: int | None = None,
                 bad_probe: bool = False, crashes: frozenset[str] = frozenset(),
                 sticky: int | None = None, delay: float | None = None) -> None:
        self.gpu, self.dies_after, self.bad_probe = gpu, dies_after, bad_probe
        self.delay = delay
        self.crashes, self.sticky = crashes, sticky
        self.rng = random.Random(seed * 100 + gpu)
        self.evaluated: list[str] = []
        self.finished: list[tuple[float, str]] = []
        self.prepared_in: list[str] = []  # the threads that prepared candidates
        self.closed = False
        self.lock = threading.Lock()

    def probe(self) -> dict[str, object]:
        if self.bad_probe:
            raise KfbotError("no CUDA GPU: device lost")
        return {"cuda": True, "gpu": self.gpu}

    def prepare(self, candidate: Candidate) -> object:
        with self.lock:
            self.prepared_in.append(threading.current_thread().name)
        return ("prepared", candidate.hash)

    def evaluate(self, candidate: Candidate, bench: bool = True, *, prepared: object = None
                 ) -> Evaluation:
        # The GPU's thread only runs what the pool made for this very candidate.
        assert prepared == ("prepared", candidate.hash)
        time.sleep(self.rng.uniform(0.0, 0.004) if self.delay is None else self.delay)
        with self.lock:
            self.evaluated.append(candidate.hash)
            self.finished.append((time.monotonic(), candidate.hash))
            n = len(self.evaluated)
        if self.dies_after is not None and n > self.dies_after:
            return crashed(candidate, "startup", "worker failed to start: CUDA init failed")
        if self.sticky is not None and n > self.sticky:
            return crashed(candidate, "exception", "RuntimeError: CUDA error: unknown error")
        if candidate.hash in self.crashes:
            return crashed(candidate, "illegal_address",
                           "worker died with SIGABRT after a CUDA error (illegal_address)")
        return RECORDS[candidate.hash]

    def evaluate_many(self, candidates: Sequence[Candidate], bench: bool = True
                      ) -> Iterator[tuple[Candidate, Evaluation]]:
        order = list(candidates)
        self.rng.shuffle(order)  # builds finish in any order
        for c in order:
            yield c, self.evaluate(c, prepared=self.prepare(c))

    def __exit__(self, *exc: object) -> None:
        self.closed = True


def local(*gpus: StandInGpu, notes: list[str] | None = None) -> LocalGpuExecutor:
    by_gpu = {g.gpu: g for g in gpus}
    return LocalGpuExecutor(list(by_gpu), by_gpu.__getitem__, build_threads=2,
                            note=(notes if notes is not None else []).append)


BATCH = [cand(x, y) for x in SIZES[:4] for y in SIZES[:4]]


def test_results_come_back_in_the_order_given_and_every_gpu_works() -> None:
    a, b = StandInGpu(0, delay=0.0), StandInGpu(1, delay=0.02)  # a slow one, a fast one
    ex = local(a, b)
    results = ex.evaluate(BATCH)
    assert [c for c, _ in results] == BATCH
    assert all(ev == RECORDS[c.hash] for c, ev in results)
    assert a.evaluated and b.evaluated
    assert sorted(a.evaluated + b.evaluated) == sorted(c.hash for c in BATCH)
    finished = [h for _, h in sorted(a.finished + b.finished)]
    assert finished != [c.hash for c in BATCH]  # they finished out of order
    assert set(ex.ran[0]) == set(a.evaluated) and set(ex.ran[1]) == set(b.evaluated)
    # Checks and builds ran in the pool, once per candidate, never on a GPU's thread.
    threads = a.prepared_in + b.prepared_in
    assert len(threads) == len(BATCH)
    assert not any(name.startswith("kfbot-gpu-") for name in threads)
    ex.close()
    assert a.closed and b.closed


def test_a_gpu_that_dies_is_taken_out_and_its_work_requeued() -> None:
    notes: list[str] = []
    a, b = StandInGpu(0, dies_after=3), StandInGpu(1)
    ex = local(a, b, notes=notes)
    results = ex.evaluate(BATCH)
    assert [ev for _, ev in results] == [RECORDS[c.hash] for c in BATCH]
    assert ex.live == [1]
    assert len(notes) == 1 and "GPU 0 is taken out" in notes[0] and "CUDA init" in notes[0]
    assert len(a.evaluated) == 4  # three answers and the one that found it dead
    more = [cand(x, 8) for x in SIZES[:3]]
    assert [ev for _, ev in ex.evaluate(more)] == [RECORDS[c.hash] for c in more]
    assert len(a.evaluated) == 4 and len(notes) == 1  # the run goes on without it


def test_a_gpu_whose_probe_fails_is_taken_out() -> None:
    notes: list[str] = []
    a, b = StandInGpu(0), StandInGpu(1, bad_probe=True)
    ex = local(a, b, notes=notes)
    assert [ev for _, ev in ex.evaluate(BATCH)] == [RECORDS[c.hash] for c in BATCH]
    assert ex.live == [0] and not b.evaluated and "device lost" in notes[0]


def test_every_gpu_failing_is_a_clear_error() -> None:
    ex = local(StandInGpu(0, dies_after=1), StandInGpu(1, bad_probe=True))
    with pytest.raises(KfbotError, match=r"every GPU failed: .*GPU 1: no CUDA GPU: device "
                                         r"lost") as err:
        ex.evaluate(BATCH)
    assert "GPU 0: worker failed to start" in str(err.value)


def test_a_candidate_that_crashes_every_gpu_is_its_own_fault() -> None:
    bad = BATCH[5]
    notes: list[str] = []
    a, b = StandInGpu(0, crashes=frozenset({bad.hash})), StandInGpu(1, crashes=frozenset({
        bad.hash}))
    ex = local(a, b, notes=notes)
    results = dict((c.hash, ev) for c, ev in ex.evaluate(BATCH))
    assert results[bad.hash].stage == "runtime" and "illegal_address" in results[bad.hash].reason
    assert bad.hash in a.evaluated and bad.hash in b.evaluated  # tried on both, once each
    assert ex.live == [0, 1] and not notes
    assert all(results[c.hash] == RECORDS[c.hash] for c in BATCH if c != bad)


def test_a_crash_that_another_gpu_does_not_repeat_is_the_gpus_fault() -> None:
    notes: list[str] = []
    a, b = StandInGpu(0, sticky=2), StandInGpu(1)
    ex = local(a, b, notes=notes)
    assert [ev for _, ev in ex.evaluate(BATCH)] == [RECORDS[c.hash] for c in BATCH]
    assert ex.live == [1] and len(notes) == 1 and "CUDA error: unknown error" in notes[0]


def test_with_one_gpu_a_crash_is_recorded_without_a_second_try() -> None:
    bad = BATCH[0]
    a = StandInGpu(0, crashes=frozenset({bad.hash}))
    ex = local(a)
    results = ex.evaluate(BATCH)
    assert results[0][1].stage == "runtime" and a.evaluated.count(bad.hash) == 1
    assert ex.live == [0]


# --- the same search through every executor ------------------------------------------

ORIGINAL = Individual("original", None, 0, CELL, 1.0, "done", "the original", "original", 0)


def propose(island: int, parent: Individual, rng: random.Random) -> list[Candidate]:
    x, y = SPACE.get(parent.hash, (1, 1))
    moves = [(x + dx, y + dy) for dx, dy in ((1, 0), (-1, 0), (0, 1), (0, -1))
             if x + dx in SIZES and y + dy in SIZES]
    moves.append((rng.choice(SIZES), rng.choice(SIZES)))
    rng.shuffle(moves)
    return [cand(*m) for m in moves]


def outcome_of(c: Candidate, ev: Evaluation) -> Outcome:
    return Outcome(CELL if ev.ok else Cell("global", "none", "failed", "0"),
                   float(ev.reason) if ev.ok else None, ev.stage, ev.reason)


def search_with(executor: Executor, evals: int = 40, seed: int = 11) -> SearchResult:
    search = IslandSearch(ORIGINAL, propose, through(executor, outcome_of, {}),
                          Budget(Limits(evaluations=evals)),
                          SearchSettings(islands=3, migrate_every=2, batch=3, seed=seed))
    return search.run()


def test_the_search_does_not_depend_on_the_executor() -> None:
    runs = {
        "replay": search_with(ReplayExecutor(RECORDS)),
        "engine": search_with(EngineExecutor(StandInGpu(0, seed=1))),
        "one gpu": search_with(local(StandInGpu(0, seed=2))),
        "two gpus": search_with(local(StandInGpu(0, seed=3), StandInGpu(1, seed=4))),
        "a gpu dies": search_with(local(StandInGpu(0, seed=5), StandInGpu(1, dies_after=5))),
    }
    first = runs["replay"]
    assert len(first.history) == 40 and first.best is not None
    for name, run in runs.items():
        assert run.history == first.history, name
        assert run.best == first.best and run.stopped == first.stopped, name
    assert search_with(ReplayExecutor(RECORDS), seed=12).history != first.history


# --- which GPUs ----------------------------------------------------------------------

SMI = """GPU 0: NVIDIA H100 80GB HBM3 (UUID: GPU-1a)
GPU 1: NVIDIA H100 80GB HBM3 (UUID: GPU-2b)
  MIG 1g.10gb     Device  0: (UUID: MIG-3c)
GPU 2: NVIDIA H100 80GB HBM3 (UUID: GPU-4d)
"""


def test_visible_gpus_follow_cuda_visible_devices_then_nvidia_smi() -> None:
    assert visible_gpus({}, SMI) == [0, 1, 2]
    assert visible_gpus({}, "") == []
    assert visible_gpus({"CUDA_VISIBLE_DEVICES": "2,3"}, SMI) == [2, 3]
    assert visible_gpus({"CUDA_VISIBLE_DEVICES": ""}, SMI) == []
    assert visible_gpus({"CUDA_VISIBLE_DEVICES": "1,-1,0"}, SMI) == [1]  # CUDA stops at -1
    with pytest.raises(KfbotError, match="not UUIDs"):
        visible_gpus({"CUDA_VISIBLE_DEVICES": "GPU-1a"}, SMI)


def test_gpus_option_picks_indices_and_refuses_bad_ones() -> None:
    assert choose_gpus(None, [2, 3]) == [2, 3]
    assert choose_gpus("1", [2, 3]) == [3]
    assert choose_gpus("0, 2", [0, 1, 2]) == [0, 2]
    with pytest.raises(KfbotError, match=r"--gpus 0,x: 'x' is not a GPU index"):
        choose_gpus("0,x", [0, 1])
    with pytest.raises(KfbotError, match=r"no GPU 2 here \(visible GPU indices: 0, 1\)"):
        choose_gpus("0,2", [0, 1])
    with pytest.raises(KfbotError, match="visible GPU indices: none"):
        choose_gpus("0", [])
    with pytest.raises(KfbotError, match="GPU 1 is named twice"):
        choose_gpus("1,1", [0, 1])


def kfbot(*args: str, cwd: Path, pythonpath: str = "") -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "ANTHROPIC_API_KEY"}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (pythonpath, env.get("PYTHONPATH")) if p)
    return subprocess.run([sys.executable, "-m", "kfbot", *args], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=120)


def test_cli_refuses_bad_gpus_and_a_missing_ray(tmp_path: Path) -> None:
    repo = FIXTURES / "example"
    bad = kfbot("optimize", "--gpus", "0,zero", cwd=repo)
    assert bad.returncode == 2 and "'zero' is not a GPU index" in bad.stderr
    both = kfbot("optimize", "--gpu", "0", "--gpus", "0", cwd=repo)
    assert both.returncode == 2 and "--gpu and --gpus both given" in both.stderr
    (tmp_path / "ray").mkdir()
    (tmp_path / "ray" / "__init__.py").write_text("raise ImportError('no ray here')\n")
    no_ray = kfbot("optimize", "--executor", "ray", cwd=repo, pythonpath=str(tmp_path))
    assert no_ray.returncode == 3 and "pip install 'kfbot[ray]'" in no_ray.stderr
    local = kfbot("optimize", "--build-cpus", "4", cwd=repo)
    assert local.returncode == 2 and "--build-cpus is for --executor ray" in local.stderr
