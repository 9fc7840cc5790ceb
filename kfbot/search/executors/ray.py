"""Evaluations on Ray actors: one GPU each, on any node of a Ray cluster.

    executor = RayExecutor(task, settings, address="ray://head:10001")
    for cand, ev in executor.evaluate(batch):   # input order, as EngineExecutor
        ...
    executor.close()

Each actor holds one engine (`num_gpus=1`, so Ray gives it one GPU and sets its
CUDA_VISIBLE_DEVICES) and evaluates chunks of a batch; builds run on the actor's
node, on its cores, cached under `settings.cache_dir` there. With `build_cpus`, builds
run instead as Ray tasks that ask for CPUs and no GPU, so Ray may place them on
CPU-only nodes: each returns the compiled objects and linked module of its chunk,
which the GPU actor puts into its own build cache before it evaluates (a build task
that fails or is lost costs nothing but time: the actor builds for itself). Before
the search, `preflight` asks one actor for the device, the original's baseline and the
test-adequacy gate, so the driver needs no GPU of its own. The task's source tree
is shipped with the actor: a node that holds the same files at the same path uses them
in place (and shares the build cache), any other node unpacks them into a temporary
folder and evaluates there. An actor or node lost mid-run costs only the chunk it
held: the chunk is retried on a fresh actor, at most `max_tries` times, and then
recorded as a `runtime` failure that says why.

Ray is an optional extra (`pip install 'kfbot[ray]'`); it is imported only here and
only when a RayExecutor is made.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import importlib
import io
import math
import os
import tarfile
import tempfile
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from types import ModuleType
from typing import Any, Protocol

from kfbot.anticheat.adequacy import Adequacy
from kfbot.errors import EXIT_MISSING_TOOL, KfbotError
from kfbot.evaluate.build import Builder, BuildRequest
from kfbot.evaluate.candidate import Candidate
from kfbot.evaluate.engine import Engine, EngineSettings, Prepared
from kfbot.evaluate.evaluation import Evaluation, failed
from kfbot.evaluate.task import KernelTask

SOURCE_LIMIT = 64 << 20  # bytes of source shipped with each actor; raise it with source_limit
# Folders that hold outputs, caches or history, never what a build needs.
SKIPPED_DIRS = frozenset({".git", ".kfbot", "__pycache__", "build", "dist", ".venv", "venv",
                          "node_modules", ".mypy_cache", ".pytest_cache", ".ruff_cache"})
# What a lost actor or node raises in ray.get; anything else is a bug and is raised.
LOST = ("RayActorError", "ActorDiedError", "ActorUnavailableError", "WorkerCrashedError",
        "NodeDiedError", "ObjectLostError", "OwnerDiedError")


def ray_module() -> ModuleType:
    """Ray, or a KfbotError that says how to install it."""
    try:
        return importlib.import_module("ray")
    except ImportError as exc:
        raise KfbotError("the Ray executor needs Ray: pip install 'kfbot[ray]'",
                         EXIT_MISSING_TOOL) from exc


class Evaluator(Protocol):
    """What an actor holds: the Engine, or a stand-in with the same methods."""

    def evaluate_many(self, candidates: Sequence[Candidate]
                      ) -> Iterable[tuple[Candidate, Evaluation]]:
        ...

    def probe(self) -> dict[str, Any]:
        ...

    def baseline(self) -> Evaluation:
        ...

    def adequacy(self) -> Adequacy | None:
        ...

    def __exit__(self, *exc: object) -> None:
        ...


EvaluatorFactory = Callable[[KernelTask, EngineSettings], Evaluator]


def engine_factory(task: KernelTask, settings: EngineSettings) -> Evaluator:
    return Engine(task, settings)


# --- the task's source tree, shipped to nodes that lack it ------------------------------


@dataclass(frozen=True)
class SourceBundle:
    """The task root's files as a gzipped tar, with each file's sha256 by path."""

    data: bytes
    manifest: Mapping[str, str]


def pack_source(root: Path, limit: int = SOURCE_LIMIT) -> SourceBundle:
    files = sorted(_source_files(root))
    size = sum((root / f).stat().st_size for f in files)
    if size > limit:
        raise KfbotError(f"{root}: {size >> 20} MiB of source to ship to Ray nodes, over the "
                         f"{limit >> 20} MiB limit; put the repository at the same path on "
                         "every node and pass ship_source=False")
    buffer = io.BytesIO()
    manifest = {}
    with tarfile.open(fileobj=buffer, mode="w:gz") as tar:
        for rel in files:
            tar.add(root / rel, arcname=rel, recursive=False)
            manifest[rel] = _sha256(root / rel)
    return SourceBundle(buffer.getvalue(), manifest)


def _source_files(root: Path) -> Iterable[str]:
    for folder, dirs, names in os.walk(root):
        dirs[:] = [d for d in dirs if d not in SKIPPED_DIRS and not d.endswith(".egg-info")]
        for name in names:
            path = Path(folder) / name
            if path.is_file() and not path.is_symlink():
                yield path.relative_to(root).as_posix()


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def place_source(bundle: SourceBundle, root: Path) -> Path:
    """`root` when it holds the shipped files unchanged, else a fresh unpacked copy."""
    if all((root / rel).is_file() and _sha256(root / rel) == digest
           for rel, digest in bundle.manifest.items()):
        return root
    target = Path(tempfile.mkdtemp(prefix="kfbot-task-"))
    with tarfile.open(fileobj=io.BytesIO(bundle.data), mode="r:gz") as tar:
        if hasattr(tarfile, "data_filter"):  # Python 3.10.12+: refuse paths out of target
            tar.extractall(target, filter="data")
        else:
            tar.extractall(target)
    return target


# --- builds on CPU nodes -----------------------------------------------------------------


def build_packs(task: KernelTask, settings: EngineSettings, bundle: SourceBundle | None,
                arch: str | None, candidates: Sequence[Candidate]) -> list[bytes]:
    """A Ray task: build `candidates` here, for the GPU architecture `arch`, and return
    for each what its build left in the cache (objects, and the module if it linked)."""
    root = place_source(bundle, task.root) if bundle is not None else task.root
    builder = Builder(settings.cache_dir / "build", arch=arch)
    engine = Engine(replace(task, root=root), replace(settings, gpu=None), builder)
    requests = [engine.request(cand) for cand in candidates]
    builder.build_many(requests)
    return [pack_build(builder, request) for request in requests]


def pack_build(builder: Builder, request: BuildRequest) -> bytes:
    """The cache files a build of `request` made or used, as a gzipped tar of paths
    relative to the cache: cache keys hold no path of the cache itself, so another
    node's builder with the same toolkit, torch and architecture finds them."""
    try:
        plan = builder.plan(request)
    except Exception:  # a candidate that does not even stage: the GPU node says why
        return b""
    names = [f"{o.key}{suffix}" for o in [*plan.objects, *([plan.shim] if plan.shim else [])]
             for suffix in (".log", ".o")]  # the log first: an object found has its log
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as tar:
        for name in names:
            if (builder.cache_dir / "objects" / name).is_file():
                tar.add(builder.cache_dir / "objects" / name, arcname=f"objects/{name}")
        folder = builder.cache_dir / "artifacts" / plan.link_key
        if folder.is_dir():
            tar.add(folder, arcname=f"artifacts/{plan.link_key}")
    return buffer.getvalue()


