"""Records as indented lists, for terminals too narrow for a table.

A table squeezed into 80 columns breaks names and paths mid-token (`matmul_k` /
`ernel`), which a person then cannot search for or copy. Below `TABLE_MIN_WIDTH`
columns, or wherever a table could only fit by breaking a word (`table_fits`), a report
is a list instead: each record's title on a line of its own, then one `label  value`
line per field, wrapped only at spaces. A token longer than the line is kept whole.
"""

from __future__ import annotations

import textwrap
from collections.abc import Sequence

TABLE_MIN_WIDTH = 120
_CELL_FRAME = 3  # a table cell's border and padding, in columns


def table_fits(header: Sequence[str], rows: Sequence[Sequence[str]], width: int) -> bool:
    """Whether a table of these columns fits in `width` with no word broken: each
    column at least as wide as its longest word."""
    if width < TABLE_MIN_WIDTH:
        return False
    needed = 1
    for n, title in enumerate(header):
        words = [w for cell in (title, *(row[n] for row in rows)) for w in cell.split()]
        needed += max(map(len, words), default=0) + _CELL_FRAME
    return needed <= width


def record_lines(title: str, fields: Sequence[tuple[str, str]], width: int) -> list[str]:
    """`title`, then each (label, value) indented under it. A value of several lines
    gives several lines in the value column; a line too long for it goes on two
    spaces further in."""
    pad = max((len(label) for label, _ in fields), default=0) + 4
    out = [title]
    for label, value in fields:
        head = f"  {label:<{pad - 2}}"
        for n, part in enumerate(value.splitlines() or [""]):
            wrapped = textwrap.wrap(part, max(20, width - pad), subsequent_indent="  ",
                                    break_long_words=False, break_on_hyphens=False) or [""]
            out += [(head if n == m == 0 else " " * pad) + piece
                    for m, piece in enumerate(wrapped)]
    return out
