"""Comparisons of sizes with literals: how a candidate special-cases a shape.

`if (rows == 4096 && cols == 4096) rows /= 2;` passes every check at the sizes a
repository's tests call and is wrong at 4096 x 4096. Kernels that special-case literal
sizes are a known way to look fast on a benchmark and be wrong in use, so:

- the static check `size-literal` reports every comparison of a size with a number
  that the candidate adds (a warning: `if (cols <= 1024)` may be an honest dispatch),
  and `size-special-case` rejects one whose branch changes the size it compared;
- the engine verifies the candidate at every such number (and one either side of it
  for `<`, `<=`, `>`, `>=`), so a special case that is wrong fails verification there.

A *size* is an integer parameter of a function, a local initialised from a tensor's
`size()`/`numel()`/... (or from other sizes), or such a call itself. A number is an
integer literal or a `#define`/`const` integer of the file, 2 or more (comparisons with
0 and 1 are the usual empty and degenerate cases).
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from functools import lru_cache
from typing import Protocol

from kfbot.scan import treesitter as tsx
from kfbot.scan.treesitter import Node

COMPARISONS = frozenset({"==", "!=", "<", "<=", ">", ">="})
ORDERING = frozenset({"<", "<=", ">", ">="})
SIZE_METHODS = frozenset({"size", "numel", "sizes", "stride", "strides", "dim", "shape",
                          "get_size", "get_numel"})
_INT_TYPE = re.compile(r"^(const\s+)?(unsigned\s+|signed\s+)?(int|long|short|long long|size_t|"
                       r"ssize_t|u?int(8|16|32|64)_t|index_t|int64|uint|unsigned)(\s+int)?$")
_INT_LITERAL = re.compile(r"^(0[xX][0-9a-fA-F]+|\d+)([uUlL]*)$")
MIN_VALUE = 2

# One walk of each tree: parameters, #defines, initialised declarations, comparisons.
QUERIES = (
    "(parameter_declaration type: (_) @type declarator: (identifier) @name)",
    "(preproc_def name: (identifier) @name value: (preproc_arg) @value)",
    "(init_declarator declarator: (identifier) @name value: (_) @value)",
    "(binary_expression left: (_) @left operator: _ @op right: (_) @right) @cmp",
)


class Text(Protocol):
    """A unit of source (`static.Source`): its path and line offset."""

    @property
    def path(self) -> str: ...

    @property
    def line_offset(self) -> int: ...


class Parsed(Protocol):
    """A parsed unit (`static.Unit`): its source, its lines and its tree; `macros` when it
    holds the bodies of the source's `#define`s, laid out on their own lines."""

    @property
    def source(self) -> Text: ...

    @property
    def lines(self) -> list[str]: ...

    @property
    def root(self) -> Node: ...

    @property
    def macros(self) -> bool: ...


@dataclass(frozen=True)
class SizeComparison:
    path: str
    line: int  # 1-based, the source's line offset applied
    source_line: str
    size: str  # the size compared, as written
    op: str
    value: int
    changes_size: bool  # the branch it guards assigns to that size
    key: str  # the comparison's text without spaces: what "new" is counted by


def size_comparisons(units: Sequence[Parsed]) -> list[SizeComparison]:
    """Every comparison of a size with a number in the units. A macro body's sizes and
    constants are its source's: a special case cannot hide in a `#define`."""
    found: list[SizeComparison] = []
    known: dict[str, tuple[set[str], dict[str, int]]] = {}
    for unit in sorted(units, key=lambda u: u.macros):  # sources before their macros
        params, defines, inits, compares = tsx.matches_by_pattern(QUERIES, unit.root)
        sizes, numbers = known.setdefault(unit.source.path, (set(), {}))
        numbers.update(_constants(defines, inits))
        sizes.update(_sizes(params, inits, sizes))
        found += _comparisons(unit, compares, sizes, numbers)
    return found


@lru_cache(maxsize=16)
def _cached(units: tuple[Parsed, ...]) -> tuple[SizeComparison, ...]:
    """Found once: every candidate is compared with the same original, and the two
    static checks and the engine each ask about the same candidate."""
    return tuple(size_comparisons(units))


def new_size_comparisons(original: Sequence[Parsed],
                         candidate: Sequence[Parsed]) -> list[SizeComparison]:
    """The comparisons the candidate has more of than the original."""
    before = Counter(c.key for c in _cached(tuple(original)))
    out = []
    for comp in _cached(tuple(candidate)):
        if before[comp.key] > 0:
            before[comp.key] -= 1
        else:
            out.append(comp)
    return out


def sizes_to_try(comparisons: Sequence[SizeComparison]) -> tuple[int, ...]:
    """Each compared number, and for an ordering one either side of it too."""
    found: set[int] = set()
    for c in comparisons:
        found.add(c.value)
        if c.op in ORDERING:
            found.update((c.value - 1, c.value + 1))
    return tuple(sorted(v for v in found if v >= 1))