def unpack_build(cache_dir: Path, data: bytes) -> int:
    """Puts a shipped build into this node's build cache; files already there are kept
    (the same key is the same content). The number of files added."""
    if not data:
        return 0
    added = 0
    with tarfile.open(fileobj=io.BytesIO(data), mode="r:gz") as tar:
        for member in tar.getmembers():
            target = cache_dir / member.name
            name = Path(member.name)
            if not member.isfile() or name.is_absolute() or ".." in name.parts \
                    or target.exists():
                continue
            source = tar.extractfile(member)
            if source is None:
                continue
            target.parent.mkdir(parents=True, exist_ok=True)
            scratch = target.with_name(f".{target.name}.{os.getpid()}.part")
            scratch.write_bytes(source.read())
            os.replace(scratch, target)  # a concurrent build sees all of it or none
            added += 1
    return added


@dataclass(frozen=True)
class Preflight:
    """What the search needs from a GPU before it starts, measured on an actor."""

    device: dict[str, Any]
    baseline: Evaluation
    gate: Adequacy | None
    node: str = ""

    def adequacy(self) -> Adequacy | None:
        return self.gate


# --- the actor ------------------------------------------------------------------------


class EvalActor:
    """One evaluator on one node; Ray makes it an actor with `ray.remote(num_gpus=1)`."""

    def __init__(self, factory: EvaluatorFactory, task: KernelTask, settings: EngineSettings,
                 bundle: SourceBundle | None) -> None:
        root = place_source(bundle, task.root) if bundle is not None else task.root
        # Ray has set CUDA_VISIBLE_DEVICES to this actor's GPU; a GPU index from the
        # driver's machine would point elsewhere here.
        self.evaluator = factory(replace(task, root=root), replace(settings, gpu=None))
        self.root = root
        self._gpu = threading.Lock()  # one chunk at a time on the GPU; builds overlap it

    def evaluate(self, candidates: Sequence[Candidate],
                 builds: Sequence[Any] = ()) -> list[Evaluation]:
        """`builds`: at most one reference to a build task's packs for `candidates`
        (in a list, so Ray does not wait for it before calling: a lost build is
        built here instead)."""
        started = time.monotonic()
        self._unpack(candidates, builds)
        built = self._build_ahead(candidates)
        ready = time.monotonic()
        with self._gpu:
            held = time.monotonic()
            engine = self.evaluator
            if built is not None and isinstance(engine, Engine):
                out = [engine.evaluate(c, True, prepared=p)
                       for c, p in zip(candidates, built, strict=True)]
            else:
                done = {cand.hash: ev for cand, ev in engine.evaluate_many(candidates)}
                out = [done[cand.hash] for cand in candidates]
        # The chunk's time before the GPU, shared out over its candidates: where an
        # actor's GPU idles between chunks shows here (beside the engine's own phases).
        share = {"actor-prepare": (ready - started) / len(out),
                 "actor-gpu-wait": (held - ready) / len(out)}
        return [replace(ev, phases={**ev.phases, **share}) for ev in out]

    def _build_ahead(self, candidates: Sequence[Candidate]) -> list[Prepared] | None:
        """Checks and builds the chunk while the other chunk in flight holds the GPU,
        so the GPU does not idle through this one's CPU work; what is made here is
        evaluated as it is. None where the evaluator is not an engine or the builds
        could not be made."""
        engine = self.evaluator
        if not isinstance(engine, Engine):
            return None
        try:
            return engine.prepare_many(candidates)
        except Exception:  # the evaluation builds again and reports what went wrong
            return None

    def _unpack(self, candidates: Sequence[Candidate], builds: Sequence[Any]) -> None:
        if not builds:
            return
        try:
            packs = importlib.import_module("ray").get(builds[0])
        except Exception:  # the build task failed or its node is gone: build here
            return
        builder = getattr(self.evaluator, "builder", None)
        if isinstance(builder, Builder):
            for data in packs[: len(candidates)]:
                unpack_build(builder.cache_dir, data)

    def arch(self) -> str | None:
        """The CUDA architecture this actor's builds target (its GPU's)."""
        builder = getattr(self.evaluator, "builder", None)
        return builder.arch_list if isinstance(builder, Builder) else None

    def warm(self) -> str:
        """Starts the GPU worker and probes the device, as the first evaluation would,
        and (an engine) readies its builds: "" when it is ready, else why not. Under
        the GPU lock, as the worker is one process used by one call at a time."""
        try:
            with self._gpu:
                engine = self.evaluator
                if isinstance(engine, Engine):
                    engine.warm()
                else:
                    engine.probe()
        except KfbotError as exc:
            return str(exc)
        return ""

    def preflight(self) -> Preflight | tuple[str, int]:
        """The device, the original's baseline and the adequacy gate; or why not."""
        try:
            device = self.evaluator.probe()
            base = self.evaluator.baseline()
            gate = self.evaluator.adequacy() if base.ok else None
        except KfbotError as exc:
            return str(exc), exc.exit_code
        node = importlib.import_module("ray").get_runtime_context().get_node_id()
        return Preflight(dict(device), base, gate, str(node))

    def where(self) -> dict[str, Any]:
        """The process, node and folder this actor evaluates in."""
        node = importlib.import_module("ray").get_runtime_context().get_node_id()
        return {"pid": os.getpid(), "node": node, "root": str(self.root)}

    def close(self) -> None:
        self.evaluator.__exit__(None, None, None)


