"""Where evaluations run: the seam between the search and the GPUs.

    executor = EngineExecutor(engine)          # one GPU, this machine (the default)
    for cand, ev in executor.evaluate(batch):  # in the order given, whatever finished first
        ...

The search hands a whole generation to `evaluate` and reads the results back in the
order it gave them, so its result for a given seed and evaluation record sequence does
not depend on which executor ran them, or on how many GPUs did: one GPU (this module),
one worker per local GPU, Ray actors across machines, or a replay of recorded results.
An original and a candidate that are compared with each other are always timed by the
same engine, on one GPU, in one worker session.
"""

from __future__ import annotations

import dataclasses
import os
import queue
import sys
import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Protocol

from kfbot.errors import EXIT_MISSING_TOOL, KfbotError
from kfbot.evaluate.build import Builder
from kfbot.evaluate.candidate import Candidate
from kfbot.evaluate.engine import Engine, EngineSettings
from kfbot.evaluate.evaluation import Evaluation, failed
from kfbot.evaluate.task import KernelTask


class Executor(Protocol):
    """Evaluates batches of candidates; results come back in the order given."""

    def evaluate(self, candidates: Sequence[Candidate]) -> list[tuple[Candidate, Evaluation]]:
        ...

    def close(self) -> None:
        ...


class BatchEngine(Protocol):
    """What `EngineExecutor` asks of its engine (an `Engine`, or a stand-in in tests)."""

    def evaluate_many(self, candidates: Sequence[Candidate], bench: bool = True
                      ) -> Iterator[tuple[Candidate, Evaluation]]:
        ...


class EngineExecutor:
    """One engine (one GPU, one worker): builds on every core, GPU work in turn."""

    def __init__(self, engine: BatchEngine) -> None:
        self.engine = engine

    def evaluate(self, candidates: Sequence[Candidate]) -> list[tuple[Candidate, Evaluation]]:
        done = {cand.hash: ev for cand, ev in self.engine.evaluate_many(candidates)}
        return [(cand, done[cand.hash]) for cand in candidates]

    def close(self) -> None:
        """The engine belongs to the caller, who closes it."""


class ReplayExecutor:
    """Answers from recorded evaluations (by candidate hash), as a run once did.

    Used to prove that the search does not depend on the executor, and to replay a
    run without a GPU. A candidate that was never recorded gets a `runtime` failure
    saying so, so a replay that drifts from its record is visible, not silent.
    """

    def __init__(self, records: Mapping[str, Evaluation]) -> None:
        self.records = dict(records)
        self.asked: list[str] = []

    def evaluate(self, candidates: Sequence[Candidate]) -> list[tuple[Candidate, Evaluation]]:
        out = []
        for cand in candidates:
            self.asked.append(cand.hash)
            ev = self.records.get(cand.hash) or failed(
                cand.hash, "runtime", "not in the recorded run being replayed")
            out.append((cand, ev))
        return out

    def close(self) -> None:
        """Nothing to release."""



def engines_per_gpu(task: KernelTask, settings: EngineSettings,
                    first: Engine | None = None) -> Callable[[int], Engine]:
    """An engine factory for `LocalGpuExecutor`: one engine per GPU, one shared builder.

    `first`, when given, is reused for its own GPU (it has probed and run the baseline
    there already) instead of starting a second worker on that GPU.
    """
    builder = first.builder if first is not None else Builder(settings.cache_dir / "build")

    def engine_for(gpu: int) -> Engine:
        if first is not None and first.settings.gpu == gpu:
            return first
        return Engine(task, dataclasses.replace(settings, gpu=gpu), builder=builder)

    return engine_for


class GpuEngine(Protocol):
    """What `LocalGpuExecutor` asks of the engine pinned to one GPU."""

    def probe(self) -> Mapping[str, Any]:
        ...

    def prepare(self, candidate: Candidate) -> Any:
        ...

    def evaluate(self, candidate: Candidate, bench: bool = True, *, prepared: Any = None
                 ) -> Evaluation:
        ...

    def __exit__(self, *exc: object) -> None:
        ...


# A worker that cannot even start never loaded the candidate: the GPU is at fault.
_GPU_FAULT_KINDS = frozenset({"startup"})


@dataclass
class _Job:
    index: int
    candidate: Candidate
    prepared: Any = None  # its static checks and build, made in the pool
    tried: set[int] = field(default_factory=set)
    suspect: tuple[int, Evaluation] | None = None  # a runtime failure on that GPU


@dataclass(frozen=True)
class _Ran:
    gpu: int
    job: _Job
    evaluation: Evaluation | None
    error: str = ""  # the engine raised: its GPU is unusable


