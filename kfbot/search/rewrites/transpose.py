"""Transpose: one thread per element that reads along one dimension and writes along the
other becomes a 32 x 32 tile staged in shared memory, so both the reads and the writes
of a warp are coalesced.

The shape (on top of `grid2d`): under the guard, one statement `O[io] = E;` where E
reads exactly one element `I[ii]` of another array (and otherwise only values that do
not depend on the thread); the variable held as a plain `+ v` term of ii (the input's
contiguous one) differs from that of io (the output's). The rewrite loads the tile
with the input's contiguous variable following threadIdx.x and stores it with the
output's following threadIdx.x, evaluating the user's own index expressions with the
user's variable names bound to each element; E is kept with `I[ii]` replaced by the
tile's element. Out-of-range elements are neither read nor written.
"""

from __future__ import annotations

from kfbot.search.rewrites import syntax as sx
from kfbot.search.rewrites.grid2d import Grid2D, Index, grid2d, launch_bound, unit_variable
from kfbot.search.rewrites.launch import LaunchPlan, kernel_launch_edits
from kfbot.search.rewrites.syntax import Target

TILE = 32
ROWS = 8  # threadIdx.y values: each thread moves TILE / ROWS elements


def tiled_transpose(source: str, target: Target) -> str | None:
    found_kernel = sx.sole_kernel(source, target)
    if found_kernel is None:
        return None
    root, kernel = found_kernel
    shape = grid2d(kernel)
    found = _transpose(shape, kernel) if shape is not None else None
    if found is None:
        return None
    read_var, write_var, element, elem_type = found
    assert shape is not None

    def grid(args: dict[str, sx.Node]) -> str | None:
        along_x = launch_bound(shape.var(read_var).bound, args)
        along_y = launch_bound(shape.var(write_var).bound, args)
        if along_x is None or along_y is None:
            return None
        return (f"dim3((unsigned)(({along_x}) + {TILE - 1}) / {TILE}, "
                f"(unsigned)(({along_y}) + {TILE - 1}) / {TILE})")

    launch = kernel_launch_edits(root, kernel,
                                 LaunchPlan(grid, f"dim3({TILE}, {ROWS})", TILE * ROWS))
    if launch is None:
        return None
    ind = sx.indent_at(source.encode(), shape.first) or "    "
    body = _body(shape, shape.var(read_var), shape.var(write_var), element, elem_type, ind)
    edits = [(shape.first.start_byte, shape.last.end_byte, body.encode()), *launch]
    return sx.spliced(source.encode(), edits)


def _transpose(shape: Grid2D, fn: sx.Node) -> tuple[str, str, sx.Node, str] | None:
    """(the input's contiguous variable, the output's, the element read, its type)."""
    if len(shape.body) != 1 or shape.body[0].type != "expression_statement":
        return None
    expr = sx.named(shape.body[0])
    if len(expr) != 1 or expr[0].type != "assignment_expression" \
            or sx.text(sx.field(expr[0], "operator")) != "=":
        return None
    out, value = sx.field(expr[0], "left"), sx.field(expr[0], "right")
    if out is None or value is None or out.type != "subscript_expression":
        return None
    reads = [n for n in sx.walk(value) if n.type == "subscript_expression"]
    if len(reads) != 1:
        return None
    names = {shape.x.name, shape.y.name}
    out_var = unit_variable(_index(out), names)
    in_var = unit_variable(_index(reads[0]), names)
    source_array = sx.text(sx.field(reads[0], "argument"))
    if out_var is None or in_var is None or out_var == in_var \
            or source_array == sx.text(sx.field(out, "argument")) \
            or names & (sx.identifiers(value) - sx.identifiers(reads[0])):
        return None
    elem = _element_type(fn, source_array)
    return (in_var, out_var, reads[0], elem) if elem is not None else None


def _index(subscript: sx.Node) -> sx.Node:
    inner = sx.named(sx.field(subscript, "indices") or subscript)
    return inner[0] if len(inner) == 1 else subscript


def _element_type(fn: sx.Node, array: str) -> str | None:
    for param in sx.params(fn):
        decl = sx.field(param, "declarator")
        if sx.param_name(param) == array and decl is not None \
                and decl.type == "pointer_declarator":
            return sx.text(sx.field(param, "type"))
    return None


def _body(shape: Grid2D, read: Index, write: Index, element: sx.Node, elem_type: str,
          ind: str) -> str:
    stmt = shape.body[0]
    before = sx.text(stmt)[:element.start_byte - stmt.start_byte]
    after = sx.text(stmt)[element.end_byte - stmt.start_byte:]
    store = before + "kfbot_tile[threadIdx.x][kfbot_i]" + after
    lines = [
        f"// A {TILE}x{TILE} tile through shared memory: read with {read.name} following "
        f"threadIdx.x,",
        f"// written with {write.name} following it (the +1 column keeps both "
        "bank-conflict free).",
        f"__shared__ {elem_type} kfbot_tile[{TILE}][{TILE + 1}];",
        f"const {read.type} kfbot_{read.name}0 = ({read.type})blockIdx.x * {TILE};",
        f"const {write.type} kfbot_{write.name}0 = ({write.type})blockIdx.y * {TILE};",
        f"for (int kfbot_i = threadIdx.y; kfbot_i < {TILE}; kfbot_i += {ROWS}) {{",
        f"    const {read.type} {read.name} = kfbot_{read.name}0 + threadIdx.x;",
        f"    const {write.type} {write.name} = kfbot_{write.name}0 + kfbot_i;",
        f"    if ({read.name} < {read.bound} && {write.name} < {write.bound})",
        f"        kfbot_tile[kfbot_i][threadIdx.x] = {sx.text(element)};",
        "}",
        "__syncthreads();",
        f"for (int kfbot_i = threadIdx.y; kfbot_i < {TILE}; kfbot_i += {ROWS}) {{",
        f"    const {read.type} {read.name} = kfbot_{read.name}0 + kfbot_i;",
        f"    const {write.type} {write.name} = kfbot_{write.name}0 + threadIdx.x;",
        f"    if ({read.name} < {read.bound} && {write.name} < {write.bound})",
        f"        {store}",
        "}",
    ]
    return ("\n" + ind).join(lines)
