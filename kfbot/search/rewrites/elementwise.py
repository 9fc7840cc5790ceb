"""Rewrites of the elementwise class: one element per thread, `if (i < n) body`.

grid-stride-loop and vectorize-float4 (rules/rewrites.yaml and rules/experts/ say
when each applies). Only the target kernel and its launch in the same file change.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass

from kfbot.search.rewrites import syntax as sx
from kfbot.search.rewrites.syntax import Target

# --- the elementwise kernel shape --------------------------------------------------------

_INDEX = re.compile(
    r"(\((int|unsigned|int64_t|size_t|long|longlong|unsignedint|uint64_t)\))?"
    r"(blockIdx\.x\*blockDim\.x|blockDim\.x\*blockIdx\.x)\+threadIdx\.x"
    r"|threadIdx\.x\+(\((int|unsigned|int64_t|size_t|long|longlong|unsignedint|uint64_t)\))?"
    r"(blockIdx\.x\*blockDim\.x|blockDim\.x\*blockIdx\.x)")


@dataclass(frozen=True)
class Elementwise:
    fn: sx.Node
    decl: sx.Node  # `T i = blockIdx.x * blockDim.x + threadIdx.x;`
    branch: sx.Node  # `if (i < n) body`
    var: str
    var_type: str
    bound: str
    body: sx.Node


def elementwise_shape(fn: sx.Node) -> Elementwise | None:
    body = sx.field(fn, "body")
    if body is None:
        return None
    stmts = sx.named(body)
    if len(stmts) != 2 or stmts[0].type != "declaration" or stmts[1].type != "if_statement":
        return None
    decl, branch = stmts
    if any(c.type in ("type_qualifier", "storage_class_specifier") for c in decl.children):
        return None
    sole = sx.sole_init(decl)
    if sole is None:
        return None
    var, value = sole
    if var is None or var.type != "identifier" or value is None:
        return None
    norm = sx.norm(value)
    if norm is None or not _INDEX.fullmatch(norm):
        return None
    if sx.field(branch, "alternative") is not None:
        return None
    cond = sx.field(sx.field(branch, "condition"), "value")
    then = sx.field(branch, "consequence")
    if cond is None or then is None or cond.type != "binary_expression" \
            or sx.text(sx.field(cond, "operator")) != "<" \
            or sx.text(sx.field(cond, "left")) != sx.text(var):
        return None
    bound = sx.field(cond, "right")
    if bound is None or bound.type != "identifier":
        return None
    for node in sx.walk(then):
        if node.type in ("return_statement", "break_statement", "continue_statement",
                         "goto_statement"):
            return None
        if node.type == "identifier" and sx.text(node) in ("__syncthreads", "__syncwarp"):
            return None
        if node.type == "identifier" and sx.text(node) in (sx.text(var), sx.text(bound)) \
                and node.parent is not None and (
                    (node.parent.type == "assignment_expression"
                     and sx.field(node.parent, "left") == node)
                    or node.parent.type in ("update_expression", "pointer_expression")):
            return None
    return Elementwise(fn=fn, decl=decl, branch=branch, var=sx.text(var),
                        var_type=sx.text(sx.field(decl, "type")), bound=sx.text(bound), body=then)


def grid_stride_loop(source: str, target: Target) -> str | None:
    src = source.encode()
    root = sx.parse(source)
    edits: list[sx.Edit] = []
    for fn in sx.kernels_named(root, target.kernel):
        shape = elementwise_shape(fn)
        if shape is None:
            continue
        init = src[shape.decl.start_byte:shape.decl.end_byte].decode().rstrip().rstrip(";")
        body = sx.text(shape.body)
        i, t = shape.var, shape.var_type
        loop = f"for ({init}; {i} < {shape.bound}; {i} += ({t})blockDim.x * gridDim.x) {body}"
        edits.append((shape.decl.start_byte, shape.branch.end_byte, loop.encode()))
    return sx.spliced(src, edits)


def vectorize_float4(source: str, target: Target) -> str | None:
    if target.launched_elsewhere:
        return None  # the grid is quartered at the launch, which must be in this file
    src = source.encode()
    root = sx.parse(source)
    edits: list[sx.Edit] = []
    for fn in sx.kernels_named(root, target.kernel):
        shape = elementwise_shape(fn)
        if shape is None or sx.field(fn.parent, "parameters") is not None:
            continue  # not the shape, or a template kernel
        plan = _float4_plan(shape)
        if plan is None:
            continue
        inputs, outputs, subscripts = plan
        launch_edit = _quarter_grid(root, shape)
        if launch_edit is None:
            continue
        edits.append((shape.decl.start_byte, shape.branch.end_byte,
                      _float4_body(src, shape, inputs, outputs, subscripts).encode()))
        edits.append(launch_edit)
    return sx.spliced(src, edits)


def _float4_plan(shape: Elementwise) -> tuple[list[str], list[str], list[sx.Node]] | None:
    """Inputs, outputs and the `p[i]` nodes of a kernel whose pointers are all `float*`,
    read only as `x[i]` or written only as a top-level `y[i] = ...;` (once each)."""
    pointers: dict[str, bool] = {}  # name -> const
    for param in sx.params(shape.fn):
        decl = sx.field(param, "declarator")
        if decl is not None and decl.type == "pointer_declarator":
            inner = sx.field(decl, "declarator")
            if sx.text(sx.field(param, "type")) != "float" or inner is None \
                    or inner.type != "identifier":
                return None
            pointers[sx.text(inner)] = "const" in {sx.text(c) for c in param.children
                                              if c.type == "type_qualifier"}
    if shape.var in pointers or shape.bound in pointers:
        return None
    top = sx.named(shape.body) if shape.body.type == "compound_statement" else [shape.body]
    reads: set[str] = set()
    writes: list[str] = []
    subscripts: list[sx.Node] = []
    for node in sx.walk(shape.body):
        if node.type != "identifier":
            continue
        name = sx.text(node)
        if name == shape.var:
            holder = node.parent.parent if node.parent is not None else None
            if node.parent is None or node.parent.type != "subscript_argument_list" \
                    or holder is None or sx.text(sx.field(holder, "argument")) not in pointers:
                return None
            continue  # the `i` of a `p[i]`, checked from its pointer
        if name not in pointers:
            continue
        sub = node.parent
        if sub is None or sub.type != "subscript_expression":
            return None
        indices = sx.field(sub, "indices")
        index = sx.named(indices) if indices is not None else []
        if len(index) != 1 or index[0].type != "identifier" or sx.text(index[0]) != shape.var:
            return None
        target = sx.text(sx.field(sub, "argument"))
        if sx.field(sub, "argument") != node:
            return None
        subscripts.append(sub)
        user = sub.parent
        if user is not None and user.type == "assignment_expression" \
                and sx.field(user, "left") == sub:
            statement = user.parent
            if sx.text(sx.field(user, "operator")) != "=" or statement is None \
                    or statement not in top or statement.type != "expression_statement":
                return None
            writes.append(target)
        else:
            reads.add(target)
    outputs = sorted(set(writes))
    if not outputs or len(writes) != len(outputs) or reads & set(outputs) \
            or any(pointers[o] for o in outputs):
        return None
    return sorted(reads), outputs, subscripts


def _float4_body(src: bytes, shape: Elementwise, inputs: list[str], outputs: list[str],
                 subscripts: list[sx.Node]) -> str:
    body = shape.body

    def scalar(replace: Callable[[str], str], extra: int = 8) -> str:
        edits = [(s.start_byte - body.start_byte, s.end_byte - body.start_byte,
                  replace(sx.text(sx.field(s, "argument"))).encode()) for s in subscripts]
        out = sx.splice(src[body.start_byte:body.end_byte], edits).decode()
        out = out.replace("\n", "\n" + " " * extra)
        return out if body.type == "compound_statement" else "{ " + out + " }"

    line_start = src.rfind(b"\n", 0, shape.decl.start_byte) + 1
    ind = src[line_start:shape.decl.start_byte].decode()
    ind = ind if not ind.strip() else "    "
    i, n, t = shape.var, shape.bound, shape.var_type
    decl = src[shape.decl.start_byte:shape.decl.end_byte].decode()
    pointers = inputs + outputs
    aligned = " | ".join(f"reinterpret_cast<unsigned long long>({p})" for p in pointers)
    lines = [decl,
             f"// {i} indexes float4 groups: elements 4*{i} .. 4*{i}+3, then a scalar tail.",
             f"if ((({aligned}) & 15ull) == 0) {{",
             f"    if ({i} < {n} / 4) {{"]
    for p in inputs:
        lines.append(f"        const float4 {p}_v4 = reinterpret_cast<const float4*>({p})[{i}];")
    for p in outputs:
        lines.append(f"        float4 {p}_v4;")
    for lane in "xyzw":
        lines.append("        " + scalar(_lane_of(lane)))
    for p in outputs:
        lines.append(f"        reinterpret_cast<float4*>({p})[{i}] = {p}_v4;")
    lines += ["    }",
              f"    if ({i} < {n} % 4) {{",
              f"        const {t} {i}_s = {n} / 4 * 4 + {i};",
              "        " + scalar(lambda p: f"{p}[{i}_s]"),
              "    }",
              "} else {",
              f"    for ({t} {i}_s = {i} * 4; {i}_s < {i} * 4 + 4 && {i}_s < {n}; ++{i}_s) "
              + scalar(lambda p: f"{p}[{i}_s]", 4),
              "}"]
    return ("\n" + ind).join(lines)


def _lane_of(lane: str) -> Callable[[str], str]:
    return lambda p: f"{p}_v4.{lane}"


def _quarter_grid(root: sx.Node, shape: Elementwise) -> sx.Edit | None:
    """The edit turning the launcher's `(n + B - 1) / B` grid into `((n + 3) / 4 + B - 1) / B`,
    when the kernel has one launch in the file with a constant block size B >= 4."""
    name = sx.fn_name(shape.fn)
    launches = sx.launches(root, name)
    if len(launches) != 1:
        return None
    launch = launches[0]
    constants = sx.constants(root)
    block = sx.launch_block(launch, constants)
    args = sx.named(launch)
    if block is None or block < 4 or len(args) != 2:
        return None
    call = launch.parent
    if call is None:
        return None
    arglist = sx.field(call, "arguments")
    params = [sx.text(sx.field(p, "declarator")) for p in sx.params(shape.fn)]
    if arglist is None or shape.bound not in params:
        return None
    passed = sx.named(arglist)
    if len(passed) != len(params):
        return None
    n_arg = passed[params.index(shape.bound)]
    if n_arg.type != "identifier":
        return None
    grid = sx.strip(args[0])
    if grid.type == "identifier":
        grid_def = sx.local_init(call, sx.text(grid))
        if grid_def is None:
            return None
        grid = sx.strip(grid_def)
    # (N + B - 1) / B
    if grid.type != "binary_expression" or sx.text(sx.field(grid, "operator")) != "/":
        return None
    num, den = sx.strip(sx.field(grid, "left")), sx.field(grid, "right")
    if sx.value(den, constants) != block or num.type != "binary_expression" \
            or sx.text(sx.field(num, "operator")) != "-" \
            or sx.value(sx.field(num, "right"), constants) != 1:
        return None
    plus = sx.strip(sx.field(num, "left"))
    if plus.type != "binary_expression" or sx.text(sx.field(plus, "operator")) != "+" \
            or sx.value(sx.field(plus, "right"), constants) != block:
        return None
    count = sx.field(plus, "left")
    if count is None or count.type != "identifier" or sx.text(count) != sx.text(n_arg):
        return None
    return count.start_byte, count.end_byte, f"({sx.text(count)} + 3) / 4".encode()
