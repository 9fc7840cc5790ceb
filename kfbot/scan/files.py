"""Which files a scan reads: source kinds, generated build directories, links.

A committed build folder (setuptools `build/`, a torch JIT folder with `build.ninja`)
holds copies of real kernels; reading it would report every kernel twice, so such
folders are skipped and listed in the report instead. A symbolic link is followed only
while its real path stays inside the repository: a link to `/`, to a credentials file or
to another checkout is skipped and reported once, with the link's own path.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from kfbot.config import ScanConfig, path_included
from kfbot.scan.model import Problem

CUDA_SUFFIXES = frozenset({".cu", ".cuh", ".cpp", ".cc", ".cxx", ".c", ".h", ".hpp", ".hh",
                           ".hxx", ".inl", ".cuinl"})
PYTHON_SUFFIXES = frozenset({".py"})
# Folders that never hold the project's own sources.
IGNORED_DIRS = frozenset({"__pycache__", "node_modules", "venv", "site-packages", ".eggs"})
GENERATED_DIRS = frozenset({"build", "dist", "_build"})
GENERATED_MARKERS = ("build.ninja", "CMakeCache.txt", ".ninja_log")

SourceKind = Literal["cuda", "python", "build"]
# Build files read by name: the Hugging Face kernel builder's recipe.
BUILD_FILES = frozenset({"build.toml"})


@dataclass(frozen=True)
class SourceFile:
    rel: str  # '/'-separated, relative to the scan root
    path: Path
    kind: SourceKind


@dataclass(frozen=True)
class Inventory:
    files: tuple[SourceFile, ...]
    problems: tuple[Problem, ...]
    skipped_dirs: tuple[str, ...]


def source_kind(name: str) -> SourceKind | None:
    suffix = os.path.splitext(name)[1].lower()
    if suffix in CUDA_SUFFIXES:
        return "cuda"
    if suffix in PYTHON_SUFFIXES:
        return "python"
    return "build" if name in BUILD_FILES else None


def collect(root: Path, scan: ScanConfig,
            on_file: Callable[[SourceFile], None] | None = None) -> Inventory:
    """List the source files under `root`, depth first, in a stable (sorted) order.

    `on_file` is called with each file as it is found, so that reading the files can
    start before the walk ends.
    """
    real = os.path.realpath(root)
    walker = _Walker(root, real, scan, on_file)
    walker.walk(root, "", real, frozenset({real}))
    return Inventory(tuple(walker.files), tuple(walker.problems), tuple(walker.skipped))


class _Walker:
    def __init__(self, root: Path, real_root: str, scan: ScanConfig,
                 on_file: Callable[[SourceFile], None] | None) -> None:
        self.root = root
        self.inside = real_root.rstrip(os.sep) + os.sep
        self.scan = scan
        self.on_file = on_file
        self.files: list[SourceFile] = []
        self.problems: list[Problem] = []
        self.skipped: list[str] = []
        self._real_files: set[str] = set()  # a file reached through two links is read once

    def walk(self, directory: Path, rel: str, real: str, seen: frozenset[str]) -> None:
        """List `directory`, found at `rel`, whose real path is `real`, below the
        folders whose real paths are `seen`."""
        try:
            entries = sorted(os.scandir(directory), key=lambda e: e.name)
        except OSError as exc:
            self.problems.append(Problem(rel or ".", None, f"cannot list folder: {exc.strerror}",
                                         "error"))
            return
        for entry in entries:
            child_rel = f"{rel}/{entry.name}" if rel else entry.name
            if _is_dir(entry):
                self._enter(entry, child_rel, real, seen)
            else:
                self._add_file(entry, child_rel, real)

    def _enter(self, entry: os.DirEntry[str], rel: str, parent_real: str,
               seen: frozenset[str]) -> None:
        if entry.name.startswith(".") or entry.name in IGNORED_DIRS or \
                entry.name.endswith(".egg-info"):
            return
        if self._generated(entry):
            self.skipped.append(rel)
            return
        real = _real_path(entry, parent_real)
        if real in seen:
            self.problems.append(Problem(rel, None, "symlink loop: this folder links back to "
                                         "one of its parents; not followed", "warning"))
            return
        if self._outside(rel, real):
            return
        self.walk(Path(entry.path), rel, real, seen | {real})

    def _generated(self, entry: os.DirEntry[str]) -> bool:
        if entry.name in GENERATED_DIRS:
            return True
        return any(os.path.exists(os.path.join(entry.path, m)) for m in GENERATED_MARKERS)

    def _add_file(self, entry: os.DirEntry[str], rel: str, parent_real: str) -> None:
        kind = source_kind(entry.name)
        if kind is None or not path_included(self.scan, rel):
            return
        if entry.is_symlink() and not os.path.exists(entry.path):
            self.problems.append(Problem(rel, None, "broken symlink; skipped", "warning"))
            return
        if not os.path.isfile(entry.path):
            # A FIFO or a device would block the read, or never end it.
            self.problems.append(Problem(rel, None, "not a regular file (a FIFO, socket or "
                                         "device); not read", "warning"))
            return
        real = _real_path(entry, parent_real)
        if self._outside(rel, real):
            return
        if real not in self._real_files:
            self._real_files.add(real)
            source = SourceFile(rel, Path(entry.path), kind)
            self.files.append(source)
            if self.on_file is not None:
                self.on_file(source)


    def _outside(self, rel: str, real: str) -> bool:
        """Whether `rel` leads out of the repository; said once, with the link's path."""
        if real.startswith(self.inside):
            return False
        self.problems.append(Problem(rel, None, f"symbolic link to {real}, outside the "
                                     "repository; not read", "warning"))
        return True


def _real_path(entry: os.DirEntry[str], parent_real: str) -> str:
    """`os.path.realpath(entry.path)`, given the real path of the folder listing `entry`.

    Only a link needs resolving: realpath itself would look at every folder on the way
    down, one system call each, for every file.
    """
    try:
        linked = entry.is_symlink()  # from the listing: no system call on Linux
    except OSError:
        linked = True
    return os.path.realpath(entry.path) if linked else os.path.join(parent_real, entry.name)


def _is_dir(entry: os.DirEntry[str]) -> bool:
    try:
        return entry.is_dir()
    except OSError:
        return False
