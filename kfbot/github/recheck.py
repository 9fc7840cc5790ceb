"""The publish job's re-check of a publication before one byte of it is committed.

    found = recheck(publication, patch, base)   # Checked, or a Refusal with its reason

`base` is what the pinned base commit holds at the publication's files, read through
the API (`gitdata`). The patch must be a plain text patch of files the task may edit
(no renames, deletions, mode changes or binary parts; no path outside the task, none
under `.git` or `.github`), within the size bounds, and must apply exactly (no fuzz) to
that base; and the files it makes must hash to the candidate whose numbers the report
gives. Only then are the new texts committed: the bytes come from here, never from a
checkout.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import PurePosixPath

from kfbot.evaluate.candidate import content_hash
from kfbot.github.handoff import Publication
from kfbot.scan.files import CUDA_SUFFIXES

MAX_FILES = 32  # per publication
MAX_FILE_BYTES = 1 << 20  # per file, before and after the patch
_HUNK = re.compile(r"@@ -(\d+)(?:,(\d+))? \+(\d+)(?:,(\d+))? @@.*")
_NO_NEWLINE = "\\ No newline at end of file"
# Names whose contents steer git or the workflows for whoever checks the branch out.
_REFUSED_NAMES = frozenset({".git", ".github", ".gitattributes", ".gitmodules", ".kfbot"})
REGULAR = ("100644", "100755")


@dataclass(frozen=True)
class BaseFile:
    """A file of the base commit: its git mode and text (None: the base has no such file)."""

    mode: str | None
    text: str | None


@dataclass(frozen=True)
class Change:
    path: str  # repository path
    mode: str  # the base's mode for an edited file, 100644 for a new one
    text: str


@dataclass(frozen=True)
class Checked:
    publication: Publication
    changes: tuple[Change, ...]  # the files whose text the patch changes


@dataclass(frozen=True)
class Refusal:
    name: str  # the publication's folder
    reason: str


class _Refused(Exception):
    """Raised inside the re-check; `recheck` returns it as a Refusal."""


@dataclass(frozen=True)
class _FilePatch:
    path: str
    new_file: bool
    hunks: tuple[tuple[int, tuple[str, ...], tuple[str, ...]], ...]  # old start, old, new


def repository_paths(publication: Publication) -> tuple[str, ...]:
    """The repository paths of the publication's files (to read from the base)."""
    return tuple(publication.root + p for p in publication.files)


def static_refusal(name: str, publication: Publication, patch: str) -> Refusal | None:
    """What can be refused without reading the repository: paths, counts, hashes."""
    try:
        _check_paths(publication)
        _parse(patch, set(publication.files))
    except _Refused as exc:
        return Refusal(name, str(exc))
    return None


def recheck(name: str, publication: Publication, patch: str,
            base: Mapping[str, BaseFile]) -> Checked | Refusal:
    """The changes to commit, or why the publication is refused."""
    try:
        _check_paths(publication)
        patches = _parse(patch, set(publication.files))
        texts = _patched(publication, patches, base)
        _check_binding(publication, texts)
    except _Refused as exc:
        return Refusal(name, str(exc))
    changes = []
    for rel in sorted(texts):
        path = publication.root + rel
        before = base[path]
        if before.text != texts[rel]:
            changes.append(Change(path, before.mode or "100644", texts[rel]))
    if not changes:
        return Refusal(name, "the patch changes nothing against the base commit")
    return Checked(publication, tuple(changes))


def _check_paths(p: Publication) -> None:
    if p.root and (not p.root.endswith("/") or _bad_parts(p.root.rstrip("/"))):
        raise _Refused(f"the task root {p.root!r} is not a plain folder of the repository")
    for label, paths in (("editable", p.editable), ("candidate", p.files)):
        if len(paths) > MAX_FILES:
            raise _Refused(f"{len(paths)} {label} files, more than the {MAX_FILES} kfbot "
                           "publishes")
        for rel in paths:
            why = _bad_path(p.root + rel)
            if why:
                raise _Refused(f"{label} file {rel!r}: {why}")
    outside = sorted(set(p.files) - set(p.editable))
    if outside:
        raise _Refused(f"the candidate changes {outside[0]}, which is not one of the task's "
                       f"editable files ({', '.join(p.editable) or 'none'})")
    if not re.fullmatch(r"[0-9a-f]{40}", p.base_commit):
        raise _Refused(f"base commit {p.base_commit!r} is not a full commit SHA")


def _bad_path(path: str) -> str | None:
    """Why `path` may not be committed, or None."""
    why = _bad_parts(path)
    if why is None and PurePosixPath(path).suffix.lower() not in CUDA_SUFFIXES:
        return "not a CUDA or C++ source: kfbot publishes kernel sources only"
    return why


def _bad_parts(path: str) -> str | None:
    """Why `path` is not a plain path inside the repository kfbot may write, or None."""
    if not path or len(path) > 1024 or path.startswith("/") or "\\" in path:
        return "not a relative path inside the repository"
    if any(not ch.isprintable() for ch in path):
        return "holds control characters"
    parts = path.split("/")
    if any(part in ("", ".", "..") for part in parts):
        return "not a plain path (empty, `.` or `..` parts)"
    if any(part.lower() in _REFUSED_NAMES for part in parts):
        return "under .git, .github or .kfbot, or a git attributes/modules file"
    return None


def _parse(patch: str, allowed: set[str]) -> list[_FilePatch]:
    lines = patch.split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    found: list[_FilePatch] = []
    i = 0
    while i < len(lines):
        if not lines[i].startswith("diff --git "):
            raise _Refused(f"patch line {i + 1}: expected `diff --git`, got {lines[i][:60]!r}")
        i, one = _file(lines, i)
        if one.path not in allowed:
            raise _Refused(f"the patch changes {one.path}, which is not one of the "
                           f"candidate's files ({', '.join(sorted(allowed))})")
        if any(f.path == one.path for f in found):
            raise _Refused(f"the patch changes {one.path} twice")
        found.append(one)
    if not found:
        raise _Refused("the patch is empty")
    return found


