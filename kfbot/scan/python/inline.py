"""CUDA and C++ sources that `load_inline` takes from Python strings or file reads.

A source literal is kept with the 0-based line of the file its text starts on, so that
facts found in the code can point at the Python file; concatenation, `textwrap.dedent`
and `strip` keep (or shift) that mapping. A source read from a file with `open(p).read()`
or `Path(p).read_text()` is kept as that file's path.
"""

from __future__ import annotations

import ast
import textwrap
from dataclasses import dataclass
from typing import Literal

from kfbot.scan.model import InlineSource
from kfbot.scan.python.scopes import MAX_DEPTH, Scope, ScopeIndex
from kfbot.scan.python.syntax import as_written, known
from kfbot.scan.python.values import Evaluator


@dataclass(frozen=True)
class _Piece:
    """A string literal's text and the 0-based file line its first text line is on."""

    text: str
    offset: int


@dataclass(frozen=True)
class _FileRead:
    path: str


@dataclass(frozen=True)
class _Unresolved:
    text: str


_SourceItem = _Piece | _FileRead | _Unresolved


def _literal_offset(node: ast.Constant, text: str) -> int:
    """The 0-based line of the literal's first text line.

    A triple-quoted literal whose opening quotes end with a backslash-newline starts its
    text on the next line; it spans one line more than its text has newlines.
    """
    span = (node.end_lineno or node.lineno) - node.lineno
    return node.lineno - 1 + (1 if span and text.count("\n") == span - 1 else 0)


def _added(expr: ast.BinOp) -> list[ast.expr]:
    """The operands of a left-nested `a + b + c` chain, in order."""
    operands: list[ast.expr] = []
    node: ast.expr = expr
    while isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
        operands.append(node.right)
        node = node.left
    operands.append(node)
    return operands[::-1]


def _merge(pieces: list[_Piece]) -> list[_Piece]:
    """Join literals only where the joined text keeps its line mapping to the file."""
    out: list[_Piece] = []
    for p in pieces:
        if out and p.offset == out[-1].offset + out[-1].text.count("\n"):
            out[-1] = _Piece(out[-1].text + p.text, out[-1].offset)
        else:
            out.append(p)
    return out


def _strip_pieces(pieces: list[_Piece], how: str, chars: str | None) -> list[_Piece]:
    pieces = list(pieces)
    if how in ("strip", "lstrip"):
        first = pieces[0]
        kept = first.text.lstrip(chars)
        removed = first.text[: len(first.text) - len(kept)]
        pieces[0] = _Piece(kept, first.offset + removed.count("\n"))
    if how in ("strip", "rstrip"):
        pieces[-1] = _Piece(pieces[-1].text.rstrip(chars), pieces[-1].offset)
    return pieces


