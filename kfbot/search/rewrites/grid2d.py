"""Recognising a kernel with one thread per element of a 2-D output: the shape the
matmul and transpose rewrites start from.

    int row = blockIdx.y * blockDim.y + threadIdx.y;   // any order, a cast, * BLOCK
    int col = blockIdx.x * blockDim.x + threadIdx.x;
    if (row < M && col < N) { ... }                     // or: if (row >= M || col >= N) return;

The two index variables (either may use x or y) must not change, and nothing else in
the kernel may read the thread, block or grid.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from kfbot.search.rewrites import syntax as sx

_CAST = r"(?:\((?:int|unsigned|unsignedint|int64_t|uint64_t|size_t|long|longlong)\))?"
_SCALE = r"(?:blockDim\.{a}|[A-Za-z_]\w*|\d+)"
_BUILTINS = frozenset({"threadIdx", "blockIdx", "blockDim", "gridDim", "warpSize"})


def _index(axis: str) -> re.Pattern[str]:
    scale = _SCALE.format(a=axis)
    product = rf"(?:{_CAST}blockIdx\.{axis}\*{scale}|{scale}\*{_CAST}blockIdx\.{axis})"
    return re.compile(rf"{product}\+{_CAST}threadIdx\.{axis}|{_CAST}threadIdx\.{axis}\+{product}")


_AXES = {"x": _index("x"), "y": _index("y")}


@dataclass(frozen=True)
class Index:
    name: str
    type: str  # declared type, without const
    bound: str  # what the guard compares it with (an identifier or a literal)


@dataclass(frozen=True)
class Grid2D:
    fn: sx.Node
    x: Index  # the variable built from threadIdx.x
    y: Index
    body: tuple[sx.Node, ...]  # the statements under the guard
    first: sx.Node  # the first statement of the kernel body (the rewrite replaces them all)
    last: sx.Node

    def var(self, name: str) -> Index:
        return self.x if name == self.x.name else self.y


def grid2d(fn: sx.Node) -> Grid2D | None:
    body = sx.field(fn, "body")
    stmts = sx.named(body) if body is not None else []
    if len(stmts) < 3:
        return None
    found: dict[str, tuple[str, str]] = {}
    for stmt in stmts[:2]:
        index = _declaration(stmt)
        if index is None:
            return None
        axis, name, type_ = index
        found[axis] = (name, type_)
    if set(found) != {"x", "y"}:
        return None
    names = {found["x"][0], found["y"][0]}
    guard = _guard(stmts[2:], names)
    if guard is None:
        return None
    bounds, work = guard
    if any(_builtins(s) or any(sx.assigned(s, n) for n in names) for s in work):
        return None
    x = Index(found["x"][0], found["x"][1], bounds[found["x"][0]])
    y = Index(found["y"][0], found["y"][1], bounds[found["y"][0]])
    return Grid2D(fn, x, y, tuple(work), stmts[0], stmts[-1])


def _declaration(stmt: sx.Node) -> tuple[str, str, str] | None:
    """(axis, name, type) of `T v = blockIdx.? * blockDim.? + threadIdx.?;`."""
    sole = sx.sole_init(stmt) if stmt.type == "declaration" else None
    if sole is None:
        return None
    name, value = sole
    norm = sx.norm(value) if value is not None else None
    if name is None or name.type != "identifier" or norm is None:
        return None
    for axis, pattern in _AXES.items():
        if pattern.fullmatch(norm):
            type_ = sx.text(sx.field(stmt, "type"))
            return axis, sx.text(name), type_
    return None


def _guard(rest: list[sx.Node], names: set[str]
           ) -> tuple[dict[str, str], list[sx.Node]] | None:
    """The bound of each index and the guarded statements, for `if (a < A && b < B) {...}`
    as the last statement or `if (a >= A || b >= B) return;` followed by the work."""
    branch = rest[0]
    if branch.type != "if_statement" or sx.field(branch, "alternative") is not None:
        return None
    cond = sx.strip(sx.field(sx.field(branch, "condition"), "value"))
    then = sx.field(branch, "consequence")
    if cond.type != "binary_expression" or then is None:
        return None
    joint = sx.text(sx.field(cond, "operator"))
    if joint == "&&" and len(rest) == 1:
        bounds = _bounds(cond, "<", names)
        work = sx.named(then) if then.type == "compound_statement" else [then]
        return (bounds, work) if bounds is not None else None
    if joint == "||" and sx.norm(then) in ("return;", "{return;}") and len(rest) > 1:
        bounds = _bounds(cond, ">=", names)
        return (bounds, rest[1:]) if bounds is not None else None
    return None


def _bounds(cond: sx.Node, op: str, names: set[str]) -> dict[str, str] | None:
    out: dict[str, str] = {}
    for side in (sx.field(cond, "left"), sx.field(cond, "right")):
        side = sx.strip(side)
        bound = sx.field(side, "right")
        if side.type != "binary_expression" or sx.text(sx.field(side, "operator")) != op \
                or sx.text(sx.field(side, "left")) not in names or bound is None \
                or bound.type not in ("identifier", "number_literal"):
            return None
        out[sx.text(sx.field(side, "left"))] = sx.text(bound)
    return out if set(out) == names else None


def _builtins(node: sx.Node) -> bool:
    return any(n.type == "identifier" and sx.text(n) in _BUILTINS for n in sx.walk(node))


def unit_variable(index: sx.Node, names: set[str]) -> str | None:
    """Which of `names` the index expression holds as a plain `+ v` term (the one whose
    neighbours are neighbours in memory), if exactly one."""
    terms = _terms(sx.strip(index))
    units = {sx.text(t) for t in terms if t.type == "identifier" and sx.text(t) in names}
    return units.pop() if len(units) == 1 else None


def _terms(node: sx.Node) -> list[sx.Node]:
    if node.type == "binary_expression" and sx.text(sx.field(node, "operator")) == "+":
        left, right = sx.field(node, "left"), sx.field(node, "right")
        return [*(_terms(sx.strip(left)) if left else []),
                *(_terms(sx.strip(right)) if right else [])]
    return [node]


def launch_bound(bound: str, args: dict[str, sx.Node]) -> str | None:
    """The launcher's expression for a bound: the argument passed for it, or the bound
    itself when it is a literal or an upper-case constant."""
    if bound in args:
        return sx.text(args[bound])
    return bound if bound.isdigit() or bound.isupper() else None
