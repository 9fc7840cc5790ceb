"""Paths inside the repository kfbot was given, and copies of it.

kfbot reads only the repository it was given. A symbolic link can point anywhere (a
credentials file, `/`, one of its own parents), so every entry is judged by its real
path: one that leaves the repository is skipped and reported once, with the link's own
path, and a loop ends where it closes. A copy of the repository (the scratch tree the
repository's tests and builds run in) holds real files only: a link that stays inside
is copied as what it points to, so nothing run in the copy can write through a link
into the user's checkout.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from kfbot.errors import KfbotError

KFBOT_DIR = ".kfbot"  # kfbot's own folder in a repository: run folders, lessons
# Entries a copy never needs: version control, caches and build outputs. Build outputs
# are skipped so that tests in the copy import kfbot's build, never a stale one.
DEFAULT_SKIP = frozenset({".git", "__pycache__", ".kfbot", ".venv", "venv", ".mypy_cache",
                          ".pytest_cache", ".ruff_cache", "build", "dist"})
_SKIP_SUFFIXES = (".egg-info", ".so", ".o", ".pyc")


def real(path: Path | str) -> str:
    return os.path.realpath(path)


def inside(root: Path | str, path: Path | str) -> bool:
    """Whether `path`'s real path (every link followed) is `root`'s or below it."""
    top = real(root)
    target = real(path)
    return target == top or target.startswith(top.rstrip(os.sep) + os.sep)


def resolve_inside(root: Path, rel: str, what: str = "path") -> Path:
    """`root / rel`, refused when it (or a link on the way) leads out of `root`."""
    path = root / rel
    if not inside(root, path):
        raise KfbotError(f"{rel}: this {what} leads outside the repository "
                         f"(to {real(path)}); kfbot reads nothing outside {root}")
    return path


def file_argument(path: str) -> str:
    """A file name as a compiler's argument: `./` before a relative one, so that a file
    named `--options-file=o.cu` or `-Xcompiler=...` is a file, never an option."""
    return path if os.path.isabs(path) or path.startswith("./") else f"./{path}"


def plain_relative(path: str, what: str) -> str:
    """`path` when it is relative and stays below its folder; a KfbotError for an
    absolute path or a `..` part, before anything is written there."""
    parts = path.replace("\\", "/").split("/")
    if not path or path.startswith("/") or ".." in parts:
        raise KfbotError(f"{what}: {path!r} is not a plain relative path (absolute, or with "
                         "`..`); kfbot writes nothing outside the repository")
    return path


def kfbot_folder(root: Path, *parts: str) -> Path:
    """`root/.kfbot/<parts>`: where kfbot writes run folders and lessons. Refused where
    `.kfbot` or a folder below it is a link, which would have kfbot write wherever it
    points."""
    path = root / KFBOT_DIR
    for part in ("", *parts):
        path = path / part if part else path
        if path.is_symlink():
            raise KfbotError(f"{path.relative_to(root)}: is a symbolic link; kfbot writes its "
                             "runs and lessons only into a real folder inside the repository "
                             "(remove the link)")
    return path


def refuse_link(path: Path, what: str, shown: str | None = None) -> None:
    """A file kfbot trusts for its own settings must be a real file, not a link (where it
    points is not said: the message may be posted on a pull request)."""
    if path.is_symlink():
        raise KfbotError(f"{shown or path}: the {what} is a symbolic link; kfbot reads its "
                         f"{what} only from a regular file")


@dataclass
class CopyReport:
    """What a copy left out: links that leave the repository, loops, unreadable entries."""

    skipped: list[str] = field(default_factory=list)

    def note(self, rel: str, why: str) -> None:
        self.skipped.append(f"{rel}: {why}")


Skip = Callable[[str], bool]


def default_skip(name: str) -> bool:
    return name in DEFAULT_SKIP or name.endswith(_SKIP_SUFFIXES)


def copy_repository(root: Path, dest: Path, skip: Skip = default_skip) -> CopyReport:
    """Copy `root` to `dest` (created), following only links that stay inside `root`."""
    report = CopyReport()
    top = real(root)
    dest.mkdir(parents=True, exist_ok=True)
    _copy_dir(Path(top), dest, "", top, frozenset({top}), skip, report)
    return report


def _copy_dir(src: Path, dest: Path, rel: str, top: str, seen: frozenset[str], skip: Skip,
              report: CopyReport) -> None:
    try:
        entries = sorted(os.scandir(src), key=lambda e: e.name)
    except OSError as exc:
        report.note(rel or ".", f"cannot list folder: {exc.strerror}")
        return
    for entry in entries:
        if skip(entry.name):
            continue
        child_rel = f"{rel}/{entry.name}" if rel else entry.name
        target = real(entry.path)
        if not inside(top, target):
            report.note(child_rel, f"links outside the repository (to {target}); not copied")
            continue
        if os.path.isdir(target):
            if target in seen:
                report.note(child_rel, "links back to one of its parent folders; not followed")
                continue
            (dest / entry.name).mkdir(exist_ok=True)
            _copy_dir(Path(entry.path), dest / entry.name, child_rel, top, seen | {target},
                      skip, report)
        elif os.path.isfile(target):
            _copy_file(target, dest / entry.name, child_rel, report)
        elif entry.is_symlink():
            report.note(child_rel, "broken link; not copied")


def _copy_file(src: str, dest: Path, rel: str, report: CopyReport) -> None:
    try:
        shutil.copyfile(src, dest)
        shutil.copymode(src, dest)
    except OSError as exc:
        report.note(rel, f"cannot copy: {exc.strerror or exc}")

