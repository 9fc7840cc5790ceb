"""warp-shuffle-reduction: the last warp of a shared-memory tree reduction in registers.

Only the target kernel changes (with its helpers inlined when the tree sits in one);
its launches (all in the same file) must use power-of-two blocks of whole warps: a
constant, or a conditional in the launcher between such constants.
"""

from __future__ import annotations

import re

from kfbot.search.rewrites import syntax as sx
from kfbot.search.rewrites.syntax import Target

# --- warp-shuffle-reduction -----------------------------------------------------------------

_COMBINE = {"fmaxf", "fminf", "max", "min", "fmax", "fmin"}


def warp_shuffle_reduction(source: str, target: Target) -> str | None:
    if target.launched_elsewhere:
        return None  # the block size is read off the launches, which must all be here
    src = source.encode()
    root = sx.parse(source)
    edits: list[sx.Edit] = []
    for fn in sx.kernels_named(root, target.kernel):
        sizes = sx.block_values(root, sx.fn_name(fn))
        if not sizes or any(size < 32 or size & (size - 1) for size in sizes):
            continue  # needs power-of-two blocks of whole warps, known from every launch
        for loop in sx.walk(fn):
            if loop.type == "for_statement":
                edit = _reduction(src, fn, loop)
                if edit is not None:
                    edits.extend(edit)
    return sx.spliced(src, edits)


def _reduction(src: bytes, fn: sx.Node, loop: sx.Node) -> list[sx.Edit] | None:
    init, cond, update, body = (sx.field(loop, k)
                                for k in ("initializer", "condition", "update", "body"))
    if init is None or cond is None or update is None or body is None \
            or init.type != "declaration" or body.type != "compound_statement":
        return None
    sole = sx.sole_init(init)
    if sole is None:
        return None
    s = sx.text(sole[0])
    start = sole[1]
    if start is None or sx.norm(start) not in ("blockDim.x/2", "blockDim.x>>1"):
        return None
    zero = sx.field(cond, "right")
    if cond.type != "binary_expression" or sx.text(sx.field(cond, "left")) != s \
            or sx.text(sx.field(cond, "operator")) != ">" or zero is None or sx.text(zero) != "0":
        return None
    if sx.norm(update) not in (f"{s}>>=1", f"{s}/=2"):
        return None
    stmts = sx.named(body)
    if len(stmts) != 2 or stmts[0].type != "if_statement" \
            or sx.norm(stmts[1]) != "__syncthreads();":
        return None
    branch = stmts[0]
    if sx.field(branch, "alternative") is not None:
        return None
    guard = sx.field(sx.field(branch, "condition"), "value")
    step = sx.field(branch, "consequence")
    if step is not None and step.type == "compound_statement" and len(sx.named(step)) == 1:
        step = sx.named(step)[0]
    if guard is None or step is None or step.type != "expression_statement" \
            or guard.type != "binary_expression" or sx.text(sx.field(guard, "operator")) != "<" \
            or sx.text(sx.field(guard, "right")) != s:
        return None
    tid_node = sx.field(guard, "left")
    if tid_node is None or not sx.is_thread_index(fn, tid_node):
        return None
    tid = sx.text(tid_node)
    norm = sx.norm(step)
    first = sx.named(step)[0] if sx.named(step) else None
    array = sx.text(sx.field(sx.field(first, "left"), "argument")) if first else ""
    if not array or norm is None:
        return None
    a, st = re.escape(array), re.escape(s)
    t = re.escape("".join(tid.split()))
    combine: str | None = None
    if re.fullmatch(rf"{a}\[{t}\]\+={a}\[{t}\+{st}\];", norm):
        combine = "+"
    else:
        match = re.fullmatch(rf"{a}\[{t}\]=(\w+)\({a}\[{t}\],{a}\[{t}\+{st}\]\);", norm)
        if match and match.group(1) in _COMBINE:
            combine = match.group(1)
    elem = _shared_type(fn, array)
    if combine is None or elem is None:
        return None

    def fold(other: str) -> str:
        return f"v += {other};" if combine == "+" else f"v = {combine}(v, {other});"

    line_start = src.rfind(b"\n", 0, loop.start_byte) + 1
    ind = src[line_start:loop.start_byte].decode()
    ind = ind if not ind.strip() else ""
    warp = [f"if ({tid} < 32) {{",
            f"    {elem} v = {array}[{tid}];",
            f"    if (blockDim.x >= 64) {fold(f'{array}[{tid} + 32]')}",
            "    for (int offset = 16; offset > 0; offset >>= 1)",
            f"        {fold('__shfl_down_sync(0xffffffffu, v, offset)')}",
            f"    if ({tid} == 0) {array}[0] = v;",
            "}",
            "__syncthreads();"]
    tail = ("\n" + ind + ("\n" + ind).join(warp)).encode()
    return [(zero.start_byte, zero.end_byte, b"32"), (loop.end_byte, loop.end_byte, tail)]


def _shared_type(fn: sx.Node, array: str) -> str | None:
    for node in sx.walk(fn):
        if node.type != "declaration" or "__shared__" not in {
                sx.text(c) for c in node.children if c.type == "type_qualifier"}:
            continue
        for d in node.children_by_field_name("declarator"):
            if d.type == "array_declarator" and sx.text(sx.field(d, "declarator")) == array:
                kind = sx.text(sx.field(node, "type"))
                return kind if kind in ("float", "double", "int", "unsigned", "unsigned int",
                                        "long long", "int64_t") else None
    return None


