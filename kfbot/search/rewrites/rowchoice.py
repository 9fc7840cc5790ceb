"""row-split-by-length: a thread-per-row kernel split both ways, a warp per row for
short rows and a block per row for long ones, the launcher choosing by the row length.

A warp per row keeps eight rows in a block of 256 threads busy and needs no barrier;
past about a thousand columns each lane walks dozens of columns alone and a block of
threads per row does better. The kernel is copied as `<name>_kfbot_long`, each launch
becomes

    if ((cols) <= 1024) { kernel<<<warp grid, 256>>>(...); }
    else { kernel_kfbot_long<<<rows, 256>>>(...); }

and the two rewrites of `rows.py` are applied, one to each copy. The length is the
argument the launch passes for the bound of the kernel's column loops, so both sides
of the choice are computed from what the kernel itself reads.
"""

from __future__ import annotations

from kfbot.search.rewrites import syntax as sx
from kfbot.search.rewrites.rows import block_per_row, warp_per_row
from kfbot.search.rewrites.rowshape import row_kernel
from kfbot.search.rewrites.syntax import Target

LONG_ROW = 1024  # columns: at most this many go a warp per row
SUFFIX = "_kfbot_long"


def row_split_by_length(source: str, target: Target) -> str | None:
    found = sx.sole_kernel(source, target)
    if found is None or target.kernel.endswith(SUFFIX):
        return None
    root, kernel = found
    shape = row_kernel(kernel)
    if shape is None:
        return None
    bounds = {"".join(sx.text(sx.field(sx.field(lp.node, "condition"), "right")).split())
              for lp in shape.loops}
    names = [sx.param_name(p) for p in sx.params(kernel)]
    if len(bounds) != 1 or (bound := bounds.pop()) not in names:
        return None
    copied = _with_copy(source, root, kernel, names.index(bound))
    if copied is None:
        return None
    short = warp_per_row(copied, target)
    if short is None:
        return None
    return block_per_row(short, Target(target.kernel + SUFFIX, rtol=target.rtol))


def _with_copy(source: str, root: sx.Node, kernel: sx.Node, at: int) -> str | None:
    """The source with the kernel copied under the long-row name and each launch made a
    choice between the two by the argument at position `at`."""
    src = source.encode()
    edits: list[sx.Edit] = []
    for launch in sx.launches(root, target_name(kernel)):
        call = launch.parent
        stmt = call.parent if call is not None else None
        args = sx.named(sx.field(call, "arguments") or launch) if call is not None else []
        if call is None or stmt is None or stmt.type != "expression_statement" \
                or len(args) <= at:
            return None
        edits.append((stmt.start_byte, stmt.end_byte, _choice(src, stmt, call, args[at])))
    if not edits:
        return None
    top = sx.definition(kernel)
    name = sx.fn_name_node(kernel)
    assert name is not None
    copy = sx.splice(sx.text(top).encode(), [(name.start_byte - top.start_byte,
                                              name.end_byte - top.start_byte,
                                              (sx.text(name) + SUFFIX).encode())])
    edits.append((top.end_byte, top.end_byte, b"\n\n" + copy))
    return sx.splice(src, edits).decode()


def target_name(kernel: sx.Node) -> str:
    return sx.fn_name(kernel)


def _choice(src: bytes, stmt: sx.Node, call: sx.Node, length: sx.Node) -> bytes:
    indent = sx.indent_at(src, stmt) or "    "
    function = sx.field(call, "function")
    callee = sx.field(function, "name") if function is not None \
        and function.type == "template_function" else function
    assert callee is not None
    base = stmt.start_byte
    long_launch = sx.splice(sx.text(stmt).encode(), [(callee.start_byte - base,
                                                      callee.end_byte - base,
                                                      (sx.text(callee) + SUFFIX).encode())])
    return (f"if (({sx.text(length)}) <= {LONG_ROW}) {{  // short rows: a warp each\n"
            f"{indent}    {sx.text(stmt)}\n{indent}}} else {{  // long rows: a block each\n"
            f"{indent}    {long_launch.decode()}\n{indent}}}").encode()
