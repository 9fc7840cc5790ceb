"""Small readings of Python syntax shared by the Python extractor's modules."""

from __future__ import annotations

import ast
from collections.abc import Iterable


def dotted_name(expr: ast.AST) -> str | None:
    """`a.b.c` for a chain of attributes on a name; None for anything else."""
    parts: list[str] = []
    while isinstance(expr, ast.Attribute):
        parts.append(expr.attr)
        expr = expr.value
    if not isinstance(expr, ast.Name):
        return None
    parts.append(expr.id)
    return ".".join(reversed(parts))


def head_name(expr: ast.AST) -> str | None:
    """The name an attribute chain starts from: `a` for `a.b.c`."""
    while isinstance(expr, ast.Attribute):
        expr = expr.value
    return expr.id if isinstance(expr, ast.Name) else None


def as_written(node: ast.AST, limit: int = 200) -> str:
    return clip(ast.unparse(node), limit)


def clip(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: limit - 3] + "..."


def known(value: ast.expr | None) -> ast.expr | None:
    """None for a missing value and for a literal `None` (a placeholder, not a value)."""
    if value is None or (isinstance(value, ast.Constant) and value.value is None):
        return None
    return value


def unique(items: Iterable[str]) -> tuple[str, ...]:
    return tuple(dict.fromkeys(items))