def _file(lines: list[str], i: int) -> tuple[int, _FilePatch]:
    head = lines[i]
    i += 1
    new_file = False
    while i < len(lines) and not lines[i].startswith("--- "):
        if lines[i].startswith("new file mode 100644"):
            new_file = True
        elif not lines[i].startswith("index "):
            raise _Refused(f"patch line {i + 1}: {lines[i][:60]!r}: kfbot publishes plain "
                           "text edits only (no renames, deletions, mode changes or binary)")
        i += 1
    if i + 1 >= len(lines) or not lines[i + 1].startswith("+++ "):
        raise _Refused(f"patch line {i + 1}: `--- ` and `+++ ` lines expected after {head!r}")
    old, new = lines[i][4:].split("\t")[0], lines[i + 1][4:].split("\t")[0]
    if not new.startswith("b/") or old not in (f"a/{new[2:]}", "/dev/null") or \
            head != f"diff --git a/{new[2:]} b/{new[2:]}" or (old == "/dev/null") != new_file:
        raise _Refused(f"patch line {i + 1}: {head!r} names its file inconsistently")
    i += 2
    hunks = []
    while i < len(lines) and lines[i].startswith("@@"):
        i, hunk = _hunk(lines, i)
        hunks.append(hunk)
    if not hunks:
        raise _Refused(f"patch line {i + 1}: {new[2:]} has no hunk")
    return i, _FilePatch(new[2:], new_file, tuple(hunks))


def _hunk(lines: list[str], i: int) -> tuple[int, tuple[int, tuple[str, ...], tuple[str, ...]]]:
    match = _HUNK.fullmatch(lines[i])
    if match is None:
        raise _Refused(f"patch line {i + 1}: not a hunk header: {lines[i][:60]!r}")
    start, old_n = int(match[1]), int(match[2] or 1)
    new_n = int(match[4] or 1)
    old: list[str] = []
    new: list[str] = []
    i += 1
    while i < len(lines) and (len(old) < old_n or len(new) < new_n):
        line = lines[i]
        body = line[1:] + "\n"
        if line[:1] == " ":
            old.append(body)
            new.append(body)
        elif line[:1] == "-":
            old.append(body)
        elif line[:1] == "+":
            new.append(body)
        else:
            raise _Refused(f"patch line {i + 1}: {line[:60]!r} in a hunk")
        i += 1
        if i < len(lines) and lines[i] == _NO_NEWLINE:
            for side in ((old, new) if line[:1] == " " else
                         ((old,) if line[:1] == "-" else (new,))):
                side[-1] = side[-1][:-1]
            i += 1
    if (len(old), len(new)) != (old_n, new_n):
        raise _Refused(f"patch line {i}: the hunk's line counts do not match its header")
    return i, (start, tuple(old), tuple(new))


def _patched(p: Publication, patches: list[_FilePatch],
             base: Mapping[str, BaseFile]) -> dict[str, str]:
    """Every candidate file's text after the patch (untouched ones as the base has them)."""
    texts: dict[str, str] = {}
    by_path = {f.path: f for f in patches}
    for rel in p.files:
        before = base.get(p.root + rel, BaseFile(None, None))
        if before.mode is not None and before.mode not in REGULAR:
            raise _Refused(f"{p.root}{rel} is not a regular file in the base commit "
                           f"(mode {before.mode})")
        one = by_path.get(rel)
        if one is None:
            if before.text is None:
                raise _Refused(f"{p.root}{rel}: the candidate holds it, but the base commit "
                               "has no such file and the patch does not create it")
            texts[rel] = before.text
            continue
        if one.new_file != (before.text is None):
            said = "creates" if one.new_file else "edits"
            raise _Refused(f"the patch {said} {p.root}{rel}, but the base commit "
                           f"{'has' if before.text is not None else 'has no'} such file")
        texts[rel] = _apply(p.root + rel, before.text or "", one)
        if len(texts[rel].encode()) > MAX_FILE_BYTES:
            raise _Refused(f"{p.root}{rel}: over {MAX_FILE_BYTES} bytes after the patch")
    return texts


def _apply(path: str, text: str, one: _FilePatch) -> str:
    """The hunks applied exactly where they say, or a refusal: no fuzz, no offsets."""
    lines = text.split("\n")
    lines = [line + "\n" for line in lines[:-1]] + ([lines[-1]] if lines[-1] else [])
    out: list[str] = []
    at = 0
    for start, old, new in one.hunks:
        begin = start - 1 if old else start
        if begin < at or tuple(lines[begin:begin + len(old)]) != old:
            raise _Refused(f"the patch does not apply to {path} at the base commit "
                           f"(hunk at line {start})")
        out += lines[at:begin]
        out += new
        at = begin + len(old)
    return "".join(out + lines[at:])


def _check_binding(p: Publication, texts: Mapping[str, str]) -> None:
    """The report's numbers are of candidate `p.candidate`: the files must be it."""
    made = content_hash(texts, {})
    if made != p.candidate:
        raise _Refused(f"the patched files hash to {made[:12]}, not to the candidate "
                       f"{p.candidate[:12]} whose numbers the report gives")
    for label, hashed in (("evaluation", p.evaluation.candidate),
                          ("reproduction", p.reproduction.candidate if p.reproduction
                           else p.candidate)):
        if hashed != p.candidate:
            raise _Refused(f"the {label} is of candidate {hashed[:12]}, the publication of "
                           f"{p.candidate[:12]}")
