"""Per-file facts kept between scans of one repository, so unchanged files are not read
again.

Reading a file's facts (a tree-sitter parse, an `ast` parse and their analysis) is
most of a scan's time; a repository changes a few files between two scans. The facts
of every file are kept in one file per repository under the kfbot cache
(`$KFBOT_CACHE/scan`, else `$XDG_CACHE_HOME/kfbot/scan` or `~/.cache/kfbot/scan`),
each under what `stat` says of the file (size, modification and change times, inode),
as git's index does. The whole cache is dropped when kfbot's extractors change (a
digest of their sources), and a Python file's facts when the set of files changed (they
depend on which files exist). It is written by a forked child, so that the scan does
not wait for it; the repository itself is never written.

The cache is pickled: it holds kfbot's own records, in a folder of the user's, like
the build cache beside it.
"""

from __future__ import annotations

import hashlib
import os
import pickle
import tempfile
from collections.abc import Iterable
from pathlib import Path

from kfbot.scan.files import SourceFile
from kfbot.scan.model import CudaFileFacts, Problem, PyFileFacts

FileResult = tuple[list[CudaFileFacts], list[PyFileFacts], list[Problem]]
StatKey = tuple[int, int, int, int]
_FORMAT = 1


def default_directory() -> Path:
    if "KFBOT_CACHE" in os.environ:
        return Path(os.environ["KFBOT_CACHE"]) / "scan"
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "kfbot" / "scan"


def _extractors_digest() -> str:
    """A digest of the scan package's sources: facts read by other code are not reused."""
    h = hashlib.sha256(str(_FORMAT).encode())
    for path in sorted(Path(__file__).parent.glob("*.py")):
        h.update(path.name.encode())
        h.update(path.read_bytes())
    return h.hexdigest()[:16]


def stat_key(path: Path) -> StatKey | None:
    try:
        st = path.stat()
    except OSError:
        return None
    return st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino


class FactsCache:
    """The cached facts of one repository: looked up per file, saved once at the end."""

    def __init__(self, root: Path, directory: Path | None = None) -> None:
        key = hashlib.sha256(str(root.resolve()).encode()).hexdigest()[:24]
        self.path = (directory or default_directory()) / f"{key}.pickle"
        self.digest = _extractors_digest()
        self.entries: dict[str, tuple[StatKey, FileResult]] = {}
        self.fresh: dict[str, tuple[StatKey, FileResult]] = {}
        self.files_digest = ""
        self._load()

    def _load(self) -> None:
        try:
            with open(self.path, "rb") as f:
                header = pickle.load(f)
                if header != (_FORMAT, self.digest):
                    return
                self.files_digest, self.entries = pickle.load(f)
        except (OSError, EOFError, pickle.UnpicklingError, ValueError, TypeError,
                AttributeError, ImportError):
            self.entries = {}  # a cache that cannot be read is a cache not there

    def use_files(self, files: Iterable[str]) -> None:
        """Python facts depend on which files exist: drop them if the set changed."""
        digest = hashlib.sha256("\n".join(sorted(files)).encode()).hexdigest()[:16]
        if digest != self.files_digest:
            self.entries = {rel: e for rel, e in self.entries.items()
                            if not rel.endswith(".py")}
        self.files_digest = digest

    def lookup(self, source: SourceFile) -> tuple[StatKey | None, FileResult | None]:
        key = stat_key(source.path)
        found = self.entries.get(source.rel)
        if key is not None and found is not None and found[0] == key:
            self.fresh[source.rel] = found
            return key, found[1]
        return key, None

    def add(self, rel: str, key: StatKey | None, result: FileResult) -> None:
        if key is not None:
            self.fresh[rel] = (key, result)

    def save(self) -> None:
        """Write the facts of this scan's files, atomically, from a detached process
        (forked twice, so that nobody waits for it); nothing happens where fork is
        missing or when nothing changed."""
        unchanged = self.fresh.keys() == self.entries.keys() and all(
            self.fresh[k][0] == self.entries[k][0] for k in self.fresh)
        if unchanged or not hasattr(os, "fork"):
            return
        child = os.fork()
        if child:
            os.waitpid(child, 0)
            return
        status = 1
        try:
            if os.fork() == 0:  # the writer: adopted by init once its parent exits
                self._write()
            status = 0
        finally:
            os._exit(status)

    def _write(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=self.path.parent, suffix=".tmp")
        try:
            with os.fdopen(fd, "wb") as f:
                pickle.dump((_FORMAT, self.digest), f, protocol=pickle.HIGHEST_PROTOCOL)
                pickle.dump((self.files_digest, self.fresh), f,
                            protocol=pickle.HIGHEST_PROTOCOL)
            os.replace(tmp, self.path)
        finally:
            if os.path.exists(tmp):
                os.unlink(tmp)
