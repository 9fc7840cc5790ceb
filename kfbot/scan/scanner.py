"""`scan(root)`: list the files, extract facts from each (in parallel), link them."""

from __future__ import annotations

import contextlib
import functools
import gc
import multiprocessing
import multiprocessing.pool
import os
import signal
from collections.abc import Callable, Iterable, Iterator
from multiprocessing.pool import AsyncResult
from pathlib import Path

from kfbot.config import Config
from kfbot.errors import EXIT_USAGE, KfbotError
from kfbot.scan.build_toml import read_build_toml
from kfbot.scan.cuda.facts import compile_queries, extract_cuda_facts
from kfbot.scan.facts_cache import FileResult, cached_extract
from kfbot.scan.files import Inventory, SourceFile, collect, source_kind
from kfbot.scan.forked import fork_safe
from kfbot.scan.link.assemble import assemble
from kfbot.scan.link.join import Linker
from kfbot.scan.link.pairing import summarised
from kfbot.scan.model import CudaFileFacts, Problem, PyFileFacts, ScanReport
from kfbot.scan.python.facts import extract_python_facts
from kfbot.scan.tasks import apply_tasks

MAX_FILE_BYTES = 16 * 1024 * 1024
# Below this many files a process pool costs more to start than it saves.
PARALLEL_THRESHOLD = 200
BATCH = 64

Progress = Callable[[int, int], None]


def scan(root: Path, config: Config, progress: Progress | None = None,
         jobs: int | None = None, cache: Path | None = None) -> ScanReport:
    """The scan of the repository at `root`; with `cache`, a folder where each file's
    facts are kept by its content (kfbot.scan.facts_cache), for scans run often."""
    root = _check_root(root)
    with paused_gc():
        with _Extraction(root, jobs or os.cpu_count() or 1, cache) as extraction:
            inventory = collect(root, config.scan, on_file=extraction.add)
            cuda, python, problems = extraction.results(progress)
        return _report(root, config, inventory, cuda, python, problems)


def _report(root: Path, config: Config, inventory: Inventory, cuda: list[CudaFileFacts],
            python: list[PyFileFacts], problems: list[Problem]) -> ScanReport:
    """Link the facts into kernels, and list them and every problem in a stable order."""
    rels = tuple(f.rel for f in inventory.files)
    linker = Linker(cuda, python, inventory=rels, build_files=_build_files(root, rels))
    kernels = apply_tasks(assemble(linker), config)
    kernels.sort(key=lambda k: (k.file, k.definition.line, k.name))
    all_problems = [*inventory.problems, *problems, *linker.problems,
                    *(p for f in cuda for p in f.problems),
                    *(p for f in python for p in f.problems)]
    all_problems.sort(key=lambda p: (p.file, p.line or 0))
    return ScanReport(root=str(root), kernels=tuple(kernels), problems=tuple(all_problems),
                      files_scanned=len(inventory.files), skipped_dirs=inventory.skipped_dirs,
                      unfollowed=tuple(summarised(linker.unfollowed)),
                      builds=tuple(linker.builds))


def _build_files(root: Path, files: tuple[str, ...]) -> tuple[str, ...]:
    """The pyproject.toml and CMakeLists.txt files in the folders that hold sources,
    and in the folders above them: where the repository's own build may start."""
    folders = {""}
    for rel in files:
        parts = rel.split("/")[:-1]
        folders.update("/".join(parts[:i]) for i in range(1, len(parts) + 1))
    found = []
    for folder in sorted(folders):
        for name in ("pyproject.toml", "CMakeLists.txt"):
            rel = f"{folder}/{name}" if folder else name
            if (root / rel).is_file():
                found.append(rel)
    return tuple(found)