class LocalGpuExecutor:
    """One evaluation worker per local GPU; builds share every CPU core.

    A candidate's static checks and build are made in a pool of threads and handed to
    the GPU's thread, which then only runs it: the GPU does not wait on CPU work that
    could have been done while it was busy.

    Each GPU has its own engine, so a candidate is always timed against the original
    in that GPU's worker session. A GPU whose worker cannot start or whose engine
    fails is taken out for the rest of the run and its candidate goes to another.
    A candidate that crashes its worker (an illegal address, a hang) is run once more
    on another GPU: failing at runtime there too makes it the candidate's fault and
    the failure is recorded; passing there makes it the first GPU's fault, and that
    GPU is taken out. So a bad kernel never takes GPUs out one after another.
    """

    def __init__(self, gpus: Sequence[int], engine_for: Callable[[int], GpuEngine],
                 build_threads: int | None = None,
                 note: Callable[[str], None] | None = None) -> None:
        if not gpus:
            raise KfbotError("no GPU to evaluate on")
        self.engines = {gpu: engine_for(gpu) for gpu in gpus}
        self.live = list(gpus)
        self.ran: dict[int, list[str]] = {gpu: [] for gpu in gpus}  # candidate hashes
        self.build_threads = build_threads or max(1, (os.cpu_count() or 2) // 2)
        self._note = note or _stderr
        self._probed: set[int] = set()
        self._why_out: dict[int, str] = {}
        # Preparing is the same on every engine (they share one builder): any one does.
        self._preparer = next(iter(self.engines.values()))

    def evaluate(self, candidates: Sequence[Candidate]) -> list[tuple[Candidate, Evaluation]]:
        if not candidates:
            return []
        jobs = [_Job(i, c) for i, c in enumerate(candidates)]
        done: dict[int, Evaluation] = {}
        events: queue.Queue[_Ran | Future[object]] = queue.Queue()
        inboxes = {gpu: self._start_gpu(gpu, events) for gpu in self.live}
        try:
            with ThreadPoolExecutor(max_workers=self.build_threads) as pool:
                self._schedule(jobs, done, events, inboxes, pool)
        finally:
            for inbox in inboxes.values():
                inbox.put(None)
        return [(c, done[i]) for i, c in enumerate(candidates)]

    def close(self) -> None:
        for engine in self.engines.values():
            engine.__exit__(None, None, None)

    # --- scheduling: one thread decides, the GPU threads only run what they are given

    def _schedule(self, jobs: list[_Job], done: dict[int, Evaluation],
                  events: queue.Queue[_Ran | Future[object]],
                  inboxes: Mapping[int, queue.Queue[_Job | None]],
                  pool: ThreadPoolExecutor) -> None:
        builds = {pool.submit(self._preparer.prepare, j.candidate): j for j in jobs}
        for future in builds:
            future.add_done_callback(events.put)
        ready: list[_Job] = []
        busy: set[int] = set()
        while len(done) < len(jobs):
            self._assign(ready, busy, done, inboxes)
            event = events.get()
            if isinstance(event, Future):
                job = builds[event]
                job.prepared = event.result()  # one that raised is a bug: let it surface
                ready.append(job)
                continue
            busy.discard(event.gpu)
            self._settle(event, ready, done)

    def _assign(self, ready: list[_Job], busy: set[int], done: dict[int, Evaluation],
                inboxes: Mapping[int, queue.Queue[_Job | None]]) -> None:
        for job in list(ready):
            untried = [g for g in self.live if g not in job.tried]
            if untried or not job.suspect:
                continue
            ready.remove(job)  # no other GPU left to try it on: its failure stands
            done[job.index] = job.suspect[1]
        if not self.live:
            raise KfbotError("every GPU failed: " + "; ".join(
                f"GPU {g}: {why}" for g, why in self._why_out.items()), EXIT_MISSING_TOOL)
        for gpu in self.live:
            if gpu in busy:
                continue
            todo = next((j for j in ready if gpu not in j.tried), None)
            if todo is not None:
                ready.remove(todo)
                todo.tried.add(gpu)
                busy.add(gpu)
                inboxes[gpu].put(todo)

    def _settle(self, ran: _Ran, ready: list[_Job], done: dict[int, Evaluation]) -> None:
        job, ev = ran.job, ran.evaluation
        if ran.gpu not in self.live:  # taken out while this ran: do not trust its answer
            ready.append(job)
        elif ev is None or _runtime_kind(ev) in _GPU_FAULT_KINDS:
            self._take_out(ran.gpu, ran.error or (ev.reason if ev else "failed"))
            ready.append(job)
        elif ev.stage == "runtime" and job.suspect is None:
            job.suspect = (ran.gpu, ev)
            ready.append(job)  # once more, on another GPU, to see whose fault it is
        else:
            if job.suspect is not None and ev.stage != "runtime":
                gpu, first = job.suspect
                self._take_out(gpu, f"{first.reason} (candidate {job.candidate.short} ran "
                                    f"on GPU {ran.gpu} without it)")
            done[job.index] = ev
            self.ran[ran.gpu].append(job.candidate.hash)

    def _take_out(self, gpu: int, why: str) -> None:
        if gpu in self.live:
            self.live.remove(gpu)
            self._why_out[gpu] = why
            left = ", ".join(str(g) for g in self.live) or "none"
            self._note(f"kfbot: GPU {gpu} is taken out of this run: {why}; "
                       f"its work goes to the GPUs left ({left})")

    # --- the GPU threads -------------------------------------------------------------

    def _start_gpu(self, gpu: int, events: queue.Queue[_Ran | Future[object]]
                   ) -> queue.Queue[_Job | None]:
        inbox: queue.Queue[_Job | None] = queue.Queue()
        threading.Thread(target=self._gpu_loop, args=(gpu, inbox, events),
                         name=f"kfbot-gpu-{gpu}", daemon=True).start()
        return inbox

    def _gpu_loop(self, gpu: int, inbox: queue.Queue[_Job | None],
                  events: queue.Queue[_Ran | Future[object]]) -> None:
        engine = self.engines[gpu]
        while (job := inbox.get()) is not None:
            try:
                if gpu not in self._probed:
                    engine.probe()
                    self._probed.add(gpu)
                evaluation = engine.evaluate(job.candidate, prepared=job.prepared)
                events.put(_Ran(gpu, job, evaluation))
            except Exception as exc:  # whatever the engine raised, its GPU is unusable
                events.put(_Ran(gpu, job, None, str(exc) or type(exc).__name__))


def _runtime_kind(ev: Evaluation) -> str | None:
    """The worker's failure kind ("startup", "illegal_address", ...) of a runtime failure."""
    if ev.stage != "runtime":
        return None
    return next((d.kind for d in reversed(ev.diagnostics) if d.stage == "runtime"), None)


def _stderr(text: str) -> None:
    print(text, file=sys.stderr, flush=True)
