"""Recognising a thread-per-row kernel: the shape the row rewrites (`rows.py`) change.

    T row = blockIdx.x * blockDim.x + threadIdx.x;     // or * BLOCK, any order, a cast
    if (row >= rows) return;                           // or: if (row < rows) { ... }
    ... scalar statements ...
    for (T j = S; j < cols; ++j) { acc += ...; out[base + j] = ...; }
    ... more loops and scalar statements ...

Every loop runs a column index `j` from a start to a bound that no statement changes,
one step at a time, directly in the kernel's body. Inside a loop, a variable declared
outside it may change only as an accumulator (`acc += e`, `acc = fmaxf(acc, e)`,
`if (e > acc) acc = e;`, and the min forms) that nothing else in the loop reads;
memory is written only at an index that is `j` plus something the loop does not change
(so no two iterations write one element), and memory written in a loop is read there
only at the written index. Outside loops, statements are declarations and assignments.
Nothing else looks at the thread, block or grid, synchronises, or leaves early.

Such a kernel's iterations over `j` can be split among the threads of a warp or a block
and the accumulators combined afterwards: that is all the row rewrites do.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from kfbot.search.rewrites import syntax as sx

_BUILTINS = frozenset({"threadIdx", "blockIdx", "blockDim", "gridDim", "warpSize"})
_FORBIDDEN_CALL = ("__syncthreads", "__syncwarp", "__shfl", "atomic", "__threadfence",
                   "printf", "__reduce", "__ballot", "__any", "__all", "cooperative")
_MAX = {"fmaxf": "max", "fmax": "max", "max": "max", "fminf": "min", "fmin": "min",
        "min": "min"}
_EXITS = frozenset({"return_statement", "break_statement", "continue_statement",
                    "goto_statement"})
_CAST = r"(?:\((?:int|unsigned|unsignedint|int64_t|uint64_t|size_t|long|longlong)\))?"
_SCALE = r"(?:blockDim\.x|[A-Za-z_]\w*|\d+)"
_PRODUCT = rf"(?:{_CAST}blockIdx\.x\*{_SCALE}|{_SCALE}\*{_CAST}blockIdx\.x)"
INDEX_PATTERN = rf"{_PRODUCT}\+{_CAST}threadIdx\.x|{_CAST}threadIdx\.x\+{_PRODUCT}"


@dataclass(frozen=True)
class Accumulator:
    name: str
    combine: str  # "sum", "max" or "min"


@dataclass(frozen=True)
class ColumnLoop:
    node: sx.Node  # the for statement
    start: sx.Node  # the value `j` starts from
    update: sx.Node
    accumulators: tuple[Accumulator, ...]


@dataclass(frozen=True)
class RowKernel:
    fn: sx.Node
    row_decl: sx.Node  # the declaration statement of the row index
    row_value: sx.Node  # its initialiser
    row_type: str  # its declared type, without const
    bound: str  # what the row index is compared with
    statements: tuple[sx.Node, ...]  # the row's work, in order (loops among them)
    loops: tuple[ColumnLoop, ...]
    single_writes: tuple[sx.Node, ...]  # statements outside loops that write memory


def row_kernel(fn: sx.Node) -> RowKernel | None:
    """The kernel as a thread-per-row kernel, or None when it is not one."""
    body = sx.field(fn, "body")
    if body is None or not _plain(fn):
        return None
    stmts = sx.named(body)
    at = next((i for i, s in enumerate(stmts) if _row_declaration(s) is not None), None)
    if at is None or any(_mentions_builtins(s) for s in stmts[:at]):
        return None
    decl = stmts[at]
    found = _row_declaration(decl)
    assert found is not None
    row, value, row_type = found
    guard = _guard(stmts[at + 1:], row)
    if guard is None:
        return None
    bound, work = guard
    statements = (*stmts[:at], *work)
    if any(sx.assigned(s, row) for s in statements):
        return None
    loops: list[ColumnLoop] = []
    writes: list[sx.Node] = []
    for stmt in statements:
        if stmt.type == "for_statement":
            loop = column_loop(stmt)
            if loop is None:
                return None
            loops.append(loop)
        elif not _scalar_statement(stmt, writes):
            return None
    if not loops:
        return None
    return RowKernel(fn, decl, value, row_type, bound, tuple(statements), tuple(loops),
                     tuple(writes))


def why_not_row_kernel(fn: sx.Node) -> str:
    """Why `row_kernel(fn)` is None, in words (the first check that fails)."""
    body = sx.field(fn, "body")
    if body is None:
        return "it has no body"
    if not _plain(fn):
        return ("it synchronises, shuffles, uses atomics or shared memory, or loops with "
                "while/do/switch: not one thread per row")
    stmts = sx.named(body)
    at = next((i for i, s in enumerate(stmts) if _row_declaration(s) is not None), None)
    if at is None:
        return "no `row = blockIdx.x * blockDim.x + threadIdx.x` declaration"
    found = _row_declaration(stmts[at])
    assert found is not None
    guard = _guard(stmts[at + 1:], found[0])
    if guard is None:
        return (f"no `if ({found[0]} >= R) return;` or final `if ({found[0]} < R) {{...}}` "
                "right after the row index")
    for stmt in (*stmts[:at], *guard[1]):
        line = stmt.start_point[0] + 1
        if stmt.type == "for_statement" and column_loop(stmt) is None:
            return (f"the loop at line {line} is not a loop over a row's columns with "
                    "sum/max/min accumulators and writes at j plus an offset")
        if stmt.type != "for_statement" and not _scalar_statement(stmt, []):
            return (f"the statement at line {line} is neither a declaration nor an "
                    "assignment, or reads the thread index")
    return "no loop over the row's columns"


def _plain(fn: sx.Node) -> bool:
    """No barrier, shuffle, atomic or shared memory anywhere in the kernel."""
    for node in sx.walk(fn):
        if node.type == "call_expression" and sx.text(sx.field(node, "function")).startswith(
                _FORBIDDEN_CALL):
            return False
        if node.type == "declaration" and "__shared__" in sx.qualifiers(node):
            return False
        if node.type in ("while_statement", "do_statement", "for_range_loop", "goto_statement",
                         "switch_statement"):
            return False
    return True


def _row_declaration(stmt: sx.Node) -> tuple[str, sx.Node, str] | None:
    """(name, initialiser, type) of `T row = <global thread index>;`."""
    sole = sx.sole_init(stmt) if stmt.type == "declaration" else None
    if sole is None:
        return None
    name, value = sole
    if name is None or name.type != "identifier" or value is None:
        return None
    norm = sx.norm(value)
    if norm is None or not re.fullmatch(INDEX_PATTERN, norm):
        return None
    return sx.text(name), value, sx.text(sx.field(stmt, "type"))


def _guard(rest: list[sx.Node], row: str) -> tuple[str, list[sx.Node]] | None:
    """The bound and the row's statements after `if (row >= R) return;` or inside a final
    `if (row < R) { ... }`."""
    if not rest or rest[0].type != "if_statement" or sx.field(rest[0], "alternative"):
        return None
    cond = sx.field(sx.field(rest[0], "condition"), "value")
    then = sx.field(rest[0], "consequence")
    if cond is None or then is None or cond.type != "binary_expression" \
            or sx.text(sx.field(cond, "left")) != row:
        return None
    bound = sx.field(cond, "right")
    if bound is None or bound.type not in ("identifier", "number_literal"):
        return None
    op = sx.text(sx.field(cond, "operator"))
    if op == ">=" and sx.norm(then) in ("return;", "{return;}"):
        return sx.text(bound), rest[1:]
    if op == "<" and len(rest) == 1 and then.type == "compound_statement":
        return sx.text(bound), sx.named(then)
    return None


def _mentions_builtins(node: sx.Node) -> bool:
    return any(n.type == "identifier" and sx.text(n) in _BUILTINS for n in sx.walk(node))


def _scalar_statement(stmt: sx.Node, writes: list[sx.Node]) -> bool:
    """A declaration or an assignment outside the loops; a write to memory is kept in
    `writes` (one thread of the row does it)."""
    if _mentions_builtins(stmt) or any(n.type in _EXITS for n in sx.walk(stmt)):
        return False
    if stmt.type == "declaration":
        return True
    if stmt.type != "expression_statement":
        return False
    expr = sx.named(stmt)
    if len(expr) != 1 or expr[0].type != "assignment_expression":
        return False
    left = sx.field(expr[0], "left")
    if left is not None and left.type == "identifier":
        return True
    if left is not None and left.type == "subscript_expression":
        writes.append(stmt)
        return True
    return False


# --- the column loops ----------------------------------------------------------------------


def column_loop(loop: sx.Node) -> ColumnLoop | None:
    header = sx.less_than_loop(loop)
    if header is None:
        return None
    j, start, bound, update, body = header
    if j in sx.identifiers(bound) or j in sx.identifiers(start):
        return None
    if sx.norm(update) not in (f"++{j}", f"{j}++", f"{j}+=1", f"{j}={j}+1"):
        return None
    if sx.assigned(body, j) or _mentions_builtins(body) \
            or any(n.type in _EXITS or n.type == "for_statement" for n in sx.walk(body)):
        return None
    local = _locals(body)
    accs = _accumulators(body, local)
    if accs is None or not _writes_ok(body, j, local):
        return None
    names = {a.name for a in accs}
    if sx.identifiers(bound) & names or sx.identifiers(start) & names:
        return None
    return ColumnLoop(loop, start, update, tuple(accs))


def _locals(body: sx.Node) -> dict[str, sx.Node | None]:
    """Variables declared in the loop body, with their initialiser."""
    out: dict[str, sx.Node | None] = {}
    for node in sx.walk(body):
        if node.type != "declaration":
            continue
        for d in node.children_by_field_name("declarator"):
            name = sx.field(d, "declarator") if d.type == "init_declarator" else d
            out[sx.text(name)] = sx.field(d, "value") if d.type == "init_declarator" else None
    return out


def _accumulators(body: sx.Node, local: dict[str, sx.Node | None]) -> list[Accumulator] | None:
    """The outer variables the loop changes, each by one combine statement at the top of
    the body that nothing else in the loop reads; None when another outer variable
    changes."""
    top = sx.named(body) if body.type == "compound_statement" else [body]
    found: dict[str, tuple[str, sx.Node]] = {}
    for stmt in top:
        combine = _combine(stmt)
        if combine is not None and combine[0] not in local:
            name, kind = combine
            if name in found:
                return None
            found[name] = (kind, stmt)
    for node in sx.walk(body):
        if node.type != "identifier" or sx.text(node) in local:
            continue
        name = sx.text(node)
        owner = found.get(name)
        if owner is not None and not _inside(node, owner[1]):
            return None  # the accumulator is read elsewhere in the loop
        if owner is None and _is_assigned_here(node):
            return None  # an outer variable that changes without combining
    return [Accumulator(name, kind) for name, (kind, _) in found.items()]


def _inside(node: sx.Node, ancestor: sx.Node) -> bool:
    current: sx.Node | None = node
    while current is not None:
        if current == ancestor:
            return True
        current = current.parent
    return False


def _is_assigned_here(node: sx.Node) -> bool:
    parent = node.parent
    if parent is None:
        return False
    if parent.type == "assignment_expression" and sx.field(parent, "left") == node:
        return True
    return parent.type == "update_expression" or (
        parent.type == "pointer_expression" and sx.text(sx.field(parent, "operator")) == "&")


def _combine(stmt: sx.Node) -> tuple[str, str] | None:
    """(accumulator, sum|max|min) of one combine statement, or None."""
    if stmt.type == "if_statement":
        return _if_max(stmt)
    if stmt.type != "expression_statement" or len(sx.named(stmt)) != 1:
        return None
    expr = sx.named(stmt)[0]
    left, right = sx.field(expr, "left"), sx.field(expr, "right")
    if expr.type != "assignment_expression" or left is None or right is None \
            or left.type != "identifier":
        return None
    acc, op = sx.text(left), sx.text(sx.field(expr, "operator"))
    if op == "+=" and acc not in sx.identifiers(right):
        return acc, "sum"
    if op != "=":
        return None
    if right.type == "binary_expression" and sx.text(sx.field(right, "operator")) == "+":
        sides = [sx.field(right, "left"), sx.field(right, "right")]
        mine = [s for s in sides if s is not None and s.type == "identifier" and sx.text(s) == acc]
        other = [s for s in sides if s is not None and s not in mine]
        if len(mine) == 1 and len(other) == 1 and acc not in sx.identifiers(other[0]):
            return acc, "sum"
    if right.type == "call_expression" and sx.text(sx.field(right, "function")) in _MAX:
        args = sx.named(sx.field(right, "arguments") or right)
        mine = [a for a in args if a.type == "identifier" and sx.text(a) == acc]
        other = [a for a in args if a not in mine]
        if len(args) == 2 and len(mine) == 1 and acc not in sx.identifiers(other[0]):
            return acc, _MAX[sx.text(sx.field(right, "function"))]
    return None


def _if_max(stmt: sx.Node) -> tuple[str, str] | None:
    """`if (e > acc) acc = e;` (max) and its mirror images and min forms."""
    if sx.field(stmt, "alternative") is not None:
        return None
    cond = sx.field(sx.field(stmt, "condition"), "value")
    then = sx.field(stmt, "consequence")
    if then is not None and then.type == "compound_statement" and len(sx.named(then)) == 1:
        then = sx.named(then)[0]
    if cond is None or then is None or cond.type != "binary_expression" \
            or then.type != "expression_statement" or len(sx.named(then)) != 1:
        return None
    assign = sx.named(then)[0]
    left, right = sx.field(assign, "left"), sx.field(assign, "right")
    if assign.type != "assignment_expression" or sx.text(sx.field(assign, "operator")) != "=" \
            or left is None or right is None or left.type != "identifier":
        return None
    acc, value = sx.text(left), sx.norm(right)
    a, b = sx.field(cond, "left"), sx.field(cond, "right")
    op = sx.text(sx.field(cond, "operator"))
    if a is None or b is None or value is None or acc in sx.identifiers(right):
        return None
    if sx.norm(a) == value and sx.text(b) == acc:
        kind = {">": "max", ">=": "max", "<": "min", "<=": "min"}.get(op)
    elif sx.text(a) == acc and sx.norm(b) == value:
        kind = {"<": "max", "<=": "max", ">": "min", ">=": "min"}.get(op)
    else:
        kind = None
    return (acc, kind) if kind is not None else None


@dataclass
class _Access:
    writes: dict[str, set[str]] = field(default_factory=dict)  # pointer -> index texts
    reads: dict[str, set[str]] = field(default_factory=dict)


def _writes_ok(body: sx.Node, j: str, local: dict[str, sx.Node | None]) -> bool:
    """Memory is written only at `j` plus a loop-invariant offset, and memory written in
    the loop is read there only at the written index."""
    access = _Access()
    for node in sx.walk(body):
        if node.type != "subscript_expression":
            continue
        base, index = sx.field(node, "argument"), sx.field(node, "indices")
        inner = sx.named(index) if index is not None else []
        if base is None or base.type != "identifier" or len(inner) != 1:
            return False
        key = sx.norm(inner[0]) or "?"
        parent = node.parent
        written = parent is not None and (
            (parent.type == "assignment_expression" and sx.field(parent, "left") == node)
            or parent.type == "update_expression")
        side = access.writes if written else access.reads
        side.setdefault(sx.text(base), set()).add(key)
        if written and not _unit_in(inner[0], j, local, body):
            return False
    return all(access.reads.get(p, set()) <= keys and len(keys) == 1
               for p, keys in access.writes.items())


def _unit_in(expr: sx.Node, j: str, local: dict[str, sx.Node | None], body: sx.Node,
             depth: int = 0) -> bool:
    """`expr` is `j` plus (or minus) terms that do not depend on `j`."""
    expr = sx.strip(expr)
    if expr.type == "identifier":
        name = sx.text(expr)
        if name == j:
            return True
        init = local.get(name)
        return init is not None and depth < 8 and not sx.assigned(body, name) \
            and _unit_in(init, j, local, body, depth + 1)
    if expr.type == "binary_expression" and sx.text(sx.field(expr, "operator")) in "+-":
        left, right = sx.field(expr, "left"), sx.field(expr, "right")
        if left is None or right is None:
            return False
        if _unit_in(left, j, local, body, depth) and not _depends(right, j, local):
            return True
        return sx.text(sx.field(expr, "operator")) == "+" \
            and _unit_in(right, j, local, body, depth) and not _depends(left, j, local)
    return False


def _depends(expr: sx.Node, j: str, local: dict[str, sx.Node | None]) -> bool:
    names = sx.identifiers(expr)
    return j in names or bool(names & set(local))