# --- the executor ---------------------------------------------------------------------


PING = -1  # a running call that checks a fresh actor is up, not a chunk of work
# Chunks in flight per actor: while one holds the GPU, the next one's builds run.
DEPTH = 2


class RayExecutor:
    """Evaluates batches on Ray actors, one GPU each; results in the order given.

    Each actor takes DEPTH chunks at a time: one holds its GPU while the next one's
    builds run, so the GPU does not wait for builds between chunks. A lost actor is
    replaced at once, but its replacement gets work only after it has answered a
    ping: while Ray waits for a GPU for it (its node is gone), the chunks go to the
    actors still alive. A slot whose actor is lost `max_tries` times in a row (it
    cannot start: bad source, a broken node) is retired.
    """

    def __init__(self, task: KernelTask, settings: EngineSettings, address: str | None = None,
                 *, actors: int | None = None, num_gpus: float = 1.0,
                 factory: EvaluatorFactory = engine_factory, ship_source: bool = True,
                 source_limit: int = SOURCE_LIMIT, max_tries: int = 3,
                 chunk: int | None = None, stall_s: float = 3600.0,
                 build_cpus: int = 0, build_task: Callable[..., list[bytes]] = build_packs,
                 ) -> None:
        self.ray = ray_module()
        self._owns_ray = not self.ray.is_initialized()
        if self._owns_ray:
            self.ray.init(address=address, include_dashboard=False, log_to_driver=False)
        self.lost = tuple(getattr(self.ray.exceptions, n) for n in LOST
                          if hasattr(self.ray.exceptions, n))
        self.max_tries, self.chunk, self.stall_s = max_tries, chunk, stall_s
        count = actors or self._gpu_slots(num_gpus)
        bundle = pack_source(task.root, source_limit) if ship_source else None
        remote = self.ray.remote(EvalActor).options(num_gpus=num_gpus, max_concurrency=DEPTH)
        args = (factory, task, settings, self.ray.put(bundle))
        self._spawn: Callable[[], Any] = lambda: remote.remote(*args)
        # Ray retries a build task whose node is lost; its CPUs come from any node.
        self._builds = self.ray.remote(build_task).options(
            num_cpus=build_cpus, num_gpus=0, max_retries=2) if build_cpus > 0 else None
        self._build_args = (task, settings, args[3])
        self.actors: list[Any | None] = [self._spawn() for _ in range(count)]
        # One entry per chunk an actor may take now: DEPTH per working actor.
        self._idle: deque[int] = deque(slot for _ in range(DEPTH) for slot in range(count))
        self._warming: dict[Any, tuple[int, Any]] = {}  # ping ref -> (slot, fresh actor)
        self._strikes = [0] * count
        self._last_loss = ""

    def _gpu_slots(self, num_gpus: float) -> int:
        gpus = float(self.ray.cluster_resources().get("GPU", 0))
        if num_gpus > 0 and gpus < num_gpus:
            raise KfbotError("the Ray cluster has no GPU for an evaluation actor "
                             f"({gpus:g} GPUs, each actor needs {num_gpus:g})", EXIT_MISSING_TOOL)
        return max(1, math.floor(gpus / num_gpus)) if num_gpus > 0 else 1

    def evaluate(self, candidates: Sequence[Candidate]) -> list[tuple[Candidate, Evaluation]]:
        batch = _Batch(candidates, self._chunks(len(candidates)))
        builds = self._start_builds(batch)
        running = {ref: (slot, PING, actor) for ref, (slot, actor) in self._warming.items()}
        while not batch.complete():
            while batch.pending and self._idle:
                slot, c = self._idle.popleft(), batch.pending.popleft()
                actor = self._actor(slot)
                running[actor.evaluate.remote(batch.chunk(c), builds[c:c + 1])] = (slot, c, actor)
            if not running:
                batch.fail_pending(f"no Ray actor left to evaluate on; last loss: "
                                   f"{self._last_loss}")
                break
            ready, _ = self.ray.wait(list(running), num_returns=1, timeout=self.stall_s)
            if not ready:
                self._stalled(batch, running)
                break
            self._collect(ready[0], running, batch)
        self._warming = {ref: (slot, actor) for ref, (slot, c, actor) in running.items()
                         if c == PING}
        return batch.pairs()

    def _start_builds(self, batch: _Batch) -> list[Any]:
        """Every chunk's build task, started at once: builds run ahead of the GPUs."""
        if self._builds is None or not self.actors:
            return []
        return [self._builds.remote(*self._build_args, self._target_arch, batch.chunk(c))
                for c in range(len(batch.chunks))]

    @functools.cached_property
    def _target_arch(self) -> str | None:
        """The architecture the GPU actors build for, asked of the first of them once."""
        first = next((a for a in self.actors if a is not None), None)
        return self.ray.get(first.arch.remote()) if first is not None else None

    def preflight(self) -> Preflight:
        """The device, the original's baseline and the adequacy gate, from one actor;
        meanwhile every other actor starts its GPU worker, so none pays its start-up
        (seconds: torch, the CUDA context, the device probe) inside the search."""
        slot = self._idle[0] if self._idle else None
        if slot is None:
            raise KfbotError("no Ray actor is free for the preflight", EXIT_MISSING_TOOL)
        others = [s for s in dict.fromkeys(self._idle) if s != slot]
        warming = {self._actor(s).warm.remote(): s for s in others}
        try:
            answer = self.ray.get(self._actor(slot).preflight.remote())
        except self.lost as exc:
            raise KfbotError(f"the Ray actor was lost before the search: {_first_line(exc)}",
                             EXIT_MISSING_TOOL) from exc
        if isinstance(answer, tuple):
            message, code = answer
            raise KfbotError(f"on the Ray actor: {message}", int(code))
        self._warmed(warming)
        return answer  # type: ignore[no-any-return]

    def _warmed(self, warming: Mapping[Any, int]) -> None:
        """Waits for the other actors' start; one that cannot use its GPU stops the run
        before the search, as the preflight's own actor would, and one that is lost is
        replaced, as during the search."""
        running: dict[Any, tuple[int, int, Any]] = {}
        for ref, slot in warming.items():
            try:
                why = self.ray.get(ref)
            except self.lost as exc:
                self._last_loss = _first_line(exc)
                self._restart(slot, running)
                continue
            if why:
                raise KfbotError(f"on the Ray actor in slot {slot}: {why}", EXIT_MISSING_TOOL)
        self._warming.update({ref: (slot, actor) for ref, (slot, _, actor) in running.items()})

    def _collect(self, ref: Any, running: dict[Any, tuple[int, int, Any]],
                 batch: _Batch) -> None:
        slot, c, actor = running.pop(ref)
        current = self.actors[slot] is actor  # not an actor replaced since
        try:
            value = self.ray.get(ref)
        except self.lost as exc:
            self._last_loss = _first_line(exc)
            if c != PING:
                batch.lost(c, self.max_tries, self._last_loss)
            if current:
                self._restart(slot, running)
            return
        if c != PING:
            batch.done(c, value)
        if current:
            self._strikes[slot] = 0
            self._idle.extend([slot] * (DEPTH if c == PING else 1))

    def _restart(self, slot: int, running: dict[Any, tuple[int, int, Any]]) -> None:
        """A fresh actor in the lost one's place (Ray puts it where a GPU is free),
        pinged before it gets work; retired after `max_tries` losses in a row."""
        with contextlib.suppress(Exception):  # gone with its node: nothing to release
            self.ray.kill(self.actors[slot], no_restart=True)
        self._idle = deque(s for s in self._idle if s != slot)  # the lost actor's turns
        self._strikes[slot] += 1
        if self._strikes[slot] >= self.max_tries:
            self.actors[slot] = None
            return
        actor = self.actors[slot] = self._spawn()
        running[actor.where.remote()] = (slot, PING, actor)

    def _stalled(self, batch: _Batch, running: dict[Any, tuple[int, int, Any]]) -> None:
        """Nothing came back in time (no GPU free, a node gone silent): record why."""
        why = f"no Ray actor answered in {self.stall_s:g} s"
        for ref, (slot, c, actor) in list(running.items()):
            if c != PING:
                del running[ref]
                batch.fail(c, why)
                if self.actors[slot] is actor:
                    self._restart(slot, running)
        batch.fail_pending(why)

    def _actor(self, slot: int) -> Any:
        actor = self.actors[slot]
        assert actor is not None, f"slot {slot} is retired and never idle"
        return actor

    def _chunks(self, n: int) -> list[list[int]]:
        """About 2 * DEPTH chunks per actor: builds overlap inside a chunk and with the
        chunk before, a faster GPU takes more of them, and a lost actor costs one or
        two; `chunk` fixes the size."""
        size = self.chunk or max(1, math.ceil(n / (2 * DEPTH * len(self.actors))))
        return [list(range(i, min(n, i + size))) for i in range(0, n, size)]

    def where(self) -> list[dict[str, Any]]:
        """Where each working actor runs: process, node and folder."""
        working = [self._actor(slot) for slot in dict.fromkeys(self._idle)]
        return list(self.ray.get([a.where.remote() for a in working]))

    def close(self) -> None:
        """Closes the engines of the working actors, then ends every actor."""
        for slot in dict.fromkeys(self._idle):
            with contextlib.suppress(Exception):  # a lost actor has nothing left to close
                self.ray.get(self._actor(slot).close.remote(), timeout=60)
        for actor in self.actors:
            if actor is not None:
                self.ray.kill(actor)
        self.actors, self._idle, self._warming = [], deque(), {}
        if self._owns_ray:
            self.ray.shutdown()


