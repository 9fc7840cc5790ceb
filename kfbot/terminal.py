"""Lines for a terminal: its width, long lines wrapped to it, repeats collapsed.

The `--explain` views print paths, chains of calls and compiler output, any of which
can be hundreds of characters long. A terminal would fold them at its edge, mid-word
and back at column 0, where the indentation that says which step a line belongs to is
lost. So a line too long for the terminal is wrapped at spaces, its continuation
indented under its own text; a word longer than the line is the only thing ever cut.
"""

from __future__ import annotations

import os
import shutil
import sys
import textwrap
from collections.abc import Iterable, Sequence

MIN_WIDTH = 40  # narrower than this, wrapping does more harm than good
HANG = 4  # a continuation's indent beyond its line's own


def width() -> int | None:
    """The columns to fit: `$COLUMNS` where set, else the terminal's; None for a pipe or a
    file without `$COLUMNS` (a log keeps each line whole, for grep)."""
    columns = os.environ.get("COLUMNS", "")
    if columns.isdigit() and int(columns) > 0:
        return max(MIN_WIDTH, int(columns))
    if sys.stdout.isatty():
        return max(MIN_WIDTH, shutil.get_terminal_size().columns)
    return None


def wrapped(line: str, columns: int | None, hang: int = HANG) -> list[str]:
    """`line` as lines of at most `columns` characters (None: as it is), continuations
    indented `hang` beyond the line's own indentation."""
    if columns is None or len(line) <= columns:
        return [line]
    indent = len(line) - len(line.lstrip(" "))
    # A deeply indented line still gets half the width for its words.
    more = min(indent + hang, columns // 2)
    return textwrap.wrap(line.strip(" "), columns, initial_indent=" " * indent,
                         subsequent_indent=" " * more, break_on_hyphens=False) or [line]


def fitted(lines: Iterable[str], columns: int | None, hang: int = HANG) -> list[str]:
    """Every line of `lines` wrapped to `columns`."""
    return [piece for line in lines for piece in wrapped(line, columns, hang)]


def and_more(shown: Sequence[str], total: int, what: str = "like it") -> str:
    """`a, b and 4 more like it` for a list cut to `shown` of `total` items."""
    rest = total - len(shown)
    head = ", ".join(shown)
    return f"{head} and {rest} more {what}" if rest > 0 else head
