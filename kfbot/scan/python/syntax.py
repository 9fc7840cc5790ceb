"""Small readings of Python syntax shared by the Python extractor's modules."""

from __future__ import annotations

import ast
from collections.abc import Iterable

_SHORT_CHAIN = 16  # dots in a name that `as_written` writes without `ast.unparse`


def dotted_name(expr: ast.AST) -> str | None:
    """`a.b.c` for a chain of attributes on a name; None for anything else."""
    if isinstance(expr, ast.Name):  # the common short forms first: `a` and `a.b`
        return expr.id
    if isinstance(expr, ast.Attribute) and isinstance(expr.value, ast.Name):
        return f"{expr.value.id}.{expr.attr}"
    parts: list[str] = []
    while isinstance(expr, ast.Attribute):
        parts.append(expr.attr)
        expr = expr.value
    if not isinstance(expr, ast.Name):
        return None
    parts.append(expr.id)
    return ".".join(reversed(parts))


def dotted_endswith(expr: ast.AST, suffix: str) -> bool:
    """`(dotted_name(expr) or "").endswith(suffix)` for a non-empty suffix without a dot,
    which can only match the last name: no string is built."""
    if isinstance(expr, ast.Attribute):
        return expr.attr.endswith(suffix) and head_name(expr) is not None
    return isinstance(expr, ast.Name) and expr.id.endswith(suffix)


def head_name(expr: ast.AST) -> str | None:
    """The name an attribute chain starts from: `a` for `a.b.c`."""
    while isinstance(expr, ast.Attribute):
        expr = expr.value
    return expr.id if isinstance(expr, ast.Name) else None


def names_in(expr: ast.AST) -> list[ast.Name]:
    """The names in an expression, in `ast.walk`'s (breadth-first) order, without the
    generator machinery of `ast.walk`: shapes and dtypes ask this of every argument."""
    if isinstance(expr, ast.Name):
        return [expr]
    found: list[ast.Name] = []
    queue: list[ast.AST] = [expr]
    for node in queue:  # appended to while read: a breadth-first walk
        if isinstance(node, ast.Name):
            found.append(node)
            continue
        for name in node._fields:
            value = getattr(node, name, None)
            if isinstance(value, ast.AST):
                queue.append(value)
            elif isinstance(value, list):
                queue += [v for v in value if isinstance(v, ast.AST)]
    return found


def as_written(node: ast.AST, limit: int = 200) -> str:
    # `ast.unparse` writes a dotted name as `dotted_name` does, only far more slowly. A
    # long chain is still left to it: it recurses, and fails on one as deep as the
    # recursion limit, which an analysis reports.
    text = dotted_name(node)
    if text is None or text.count(".") > _SHORT_CHAIN:
        text = ast.unparse(node)
    return clip(text, limit)


def clip(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: limit - 3] + "..."


def known(value: ast.expr | None) -> ast.expr | None:
    """None for a missing value and for a literal `None` (a placeholder, not a value)."""
    if value is None or (isinstance(value, ast.Constant) and value.value is None):
        return None
    return value


def unique(items: Iterable[str]) -> tuple[str, ...]:
    return tuple(dict.fromkeys(items))