class _Batch:
    """One `evaluate` call: its chunks, what came back, and what is still to send."""

    def __init__(self, candidates: Sequence[Candidate], chunks: list[list[int]]) -> None:
        self.candidates = candidates
        self.chunks = chunks
        self.results: list[Evaluation | None] = [None] * len(candidates)
        self.tries = [0] * len(chunks)
        self.pending: deque[int] = deque(range(len(chunks)))

    def chunk(self, c: int) -> list[Candidate]:
        return [self.candidates[i] for i in self.chunks[c]]

    def done(self, c: int, evaluations: Sequence[Evaluation]) -> None:
        for i, ev in zip(self.chunks[c], evaluations, strict=True):
            self.results[i] = ev

    def lost(self, c: int, max_tries: int, why: str) -> None:
        """Back to the front of the queue, or a runtime failure after `max_tries`."""
        self.tries[c] += 1
        if self.tries[c] < max_tries:
            self.pending.appendleft(c)
        else:
            self.fail(c, f"its Ray actor was lost {self.tries[c]} times; last: {why}")

    def complete(self) -> bool:
        return all(ev is not None for ev in self.results)

    def fail_pending(self, why: str) -> None:
        while self.pending:
            self.fail(self.pending.popleft(), why)

    def fail(self, c: int, why: str) -> None:
        for i in self.chunks[c]:
            self.results[i] = failed(self.candidates[i].hash, "runtime", why)

    def pairs(self) -> list[tuple[Candidate, Evaluation]]:
        missing = [i for i, ev in enumerate(self.results) if ev is None]
        assert not missing, f"candidates {missing} got no evaluation"
        pairs = zip(self.candidates, self.results, strict=True)
        return [(cand, ev) for cand, ev in pairs if ev is not None]


def _first_line(exc: BaseException) -> str:
    return (str(exc).strip().splitlines() or [type(exc).__name__])[0][:300]
