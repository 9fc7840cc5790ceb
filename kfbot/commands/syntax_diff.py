"""What tree-sitter says about a change to a C/C++/CUDA file nvcc did not look at.

tree-sitter's CUDA grammar reads most code, not every valid form: some macro tricks,
`(obj).template f<T>()`, a few attribute spellings. Its complaints are evidence only
where the change made them, so each place it cannot read now is set against the
committed version of the file (lines matched with difflib, as a diff would):

- the matching place of the committed version parsed: the change broke it (a missing
  `;` or `}`), and the hook fails, as nvcc would have;
- the committed version could not be read there either: the grammar's blind spot, not
  the change's; a changed line in it is a note (nothing checked that line), an
  untouched one is not mentioned.

A new file has no committed version to hold the grammar's blind spots against: there
only a token tree-sitter had to assume (a missing `;`, `}` or `)`) fails the hook, and
a place it cannot read otherwise is a note.
"""

from __future__ import annotations

import difflib
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from kfbot.scan import treesitter

# tree-sitter may put an error a line early or late (it notices a missing token when
# the next one comes): a complaint this close to one the committed version had is the
# same complaint, and the hook rather notes a real error than blocks valid code.
SLACK = 1


# made: the committed version parsed there; old: it could not be read there either;
# new: in a new file, a place that is not a missing token.
Cause = Literal["made", "old", "new"]


@dataclass(frozen=True)
class SyntaxFinding:
    file: str
    line: int
    message: str  # "missing `;`", "cannot parse `...`"
    cause: Cause

    @property
    def made_by_change(self) -> bool:
        return self.cause == "made"

    def text(self) -> str:
        return f"{self.file}:{self.line}: error: {self.message} (found by tree-sitter)"


def syntax_findings(file: str, now: bytes, before: bytes | None) -> list[SyntaxFinding]:
    """The places of `file` (its bytes `now`) tree-sitter cannot read and the change
    touched or made, judged against its committed bytes `before` (None: a new file)."""
    found = treesitter.syntax_errors(treesitter.parse_cuda(now))
    if not found:
        return []
    if before is None:
        return [SyntaxFinding(file, first, message,
                              "made" if message.startswith("missing") else "new")
                for first, _, message in found]
    old = treesitter.syntax_errors(treesitter.parse_cuda(before))
    if not old:
        return [SyntaxFinding(file, first, message, "made") for first, _, message in found]
    lines = _LineMap(before.splitlines(), now.splitlines())
    out = []
    for first, last, message in found:
        image, touched = lines.before(first, last)
        known = any(a - SLACK <= n <= b + SLACK for a, b, _ in old for n in image)
        if not known:
            out.append(SyntaxFinding(file, first, message, "made"))
        elif touched:
            out.append(SyntaxFinding(file, first, message, "old"))
    return out


class _LineMap:
    """Lines of the new version mapped onto the old one, as a line diff pairs them."""

    def __init__(self, old: Sequence[bytes], new: Sequence[bytes]) -> None:
        matcher = difflib.SequenceMatcher(None, old, new, autojunk=False)
        self.old_of: dict[int, tuple[int, ...]] = {}  # 1-based new line: old lines
        self.changed: set[int] = set()
        for tag, i1, i2, j1, j2 in matcher.get_opcodes():
            if tag == "equal":
                for j in range(j1, j2):
                    self.old_of[j + 1] = (i1 + (j - j1) + 1,)
                continue
            # Replaced lines stand for the old lines they replace; inserted ones for
            # the lines around the gap; a deletion touches the lines beside it.
            image = tuple(range(i1 + 1, i2 + 1)) if i2 > i1 else (i1, i1 + 1)
            for j in range(j1, j2):
                self.old_of[j + 1] = image
            self.changed |= set(range(j1 + 1, j2 + 1)) if j2 > j1 else {j1, j1 + 1}

    def before(self, first: int, last: int) -> tuple[set[int], bool]:
        """The old lines lines first..last of the new version stand for, and whether
        the change touched any of them."""
        image = {n for j in range(first, last + 1) for n in self.old_of.get(j, ())}
        return image, any(j in self.changed for j in range(first, last + 1))
