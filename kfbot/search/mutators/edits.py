"""SEARCH/REPLACE edit blocks: the format the LLM mutator answers in, parsed and applied.

An answer holds one or more blocks, each naming the file on the line before it:

    path/relative/to/repo.cu
    <<<<<<< SEARCH
    exact existing lines
    =======
    replacement lines
    >>>>>>> REPLACE

The SEARCH lines must occur exactly once in the file (whole lines). A block that follows
another directly may leave out the path; it edits the same file. Blocks may sit inside
Markdown code fences. A block with an empty SEARCH part creates an editable file that
does not exist yet.

Matching is exact first; when the exact lines are not there, lines are compared with
their leading and trailing whitespace ignored, and the match must still be unique (the
replacement is then re-indented by the difference). Every failure raises `EditError`
with a one-line reason meant to be fed back to the model. Pure functions, no I/O.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from kfbot.errors import KfbotError

SEARCH_MARK = "<<<<<<< SEARCH"
DIVIDER_MARK = "======="
REPLACE_MARK = ">>>>>>> REPLACE"

_SEARCH = re.compile(r"^\s*<{5,9} ?SEARCH\s*$")
_DIVIDER = re.compile(r"^\s*={5,9}\s*$")
_REPLACE = re.compile(r"^\s*>{5,9} ?REPLACE\s*$")
_FENCE = re.compile(r"^\s*(```|~~~)")
_QUOTE_LEN = 60

FORMAT_HELP = f"""\
Answer with edit blocks. Each block names one file (its path relative to the repository,
alone on a line) and replaces lines that exist in that file now:

path/relative/to/repo.cu
{SEARCH_MARK}
exact existing lines, copied character for character (enough of them to be unique)
{DIVIDER_MARK}
replacement lines
{REPLACE_MARK}

Use several blocks for several changes. The SEARCH lines must match the current file
exactly and occur only once; keep each block small. Only the editable files may be
changed."""


class EditError(KfbotError):
    """An edit that cannot be parsed or applied; the message is one line, for the model."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


@dataclass(frozen=True)
class Edit:
    path: str
    search: str  # whole lines, each ending with "\n"; "" creates a new file
    replace: str


def parse_edits(text: str) -> list[Edit]:
    """The edit blocks of an answer, in order ([] when it has none)."""
    lines = text.splitlines()
    edits: list[Edit] = []
    previous_path: str | None = None
    last_end = -1  # index of the REPLACE marker line of the previous block
    i = 0
    while i < len(lines):
        line = lines[i]
        if _REPLACE.match(line):
            raise EditError(f"malformed edit block: line {i + 1} has '{REPLACE_MARK}' "
                            f"without a '{SEARCH_MARK}' before it")
        if not _SEARCH.match(line):
            i += 1
            continue
        number = len(edits) + 1
        path = _path_before(lines, i, last_end, previous_path)
        if path is None:
            raise EditError(f"malformed edit block #{number} at line {i + 1}: no file path "
                            f"on the line before '{SEARCH_MARK}'")
        search, divider = _until(lines, i + 1, _DIVIDER)
        if divider is None:
            raise EditError(f"malformed edit block #{number} ({path}) at line {i + 1}: "
                            f"missing '{DIVIDER_MARK}' after '{SEARCH_MARK}'")
        replace, end = _until(lines, divider + 1, _REPLACE)
        if end is None:
            raise EditError(f"malformed edit block #{number} ({path}) at line {i + 1}: "
                            f"missing '{REPLACE_MARK}' after '{DIVIDER_MARK}'")
        edits.append(Edit(path, _joined(search), _joined(replace)))
        previous_path, last_end, i = path, end, end + 1
    return edits


def apply_edits(files: Mapping[str, str], edits: Sequence[Edit],
                editable: Sequence[str]) -> dict[str, str]:
    """The new full text of every file the edits change, applied in order."""
    if not edits:
        raise EditError("no edits: the answer has no SEARCH/REPLACE blocks")
    allowed = set(editable)
    current: dict[str, str] = {}
    for number, edit in enumerate(edits, 1):
        if edit.path not in allowed:
            shown = ", ".join(sorted(allowed)) or "none"
            raise EditError(f"edit #{number}: {edit.path} is not editable "
                            f"(editable: {shown})")
        text = current.get(edit.path, files.get(edit.path))
        if not edit.search:
            if text:
                raise EditError(f"edit #{number}: {edit.path}: the SEARCH part is empty; "
                                "quote the lines to replace")
            current[edit.path] = edit.replace
            continue
        if text is None:
            raise EditError(f"edit #{number}: {edit.path}: no such file")
        current[edit.path] = _apply_one(number, edit, text)
    changed = {path: text for path, text in current.items() if text != files.get(path)}
    if not changed:
        raise EditError("the edits change nothing: every REPLACE equals its SEARCH")
    return changed


