"""Which text a source rewrite sees: a C++/CUDA file whole, or the CUDA source held in a
string of a load_inline `.py` file.

In a `.py` file the rewrite is applied to the string literal assigned once that holds
a `__global__` (found with `ast`); only a literal whose source text equals its value
(a raw string, or one without backslashes) is rewritten, so splicing it back cannot
change its meaning.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Callable

CUDA_SUFFIXES = (".cu", ".cuh", ".cpp", ".cc", ".cxx", ".h", ".hpp")

SourceFn = Callable[[str], "str | None"]


def cuda_text(path: str, content: str) -> str | None:
    """The C++/CUDA a rewrite of this file would see, or None for other files."""
    if path.endswith(".py"):
        found = cuda_literal(content)
        return found[4] if found is not None else None
    return content if path.endswith(CUDA_SUFFIXES) else None


def apply_to_file(fn: SourceFn, path: str, content: str) -> str | None:
    """Apply a source rewrite to a C++/CUDA file, or to the CUDA string of a `.py` file."""
    if path.endswith(".py"):
        return _apply_to_python(fn, content)
    if path.endswith(CUDA_SUFFIXES):
        return fn(content)
    return None


def _apply_to_python(fn: SourceFn, content: str) -> str | None:
    found = cuda_literal(content)
    if found is None:
        return None
    start, end, prefix, quote, value = found
    new_value = fn(value)
    if new_value is None or new_value == value:
        return None
    raw = "r" in prefix.lower()
    if quote in new_value or new_value.endswith(quote[0]) or (not raw and "\\" in new_value):
        return None
    new = content[:start] + prefix + quote + new_value + quote + content[end:]
    check = cuda_literal(new)
    return new if check is not None and check[4] == new_value else None


def cuda_literal(content: str) -> tuple[int, int, str, str, str] | None:
    """(start, end, prefix, quote, value) of the one string assigned that holds a kernel."""
    try:
        tree = ast.parse(content)
    except SyntaxError:
        return None
    lines = content.splitlines(keepends=True)
    starts = [0]
    for line in lines:
        starts.append(starts[-1] + len(line.encode("utf-8")))
    raw_bytes = content.encode("utf-8")
    hits = []
    for node in ast.walk(tree):
        value = node.value if isinstance(node, (ast.Assign, ast.AnnAssign)) else None
        if isinstance(value, ast.Constant) and isinstance(value.value, str) \
                and "__global__" in value.value and value.end_lineno is not None \
                and value.end_col_offset is not None:
            begin = starts[value.lineno - 1] + value.col_offset
            finish = starts[value.end_lineno - 1] + value.end_col_offset
            hits.append((begin, finish, value.value))
    if len(hits) != 1:
        return None
    begin, finish, value_text = hits[0]
    source = raw_bytes[begin:finish].decode("utf-8")
    match = re.fullmatch(r"([rRuU]?)(\"\"\"|'''|\"|')(.*)\2", source, flags=re.DOTALL)
    if match is None:
        return None  # implicit concatenation, f-string or bytes: left alone
    prefix, quote, body = match.groups()
    if body != value_text:
        return None  # escapes make the source differ from the value
    start = len(raw_bytes[:begin].decode("utf-8"))
    end = len(raw_bytes[:finish].decode("utf-8"))
    return start, end, prefix, quote, body
