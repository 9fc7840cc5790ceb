"""The facts of each file, cached by its content, for scans that run again and again.

The pre-commit hook scans the working tree and the base revision at every commit, and
between two commits almost every file is the same: its facts are read back instead of
parsed again. An entry is keyed by the file's path, its bytes and the scan code itself
(a digest of every module under kfbot/scan/, sub-packages included), so a changed
extractor never reads facts written by an older one. A Python file's facts also
depend on which files it names exist (a `load(sources=[...])`); the entry records
those answers and is used only while they still hold.

The entries are pickles under the user's cache folder (`kfbot.paths.cache_dir()`),
which only the user's own processes write: the same trust as the build cache beside
it. An entry that cannot be read is a miss; a folder that cannot be written leaves the
scan uncached.
"""

from __future__ import annotations

import functools
import hashlib
import logging
import os
import pickle
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from kfbot import __version__
from kfbot.scan.files import SourceFile
from kfbot.scan.model import CudaFileFacts, Problem, PyFileFacts

log = logging.getLogger(__name__)

FileResult = tuple[list[CudaFileFacts], list[PyFileFacts], list[Problem]]
Extract = Callable[[Callable[[str], bool]], FileResult]  # given `exists`


@dataclass(frozen=True)
class _Entry:
    result: FileResult
    exists: tuple[tuple[str, bool], ...]  # the paths the extractor asked about, and answers


@functools.cache
def code_digest() -> str:
    """What the facts depend on besides the file: kfbot's version and scan code."""
    return digest_of_code(Path(__file__).parent)


def digest_of_code(folder: Path) -> str:
    """kfbot's version and every module under `folder`, its sub-packages' included: the
    extractors live in scan/cuda/ and scan/python/, not beside this module."""
    digest = hashlib.sha256(__version__.encode())
    for path in sorted(folder.rglob("*.py")):
        name = path.relative_to(folder).as_posix()
        digest.update(name.encode() + b"\0" + path.read_bytes())
    return digest.hexdigest()[:16]


def warm(folder: Path) -> bool:
    """Whether an earlier scan by this scan code left entries in `folder`: then nearly
    every file is read back, which one process does faster than a pool can start."""
    return (folder / code_digest()).is_dir()


def cached_extract(source: SourceFile, data: bytes, folder: Path, extract: Extract,
                   exists: Callable[[str], bool]) -> FileResult:
    """`extract(exists)`'s result for the file `source`, whose bytes are `data`: from
    `folder` when an earlier scan left it there and `exists` still answers as it did."""
    key = hashlib.sha256(source.rel.encode() + b"\0" + data).hexdigest()
    path = folder / code_digest() / key[:2] / key
    entry = _load(path)
    if entry is not None and all(exists(rel) == was for rel, was in entry.exists):
        return entry.result
    asked: dict[str, bool] = {}

    def recorded(rel: str) -> bool:
        if rel not in asked:
            asked[rel] = exists(rel)
        return asked[rel]

    result = extract(recorded)
    _store(path, _Entry(result, tuple(sorted(asked.items()))))
    return result


def _load(path: Path) -> _Entry | None:
    try:
        with path.open("rb") as cached:
            entry = pickle.load(cached)
    except FileNotFoundError:
        return None
    except Exception as exc:  # a truncated or foreign file is only a miss
        log.debug("scan cache entry %s unreadable: %s", path, exc)
        return None
    return entry if isinstance(entry, _Entry) else None


def _store(path: Path, entry: _Entry) -> None:
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        # Written aside and renamed: a concurrent scan never reads half an entry.
        fd, temporary = tempfile.mkstemp(dir=path.parent, prefix=".tmp-")
        with os.fdopen(fd, "wb") as out:
            pickle.dump(entry, out, protocol=pickle.HIGHEST_PROTOCOL)
        os.replace(temporary, path)
    except OSError as exc:
        log.debug("scan cache entry %s not written: %s", path, exc)