@contextlib.contextmanager
def paused_gc() -> Iterator[None]:
    """Pause the cyclic garbage collector, which only costs time here.

    A scan allocates millions of small objects and frees them by reference counting
    (the extractors break their cycles explicitly); every collection would walk all
    of them again. The collector is restored afterwards.

    Restored as it is, its next collection would walk every object made while it was
    paused (they are all in the youngest generation): a tenth of a second or more after
    a large scan. Frozen and unfrozen first, they go straight to the oldest generation,
    which is walked only by the rare full collection.
    """
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.freeze()
            gc.unfreeze()
            gc.enable()


def _check_root(root: Path) -> Path:
    if not root.exists():
        raise KfbotError(f"{root}: no such file or directory", EXIT_USAGE)
    if not root.is_dir():
        raise KfbotError(f"{root}: is a file; kfbot scans a repository folder", EXIT_USAGE)
    if not os.access(root, os.R_OK | os.X_OK):
        raise KfbotError(f"{root}: folder cannot be read", EXIT_USAGE)
    return root.resolve()


Batch = tuple[str, list[SourceFile], str | None]  # root, files, the facts cache


class _Extraction:
    """Facts from the files as the walk finds them, in batches kept in walk order.

    A small repository is read in this process once the walk is done. Once the walk has
    found enough files to pay for it, a pool of worker processes starts and is handed
    each batch as soon as it is full, so that the pool's start-up and the rest of the
    walk overlap with reading.
    """

    def __init__(self, root: Path, jobs: int, cache: Path | None = None) -> None:
        self.root = str(root)
        self.jobs = jobs
        self.cache = str(cache) if cache is not None else None
        self.found = 0
        self.filling: list[SourceFile] = []
        self.waiting: list[list[SourceFile]] = []  # full batches no pool has been handed
        self.sent: list[tuple[AsyncResult[list[FileResult]], int]] = []
        self.pool: multiprocessing.pool.Pool | None = None

    def __enter__(self) -> _Extraction:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def add(self, source: SourceFile) -> None:
        self.filling.append(source)
        self.found += 1
        if len(self.filling) >= BATCH:
            self._flush()

    def results(self, progress: Progress | None) -> tuple[list[CudaFileFacts],
                                                          list[PyFileFacts], list[Problem]]:
        """Every file's facts, in walk order (so the report is the same however it was split)."""
        self._flush()
        cuda: list[CudaFileFacts] = []
        python: list[PyFileFacts] = []
        problems: list[Problem] = []
        done = 0
        for batch_result, count in self._batch_results():
            for c, p, probs in batch_result:
                cuda += c
                python += p
                problems += probs
            done += count
            if progress is not None:
                progress(done, self.found)
        self.close()
        return cuda, python, problems

    def close(self) -> None:
        if self.pool is not None:
            self.pool.terminate()
            self.pool = None

    def _flush(self) -> None:
        if self.filling:
            self.waiting.append(self.filling)
            self.filling = []
        if self.pool is None and self.jobs > 1 and self.found >= PARALLEL_THRESHOLD:
            self.pool = _start_pool(self.jobs)
        if self.pool is not None:
            for files in self.waiting:
                task = self.pool.apply_async(_extract_batch, ((self.root, files, self.cache),))
                self.sent.append((task, len(files)))
            self.waiting = []

    def _batch_results(self) -> Iterable[tuple[list[FileResult], int]]:
        for task, count in self.sent:
            yield task.get(), count
        root, cache = Path(self.root), Path(self.cache) if self.cache is not None else None
        exists = Exists(root)  # one for all the batches read in this process
        for files in self.waiting:  # only when no pool was started
            yield [extract_file(root, f, cache, exists) for f in files], len(files)


def _start_pool(jobs: int) -> multiprocessing.pool.Pool:
    # A fork copies only the forking thread: where this process runs native threads of a
    # library (a cluster client's), a lock one of them held stays held in every worker,
    # and the pool never ends. Such a process starts its workers afresh instead.
    forkable = "fork" in multiprocessing.get_all_start_methods() and fork_safe()
    method = "fork" if forkable else "spawn"
    if method == "fork":
        compile_queries()  # once here, rather than once in every worker it forks
    # Workers never run the cyclic collector (see `paused_gc`): besides its own cost, a
    # collection would touch every object inherited from this process, copying the
    # memory pages that fork shares. Extraction leaves no cycles to collect.
    return multiprocessing.get_context(method).Pool(jobs, initializer=_worker_start)