def _path_before(lines: list[str], at: int, last_end: int,
                 previous_path: str | None) -> str | None:
    """The path on the nearest non-blank, non-fence line above a SEARCH marker."""
    j = at - 1
    while j > last_end and (not lines[j].strip() or _FENCE.match(lines[j])):
        j -= 1
    if j == last_end:  # straight after the previous block (or at the top): same file
        return previous_path
    candidate = lines[j].strip()
    if candidate.startswith("#") and " " in candidate:  # a Markdown heading: "### a.cu"
        candidate = candidate.lstrip("#").strip()
    candidate = re.sub(r"^(?:file|path)\s*:\s*", "", candidate, flags=re.IGNORECASE)
    candidate = candidate.strip("`*'\"").strip().removeprefix("./")
    if not candidate or any(ch.isspace() for ch in candidate) or candidate.endswith(":"):
        return None
    return candidate


def _until(lines: list[str], start: int, marker: re.Pattern[str]) -> tuple[list[str], int | None]:
    """Lines from `start` up to the marker, and the marker's index (None: missing)."""
    for j in range(start, len(lines)):
        if marker.match(lines[j]):
            return lines[start:j], j
        if _SEARCH.match(lines[j]) or _REPLACE.match(lines[j]) or \
                (marker is _REPLACE and _DIVIDER.match(lines[j])):
            return lines[start:j], None
    return lines[start:], None


def _joined(lines: list[str]) -> str:
    return "".join(line + "\n" for line in lines)


def _apply_one(number: int, edit: Edit, text: str) -> str:
    file_lines = text.splitlines(keepends=True)
    bare = [line.rstrip("\r\n") for line in file_lines]
    search = edit.search.splitlines()
    replace = edit.replace.splitlines()
    newline = "\r\n" if file_lines and file_lines[0].endswith("\r\n") else "\n"
    where = f"edit #{number}: {edit.path}"

    exact = _find(bare, search, lambda s: s)
    if len(exact) > 1:
        raise EditError(f"{where}: the SEARCH text is ambiguous: it occurs {len(exact)} times "
                        f"(at lines {_lines_at(exact)}); include more lines to make it unique")
    if exact:
        start = exact[0]
    else:
        loose = _find(bare, search, str.strip)
        if len(loose) > 1:
            raise EditError(f"{where}: the SEARCH text is ambiguous: ignoring whitespace it "
                            f"occurs {len(loose)} times (at lines {_lines_at(loose)}); include "
                            "more lines to make it unique")
        if not loose:
            raise EditError(f"{where}: SEARCH text not found: {_missing(bare, search)}")
        start = loose[0]
        replace = _reindent(search, bare[start:start + len(search)], replace)
    end = start + len(search)
    new = [line + newline for line in replace]
    if new and end == len(file_lines) and not file_lines[-1].endswith(("\n", "\r")):
        new[-1] = new[-1].rstrip("\r\n")  # the file had no final newline: keep it so
    return "".join(file_lines[:start] + new + file_lines[end:])


def _find(bare: list[str], search: list[str], key: Callable[[str], str]) -> list[int]:
    want = [key(s) for s in search]
    have = [key(s) for s in bare]
    n = len(want)
    return [i for i in range(len(have) - n + 1) if have[i:i + n] == want]


def _lines_at(starts: list[int]) -> str:
    shown = ", ".join(str(i + 1) for i in starts[:5])
    return shown + (", …" if len(starts) > 5 else "")


def _missing(bare: list[str], search: list[str]) -> str:
    """Which part of the SEARCH text is not in the file, quoted."""
    present = {line.strip() for line in bare}
    for line in search:
        if line.strip() not in present:
            return f"no line of the file matches {_quote(line)}"
    return (f"each line exists but not together in this order (first line {_quote(search[0])});"
            " copy the lines exactly as they are now")


def _quote(line: str) -> str:
    text = line.strip()
    if len(text) > _QUOTE_LEN:
        text = text[:_QUOTE_LEN - 1] + "…"
    return repr(text)


def _indent(line: str) -> str:
    return line[:len(line) - len(line.lstrip())]


def _reindent(search: list[str], found: list[str], replace: list[str]) -> list[str]:
    """Shift the replacement by the indentation the matched lines differ from SEARCH."""
    pairs = [(s, f) for s, f in zip(search, found, strict=True) if s.strip()]
    if not pairs:
        return replace
    want, have = _indent(pairs[0][0]), _indent(pairs[0][1])
    if have.startswith(want):
        extra = have[len(want):]
        return [extra + line if line.strip() else line for line in replace]
    if want.startswith(have):
        cut = want[len(have):]
        return [line[len(cut):] if line.startswith(cut) else line for line in replace]
    return replace
