"""What a sandboxed process sees of the file system: every path it may write, the paths
it may read that a private /tmp or /run would hide, and what stays read-only even inside
a writable folder.

The rest of the machine is visible read-only, /tmp and /run are private and empty, so
that the paths a command needs there must be named. A spawn point names its working
folder and what it writes; what kfbot itself hands every child (its interpreter, its
package, its cache, its scratch folder) and any existing path written in the command's
arguments or environment is added here.
"""

from __future__ import annotations

import os
import re
import sys
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import kfbot
from kfbot.cache import cache_dir
from kfbot.evaluate.sandbox.environment import scratch_home, scratch_root

HIDDEN = ("/tmp", "/run")
# What some drivers ask for under /run; read-only, and only where it exists.
_RUN_KEPT = ("/run/nvidia-persistenced",)
_ABSOLUTE = re.compile(r"(?<![\w.~-])(/[^\s\"'`:;,=]+)")
_MAX_FOUND = 64


@dataclass(frozen=True)
class View:
    """The binds a sandbox makes, in the order it makes them (a deeper path later, so it
    wins), and the working folder."""

    cwd: str
    binds: tuple[tuple[str, str], ...]  # (path, "rw" or "ro")

    @classmethod
    def of(cls, cwd: str | Path, writable: Iterable[str | Path] = (),
           readable: Iterable[str | Path] = (), command: Sequence[str] = (),
           env: Mapping[str, str] | None = None) -> View:
        cwd = os.path.abspath(cwd)
        # A hidden root itself (or `/`) is never shown whole: it would undo the privacy.
        rw = [p for p in _existing([*writable, scratch_home()]) if not _covers_hidden(p)]
        ro = _existing([cwd, *readable, *_kfbot_paths(), *_found(command, env or {}),
                        *_RUN_KEPT])
        ro = [p for p in ro if _under(p, HIDDEN) and not _covers_hidden(p)
              and not _inside_any(p, rw)]
        shielded = [p for p in _protected(rw) if _inside_any(p, rw)]
        binds = {p: "ro" for p in _outermost(ro)}
        binds.update({p: "rw" for p in _outermost(rw)})
        binds.update({p: "ro" for p in shielded})
        order = sorted(binds, key=lambda p: (p.count("/"), p))
        return cls(cwd, tuple((p, binds[p]) for p in order))

    def writable(self) -> tuple[str, ...]:
        return tuple(path for path, mode in self.binds if mode == "rw")


def _kfbot_paths() -> list[str]:
    """kfbot's interpreter, libraries and package, its cache and scratch folder."""
    package = Path(kfbot.__file__).resolve().parent
    prefixes = {sys.prefix, sys.base_prefix, sys.exec_prefix}
    here = os.path.dirname(os.path.realpath(sys.executable))
    return [*prefixes, here, str(package), *sys.path, str(cache_dir()), scratch_root()]


def _protected(writable: Sequence[str]) -> list[str]:
    """Read-only even where they lie inside a writable folder: kfbot's own files, the
    runner's tool cache (its Python and toolchains) and every repository's `.git`."""
    package = str(Path(kfbot.__file__).resolve().parent)
    found = [sys.prefix, sys.base_prefix, package, os.environ.get("RUNNER_TOOL_CACHE", "")]
    workspace = os.environ.get("GITHUB_WORKSPACE")
    found += [os.path.join(p, ".git") for p in [*writable, *([workspace] if workspace else [])]]
    return _existing(found)


def _found(command: Sequence[str], env: Mapping[str, str]) -> list[str]:
    """Existing paths written in the arguments and the environment (a folder, or a file's
    folder): what the command was told to read, such as a script, a build's objects or
    staged modules."""
    found: list[str] = []
    for text in [*command, *env.values()]:
        for match in _ABSOLUTE.finditer(text):
            path = match.group(1).rstrip("/")
            if os.path.isdir(path):
                found.append(path)
            elif os.path.exists(path):
                found.append(os.path.dirname(path))
            if len(found) >= _MAX_FOUND:
                return found
    return found


def _existing(paths: Iterable[str | Path]) -> list[str]:
    out = []
    for path in paths:
        text = os.path.abspath(str(path)) if str(path) else ""
        if text and os.path.exists(text) and text not in out:
            out.append(text)
    return out


def _outermost(paths: Sequence[str]) -> list[str]:
    """The paths not inside another of them."""
    return [p for p in paths if not any(q != p and _under(p, (q,)) for q in paths)]


def _covers_hidden(path: str) -> bool:
    return any(_under(root, (path,)) for root in HIDDEN)


def _inside_any(path: str, roots: Sequence[str]) -> bool:
    return _under(path, tuple(roots))


def _under(path: str, roots: tuple[str, ...]) -> bool:
    return any(path == root or path.startswith(root.rstrip("/") + "/") for root in roots)