def _worker_start() -> None:
    """In each worker: no cyclic collector, and SIGTERM's default action.

    The pool is ended with SIGTERM (`Pool.terminate`). A forked worker inherits the
    handler of the process that started it, such as the CLI's, which unwinds rather than
    exits: a worker waiting for its next batch then stays blocked on the queue's lock,
    and the scan waits for it forever."""
    gc.disable()
    signal.signal(signal.SIGTERM, signal.SIG_DFL)


def _extract_batch(batch: Batch) -> list[FileResult]:
    root, cache = Path(batch[0]), Path(batch[2]) if batch[2] is not None else None
    exists = Exists(root)
    return [extract_file(root, f, cache, exists) for f in batch[1]]


class Exists:
    """Whether a path under `root` exists, asked of the file system once per path: build
    recipes in many files name the same sources, and each cached entry asks again
    whether the files it depended on exist. For one scan: the answers are kept."""

    def __init__(self, root: Path) -> None:
        self.root = str(root)
        self.known: dict[str, bool] = {}

    def __call__(self, rel: str) -> bool:
        found = self.known.get(rel)
        if found is None:
            found = self.known[rel] = os.path.exists(os.path.join(self.root, rel))
        return found


def extract_file(root: Path, source: SourceFile, cache: Path | None = None,
                 exists: Exists | None = None) -> FileResult:
    """Facts from one file; a file that cannot be read becomes a Problem, never an error."""
    data, problem = _read(source)
    if data is None:
        return [], [], [problem] if problem else []
    return _extracted(root, source, data, cache, exists or Exists(root))


def file_facts(root: Path, rel: str, data: bytes, cache: Path | None = None) -> FileResult:
    """The facts of `data` read as the file `rel` under `root`: for a version of a file
    that is not on disk (as it was at a commit)."""
    kind = source_kind(rel)
    if kind is None or not data.strip() or b"\0" in data[:8192]:
        return [], [], []
    return _extracted(root, SourceFile(rel, root / rel, kind), data, cache, Exists(root))


def _extracted(root: Path, source: SourceFile, data: bytes, cache: Path | None,
               exists: Exists) -> FileResult:
    extract = functools.partial(_facts, source, data)
    if cache is not None:
        return cached_extract(source, data, cache, extract, exists)
    return extract(exists)


def _facts(source: SourceFile, data: bytes, exists: Callable[[str], bool]) -> FileResult:
    if source.kind == "cuda":
        return [extract_cuda_facts(source.rel, data)], [], []
    if source.kind == "build":  # its build comes with the Python facts' builds
        return [], [read_build_toml(source.rel, data)], []
    facts = extract_python_facts(source.rel, data, exists)
    inline = [extract_cuda_facts(source.rel, s.text.encode(), s.line_offset)
              for s in facts.inline_sources if s.text]
    return inline, [facts], []


def _read(source: SourceFile) -> tuple[bytes | None, Problem | None]:
    try:
        # One open for the size and the bytes: `Path.stat` then `Path.read_bytes` cost
        # a second look-up of the path, for every file of the scan.
        with open(source.path, "rb") as f:
            size = os.fstat(f.fileno()).st_size
            if size > MAX_FILE_BYTES:
                return None, Problem(source.rel, None, f"file is {size >> 20} MiB, over the "
                                     f"{MAX_FILE_BYTES >> 20} MiB limit; skipped")
            data = f.read()
    except OSError as exc:
        return None, Problem(source.rel, None, f"cannot read: {exc.strerror or exc}", "error")
    if not data.strip():
        return None, Problem(source.rel, None, "empty file", "info")
    if b"\0" in data[:8192]:
        return None, Problem(source.rel, None, "binary content (NUL bytes); skipped")
    return data, None