class InlineReader:
    """The inline sources of `load_inline` calls in one file."""

    def __init__(self, index: ScopeIndex, values: Evaluator) -> None:
        self.index = index
        self.values = values

    def sources(self, expr: ast.expr | None, scope: Scope, language: Literal["cpp", "cuda"],
                build: str, line: int) -> list[InlineSource]:
        """The sources a `cpp_sources`/`cuda_sources` argument of build `build` holds."""
        if known(expr) is None or expr is None:
            return []
        out: list[InlineSource] = []
        for item in self._source_items(expr, scope, 0):
            if isinstance(item, _Piece):
                if item.text.strip():  # `cpp_sources=""` holds no code
                    out.append(InlineSource(build, language, item.text, item.offset))
            elif isinstance(item, _FileRead):
                out.append(InlineSource(build, language, None, 0, item.path))
            else:
                self.values.note(line, f"load_inline {build!r}: {language} source "
                                       f"`{item.text}` is neither a string literal nor a file "
                                       "read; left out")
        return out

    def _source_items(self, expr: ast.expr, scope: Scope, depth: int) -> list[_SourceItem]:
        if depth > MAX_DEPTH:
            return [_Unresolved(as_written(expr))]
        if isinstance(expr, (ast.List, ast.Tuple)):
            return [i for e in expr.elts for i in self._source_items(e, scope, depth + 1)]
        if isinstance(expr, ast.Name):
            b = self.index.lookup(expr.id, scope, expr.lineno)
            if b is not None and b.value is not None:
                return self._source_items(b.value, b.scope, depth + 1)
            return [_Unresolved(expr.id)]
        pieces = self._pieces(expr, scope, depth)
        if pieces is not None:
            return list(pieces)
        read = self._file_read(expr, scope)
        return [read if read is not None else _Unresolved(as_written(expr))]

    def _pieces(self, expr: ast.expr, scope: Scope, depth: int) -> list[_Piece] | None:
        """A string expression as literal pieces, each mapped to its line in the file."""
        if depth > MAX_DEPTH:
            return None
        if isinstance(expr, ast.Constant) and isinstance(expr.value, str):
            return [_Piece(expr.value, _literal_offset(expr, expr.value))]
        if isinstance(expr, ast.JoinedStr):
            return [_Piece(self._fstring_source(expr, scope), expr.lineno - 1)]
        if isinstance(expr, ast.Name):
            b = self.index.lookup(expr.id, scope, expr.lineno)
            if b is None or b.value is None:
                return None
            return self._pieces(b.value, b.scope, depth + 1)
        if isinstance(expr, ast.BinOp) and isinstance(expr.op, ast.Add):
            pieces: list[_Piece] = []
            for operand in _added(expr):  # a long `"..." + "..."` chain is one level
                found = self._pieces(operand, scope, depth + 1)
                if found is None:
                    return None
                pieces += found
            return _merge(pieces)
        if isinstance(expr, ast.Call):
            return self._transformed(expr, scope, depth)
        return None

    def _transformed(self, call: ast.Call, scope: Scope, depth: int) -> list[_Piece] | None:
        """`textwrap.dedent(s)` and `s.strip()` keep (or shift) the line mapping."""
        func = call.func
        if isinstance(func, ast.Attribute) and func.attr in ("strip", "lstrip", "rstrip"):
            chars = self.values.eval(call.args[0], scope) if call.args else None
            if call.args and not (isinstance(chars, str) and chars.isspace()):
                return None
            inner = self._pieces(func.value, scope, depth + 1)
            return _strip_pieces(inner, func.attr, chars if isinstance(chars, str) else None) \
                if inner else None
        if self.index.qualname(func) in ("textwrap.dedent", "dedent") and len(call.args) == 1:
            inner = self._pieces(call.args[0], scope, depth + 1)
            return [_Piece(textwrap.dedent(p.text), p.offset) for p in inner] if inner else None
        return None

    def _fstring_source(self, expr: ast.JoinedStr, scope: Scope) -> str:
        parts: list[str] = []
        for v in expr.values:
            if isinstance(v, ast.Constant) and isinstance(v.value, str):
                parts.append(v.value)
            elif isinstance(v, ast.FormattedValue):
                text = self.values.formatted(v, scope, {}, 0)
                if text is None:
                    text = "{" + as_written(v.value) + "}"
                    self.values.note(expr.lineno, f"placeholder {text} in an inline source "
                                                  "is not a static value; kept as written")
                parts.append(text)
        return "".join(parts)

    def _file_read(self, expr: ast.expr, scope: Scope) -> _FileRead | _Unresolved | None:
        """`open(p).read()`, `Path(p).read_text()` and `f.read()` of `with open(p) as f`."""
        if not isinstance(expr, ast.Call) or not isinstance(expr.func, ast.Attribute):
            return None
        target = expr.func.value
        path: tuple[ast.expr, Scope] | None = None
        if expr.func.attr == "read_text":
            path = (target, scope)
        elif expr.func.attr == "read":
            path = self._opened(target, scope)
        if path is None:
            return None
        value = self.values.eval(path[0], path[1])
        if isinstance(value, str):
            return _FileRead(self.values.resolve_path(value, path[0]))
        return _Unresolved(as_written(expr))

    def _opened(self, target: ast.expr, scope: Scope) -> tuple[ast.expr, Scope] | None:
        if isinstance(target, ast.Name):
            b = self.index.lookup(target.id, scope, target.lineno)
            if b is None or b.value is None:
                return None
            target, scope = b.value, b.scope
        if isinstance(target, ast.Call) and target.args and self.index.qualname(target.func) in (
                "open", "io.open", "codecs.open"):
            return target.args[0], scope
        return None