def _comparisons(unit: Parsed, compares: Sequence[dict[str, Node]], sizes: set[str],
                 numbers: dict[str, int]) -> Iterator[SizeComparison]:
    for m in compares:
        op = tsx.text(m["op"])
        if op not in COMPARISONS:
            continue
        for size, other in ((m["left"], m["right"]), (m["right"], m["left"])):
            value = _number(other, numbers)
            if value is None or value < MIN_VALUE or not _is_size(size, sizes):
                continue
            row = tsx.line(m["cmp"])
            yield SizeComparison(
                path=unit.source.path, line=row + unit.source.line_offset,
                source_line=unit.lines[row - 1].strip() if row <= len(unit.lines) else "",
                size=tsx.text(size), op=op, value=value,
                changes_size=_changes(m["cmp"], _name(size)),
                key="".join(tsx.text(m["cmp"]).split()))
            break


def _constants(defines: Sequence[dict[str, Node]],
               inits: Sequence[dict[str, Node]]) -> dict[str, int]:
    """`#define N 4096` and `constexpr int N = 4096;`: names of integer constants."""
    out: dict[str, int] = {}
    for m in defines:
        value = _literal(tsx.text(m["value"]).strip())
        if value is not None:
            out[tsx.text(m["name"])] = value
    for m in inits:
        decl = m["name"].parent.parent if m["name"].parent else None
        if decl is not None and m["value"].type == "number_literal" and \
                any(tsx.text(c) in ("const", "constexpr") for c in decl.children):
            value = _literal(tsx.text(m["value"]))
            if value is not None:
                out[tsx.text(m["name"])] = value
    return out


def _sizes(params: Sequence[dict[str, Node]], inits: Sequence[dict[str, Node]],
           known: set[str]) -> set[str]:
    """Integer parameters, and locals made from sizes, in the order they are declared."""
    found = set(known) | {tsx.text(m["name"]) for m in params
                          if _INT_TYPE.match(" ".join(tsx.text(m["type"]).split()))}
    for m in inits:
        if _mentions_size(m["value"], found):
            found.add(tsx.text(m["name"]))
    return found


def _mentions_size(node: Node, sizes: set[str]) -> bool:
    if node.type == "identifier" and tsx.text(node) in sizes:
        return True
    if _size_call(node):
        return True
    if node.type in ("call_expression", "conditional_expression"):
        return False  # a function of sizes may be anything; a choice is not a size
    return any(_mentions_size(c, sizes) for c in node.named_children)


def _size_call(node: Node) -> bool:
    """`x.size(0)`, `t.numel()`, `x.sizes()[1]`, `x->dim()`."""
    if node.type == "subscript_expression":
        inner = node.child_by_field_name("argument")
        return inner is not None and _size_call(inner)
    if node.type != "call_expression":
        return False
    fn = node.child_by_field_name("function")
    field = fn.child_by_field_name("field") if fn is not None and \
        fn.type == "field_expression" else None
    return field is not None and tsx.text(field) in SIZE_METHODS


def _is_size(node: Node, sizes: set[str]) -> bool:
    while node.type == "parenthesized_expression" and node.named_child_count == 1:
        node = node.named_children[0]
    if node.type == "identifier":
        return tsx.text(node) in sizes
    return _size_call(node)


def _name(node: Node) -> str:
    while node.type == "parenthesized_expression" and node.named_child_count == 1:
        node = node.named_children[0]
    return tsx.text(node) if node.type == "identifier" else ""


def _number(node: Node, constants: dict[str, int]) -> int | None:
    while node.type == "parenthesized_expression" and node.named_child_count == 1:
        node = node.named_children[0]
    if node.type == "number_literal":
        return _literal(tsx.text(node))
    if node.type == "identifier":
        return constants.get(tsx.text(node))
    return None


def _literal(text: str) -> int | None:
    match = _INT_LITERAL.match(text.replace("'", ""))
    if match is None:
        return None
    return int(match.group(1), 16 if match.group(1)[:2].lower() == "0x" else 10)


def _changes(comparison: Node, size: str) -> bool:
    """Whether the `if` or the assignment the comparison decides writes to `size`."""
    if not size:
        return False
    parent = comparison.parent
    while parent is not None:
        if parent.type == "if_statement":
            body = parent.child_by_field_name("consequence")
            return body is not None and _assigns(body, size)
        if parent.type == "assignment_expression":
            left = parent.child_by_field_name("left")
            return left is not None and tsx.text(left) == size
        if parent.type in ("compound_statement", "expression_statement", "declaration",
                           "for_statement", "while_statement", "return_statement"):
            return False
        parent = parent.parent
    return False


def _assigns(node: Node, size: str) -> bool:
    if node.type in ("assignment_expression", "update_expression"):
        target = node.child_by_field_name("left") or node.child_by_field_name("argument")
        if target is not None and tsx.text(target) == size:
            return True
    return any(_assigns(c, size) for c in node.named_children)
