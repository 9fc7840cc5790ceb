"""`scan(root)`: list the files, extract facts from each (in parallel), link them."""

from __future__ import annotations

import functools
import gc
import multiprocessing
import os
from collections.abc import Callable, Iterable
from pathlib import Path

from kfbot.config import Config
from kfbot.errors import EXIT_USAGE, KfbotError
from kfbot.scan.assemble import assemble
from kfbot.scan.cuda_facts import extract_cuda_facts
from kfbot.scan.files import Inventory, SourceFile, collect
from kfbot.scan.link import Linker
from kfbot.scan.model import CudaFileFacts, Problem, PyFileFacts, ScanReport
from kfbot.scan.python_facts import extract_python_facts
from kfbot.scan.tasks import apply_tasks

MAX_FILE_BYTES = 16 * 1024 * 1024
# Below this many files a process pool costs more to start than it saves.
PARALLEL_THRESHOLD = 200
BATCH = 64

Progress = Callable[[int, int], None]
FileResult = tuple[list[CudaFileFacts], list[PyFileFacts], list[Problem]]


def scan(root: Path, config: Config, progress: Progress | None = None,
         jobs: int | None = None) -> ScanReport:
    root = _check_root(root)
    inventory = collect(root, config.scan)
    cuda, python, problems = _extract_all(root, inventory, progress, jobs)
    linker = Linker(cuda, python)
    kernels = apply_tasks(assemble(linker), config)
    kernels.sort(key=lambda k: (k.file, k.definition.line, k.name))
    all_problems = [*inventory.problems, *problems, *linker.problems,
                    *(p for f in cuda for p in f.problems),
                    *(p for f in python for p in f.problems)]
    all_problems.sort(key=lambda p: (p.file, p.line or 0))
    return ScanReport(root=str(root), kernels=tuple(kernels), problems=tuple(all_problems),
                      files_scanned=len(inventory.files),
                      skipped_dirs=inventory.skipped_dirs)


def _check_root(root: Path) -> Path:
    if not root.exists():
        raise KfbotError(f"{root}: no such file or directory", EXIT_USAGE)
    if not root.is_dir():
        raise KfbotError(f"{root}: is a file; kfbot scans a repository folder", EXIT_USAGE)
    if not os.access(root, os.R_OK | os.X_OK):
        raise KfbotError(f"{root}: folder cannot be read", EXIT_USAGE)
    return root.resolve()


def _extract_all(root: Path, inventory: Inventory, progress: Progress | None,
                 jobs: int | None) -> tuple[list[CudaFileFacts], list[PyFileFacts],
                                            list[Problem]]:
    files = list(inventory.files)
    batches = [(str(root), files[i:i + BATCH]) for i in range(0, len(files), BATCH)]
    cuda: list[CudaFileFacts] = []
    python: list[PyFileFacts] = []
    problems: list[Problem] = []
    done = 0
    for batch_result, count in _run_batches(batches, jobs or os.cpu_count() or 1, len(files)):
        for c, p, probs in batch_result:
            cuda += c
            python += p
            problems += probs
        done += count
        if progress is not None:
            progress(done, len(files))
    return cuda, python, problems


def _run_batches(batches: list[tuple[str, list[SourceFile]]], jobs: int, total: int
                 ) -> Iterable[tuple[list[FileResult], int]]:
    if jobs <= 1 or total < PARALLEL_THRESHOLD:
        for batch in batches:
            yield _extract_batch(batch), len(batch[1])
        return
    method = "fork" if "fork" in multiprocessing.get_all_start_methods() else "spawn"
    with multiprocessing.get_context(method).Pool(jobs) as pool:
        # imap keeps the input order, so the report is the same however it was split.
        for batch, result in zip(batches, pool.imap(_extract_batch, batches), strict=True):
            yield result, len(batch[1])


def _extract_batch(batch: tuple[str, list[SourceFile]]) -> list[FileResult]:
    root = Path(batch[0])
    # The extractors free their trees by reference counting (cycles are broken
    # explicitly), so the cyclic collector only costs time here; it is restored after.
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        return [extract_file(root, f) for f in batch[1]]
    finally:
        if was_enabled:
            gc.enable()


@functools.lru_cache(maxsize=65536)
def _exists(root: Path, rel: str) -> bool:
    """Build recipes in many files name the same sources; ask the file system once."""
    return (root / rel).exists()


def extract_file(root: Path, source: SourceFile) -> FileResult:
    """Facts from one file; a file that cannot be read becomes a Problem, never an error."""
    data, problem = _read(source)
    if data is None:
        return [], [], [problem] if problem else []
    if source.kind == "cuda":
        return [extract_cuda_facts(source.rel, data)], [], []
    facts = extract_python_facts(source.rel, data, lambda rel: _exists(root, rel))
    inline = [extract_cuda_facts(source.rel, s.text.encode(), s.line_offset)
              for s in facts.inline_sources if s.text]
    return inline, [facts], []


def _read(source: SourceFile) -> tuple[bytes | None, Problem | None]:
    try:
        size = source.path.stat().st_size
        if size > MAX_FILE_BYTES:
            return None, Problem(source.rel, None, f"file is {size >> 20} MiB, over the "
                                 f"{MAX_FILE_BYTES >> 20} MiB limit; skipped")
        data = source.path.read_bytes()
    except OSError as exc:
        return None, Problem(source.rel, None, f"cannot read: {exc.strerror or exc}", "error")
    if not data.strip():
        return None, Problem(source.rel, None, "empty file", "info")
    if b"\0" in data[:8192]:
        return None, Problem(source.rel, None, "binary content (NUL bytes); skipped")
    return data, None
