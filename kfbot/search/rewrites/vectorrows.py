"""vectorize-row-loads: a loop over a row's columns reads and writes four floats at a time
(`float4`), behind a run-time alignment check.

    for (int j = lane; j < cols; j += 32) s += in[j];

becomes, where every pointer it moves through is 16-byte aligned,

    if (kfbot_aligned16(in)) {
        const int kfbot_n4 = (cols) / 4;
        for (int kfbot_q = lane; kfbot_q < kfbot_n4; kfbot_q += 32) {
            const float4 kfbot_v0 = reinterpret_cast<const float4*>(in)[kfbot_q];
            { const int j = kfbot_q * 4 + 0; s += kfbot_v0.x; }   ... .y .z .w
        }
        for (int j = kfbot_n4 * 4 + lane; j < cols; j += 32) s += in[j];   // the tail
    } else {
        for (int j = lane; j < cols; j += 32) s += in[j];              // as written
    }

The loops it takes split a row's columns among a group of threads: one thread (`j =
0; ++j`), a warp (`j = lane; j += 32`, lane `threadIdx.x % 32`) or a block (`j =
threadIdx.x; j += blockDim.x`), the shapes a naive kernel and the row rewrites leave.
Each thread then takes whole groups of four in the same interleaving and the group's
threads share out the last `cols % 4` columns, so every column is still handled by
exactly one thread, once. Only `float` pointers are vectorised, read at `j` (or an
offset the loop does not change, plus `j`) and written once per iteration by a plain
assignment at the top of the body, never read where written. Alignment is not assumed:
a row that starts off a 16-byte boundary (`cols` not a multiple of 4) runs the loop as
written. Sums are added in another order, within the tolerance a float sum has.
"""

from __future__ import annotations

from dataclasses import dataclass

from kfbot.search.rewrites import syntax as sx
from kfbot.search.rewrites.syntax import Target

GUARD = "kfbot_aligned16"
_ALIGNED = f"""\
// True when p may be read and written as float4 (16-byte aligned).
__device__ __forceinline__ bool {GUARD}(const void* p) {{
    return (reinterpret_cast<unsigned long long>(p) & 15ull) == 0;
}}

"""
_PARTS = ("x", "y", "z", "w")
_SYNC = ("__syncthreads", "__syncwarp", "__shfl", "atomic", "__threadfence")
_INDEX_TYPES = frozenset({"int", "unsigned", "unsignedint", "long", "longlong", "size_t",
                          "int64_t"})


@dataclass(frozen=True)
class _Access:
    node: sx.Node  # the subscript expression
    key: str  # its vector base, as text: `in`, `(x + (size_t)r * cols)`
    written: bool


@dataclass(frozen=True)
class _Loop:
    node: sx.Node
    j: str
    index_type: str
    start: str
    step: str
    bound: str
    accesses: tuple[_Access, ...]


def vectorize_row_loads(source: str, target: Target) -> str | None:
    root = sx.parse(source)
    kernels = sx.kernels_named(root, target.kernel)
    if len(kernels) != 1:
        return None
    kernel = kernels[0]
    floats = float_pointers(kernel)
    loops = [found for node in sx.walk(kernel) if node.type == "for_statement"
             for found in [_row_loop(kernel, node, floats)] if found is not None]
    if not loops:
        return None
    src = source.encode()
    edits = [(lp.node.start_byte, lp.node.end_byte, _vectorised(src, lp, n).encode())
             for n, lp in enumerate(loops)]
    defined = {sx.fn_name(fn) for fn in sx.functions(root, sx.DEVICE_FN)}
    if GUARD not in defined:
        edits.append(sx.insert_before_definition(kernel, _ALIGNED))
    return sx.spliced(src, edits)


def float_pointers(kernel: sx.Node) -> set[str]:
    """Names declared in the kernel as pointers to float (parameters and locals)."""
    out: set[str] = set()
    decls = [*sx.params(kernel), *(n for n in sx.walk(kernel) if n.type == "declaration")]
    for decl in decls:
        if sx.text(sx.field(decl, "type")) != "float":
            continue
        for d in decl.children_by_field_name("declarator"):
            inner = sx.field(d, "declarator") if d.type == "init_declarator" else d
            if inner is not None and inner.type == "pointer_declarator":
                name = sx.field(inner, "declarator")
                if name is not None and name.type == "identifier":
                    out.add(sx.text(name))
    return out


def _row_loop(kernel: sx.Node, loop: sx.Node, floats: set[str]) -> _Loop | None:
    if _inside_other_loop(loop, kernel) or _already_guarded(loop, kernel):
        return None
    header = _header(kernel, loop)
    if header is None:
        return None
    j, index_type, start, step, bound = header
    body = sx.field(loop, "body")
    if body is None or sx.assigned(body, j) or not _straight(body):
        return None
    accesses = _accesses(body, j, floats)
    if not accesses or (any(a.written for a in accesses) and not _writes_ok(body, accesses)):
        return None
    return _Loop(loop, j, index_type, start, step, bound, tuple(accesses))


def _inside_other_loop(loop: sx.Node, kernel: sx.Node) -> bool:
    node = loop.parent
    while node is not None and node != kernel:
        if node.type in ("for_statement", "while_statement", "do_statement"):
            return True
        node = node.parent
    return False


def _already_guarded(loop: sx.Node, kernel: sx.Node) -> bool:
    """Inside this rewrite's own alignment check: its scalar loops stay scalar."""
    node = loop.parent
    while node is not None and node != kernel:
        if node.type == "if_statement" and GUARD in sx.identifiers(
                sx.field(node, "condition") or node):
            return True
        node = node.parent
    return False


def _header(kernel: sx.Node, loop: sx.Node) -> tuple[str, str, str, str, str] | None:
    """(j, its type, start, step, bound) of a loop that splits a row among a group."""
    init, cond, update = (sx.field(loop, k) for k in ("initializer", "condition", "update"))
    if init is None or cond is None or update is None or init.type != "declaration":
        return None
    decls = init.children_by_field_name("declarator")
    index_type = "".join(sx.text(sx.field(init, "type")).split())
    if len(decls) != 1 or decls[0].type != "init_declarator" or index_type not in _INDEX_TYPES:
        return None
    j = sx.text(sx.field(decls[0], "declarator"))
    start = sx.field(decls[0], "value")
    bound = sx.field(cond, "right")
    if start is None or bound is None or cond.type != "binary_expression" \
            or sx.text(sx.field(cond, "operator")) != "<" \
            or sx.text(sx.field(cond, "left")) != j or j in sx.identifiers(bound):
        return None
    step = _step(update, j)
    if step is None or not _group(kernel, start, step):
        return None
    return j, sx.text(sx.field(init, "type")), sx.text(start), step, sx.text(bound)


def _step(update: sx.Node, j: str) -> str | None:
    norm = sx.norm(update)
    if norm in (f"++{j}", f"{j}++", f"{j}+=1"):
        return "1"
    if update.type == "assignment_expression" and sx.text(sx.field(update, "left")) == j \
            and sx.text(sx.field(update, "operator")) == "+=":
        return sx.text(sx.field(update, "right"))
    return None


def _group(kernel: sx.Node, start: sx.Node, step: str) -> bool:
    """The start is the thread's place in a group of `step` threads that share the row."""
    steps = "".join(step.split())
    if sx.text(start) == "0":
        return steps == "1"
    if steps in ("32", "warpSize"):
        return _lane(kernel, start)
    if steps in ("blockDim.x", "(int)blockDim.x", "static_cast<int>(blockDim.x)"):
        return sx.is_thread_index(kernel, sx.strip(start))
    return False


def _lane(kernel: sx.Node, node: sx.Node) -> bool:
    """`threadIdx.x % 32` (or `& 31`), or a local initialised once to it."""
    node = sx.strip(node)
    if node.type == "identifier":
        init = sx.local_init(node, sx.text(node))
        if init is None:
            return False
        node = sx.strip(init)
    return sx.norm(node) in ("threadIdx.x%32", "threadIdx.x&31", "threadIdx.x%warpSize")


def _straight(body: sx.Node) -> bool:
    """No inner loop, jump or barrier: one pass of the body per column."""
    for node in sx.walk(body):
        if node.type in ("for_statement", "while_statement", "do_statement",
                         "return_statement", "break_statement", "continue_statement",
                         "goto_statement", "lambda_expression"):
            return False
        if node.type == "call_expression" and sx.text(sx.field(node, "function")).startswith(
                _SYNC):
            return False
    return True


def _accesses(body: sx.Node, j: str, floats: set[str]) -> list[_Access] | None:
    """The float accesses at j (plus an invariant offset); None when memory written in the
    loop is read there or written elsewhere than at j."""
    locals_ = sx.identifiers(body) - _outer_names(body)
    out: list[_Access] = []
    written_bases: set[str] = set()
    for node in sx.walk(body):
        if node.type != "subscript_expression":
            continue
        base, index = sx.field(node, "argument"), sx.field(node, "indices")
        inner = sx.named(index) if index is not None else []
        written = _is_written(node)
        if base is None or base.type != "identifier" or len(inner) != 1:
            if written:
                return None
            continue
        key = _key(sx.text(base), inner[0], j, locals_, body) if sx.text(base) in floats else None
        if written:
            if key is None:
                return None
            written_bases.add(sx.text(base))
        if key is not None:
            out.append(_Access(node, key, written))
    reads = {sx.text(sx.field(a.node, "argument")) for a in out if not a.written}
    if reads & written_bases:
        return None
    return out


def _outer_names(body: sx.Node) -> set[str]:
    """Identifiers the body uses but does not declare."""
    declared: set[str] = set()
    for node in sx.walk(body):
        if node.type == "init_declarator":
            declared.add(sx.text(sx.field(node, "declarator")))
        elif node.type == "declaration":
            declared |= {sx.text(d) for d in node.children_by_field_name("declarator")
                         if d.type == "identifier"}
    return sx.identifiers(body) - declared


def _key(base: str, index: sx.Node, j: str, locals_: set[str], body: sx.Node
         ) -> str | None:
    """The vector base of `base[index]` when the index is j plus an offset the loop does
    not change: `base`, or `(base + (offset))`."""
    index = sx.strip(index)
    if index.type == "identifier" and sx.text(index) == j:
        return base
    if index.type != "binary_expression" or sx.text(sx.field(index, "operator")) != "+":
        return None
    left, right = sx.field(index, "left"), sx.field(index, "right")
    for mine, other in ((left, right), (right, left)):
        if mine is not None and other is not None and sx.text(sx.strip(mine)) == j \
                and not (sx.identifiers(other) & (locals_ | {j})) \
                and not any(sx.assigned(body, name) for name in sx.identifiers(other)):
            return f"({base} + ({sx.text(other)}))"
    return None


def _is_written(node: sx.Node) -> bool:
    parent = node.parent
    return parent is not None and (
        (parent.type == "assignment_expression" and sx.field(parent, "left") == node)
        or parent.type == "update_expression")


def _writes_ok(body: sx.Node, accesses: list[_Access]) -> bool:
    """Each written base is written by exactly one plain `p[j] = e;` at the top of the
    body: every component of its float4 is set on every pass."""
    top = sx.named(body) if body.type == "compound_statement" else [body]
    plain = set()
    for stmt in top:
        expr = sx.named(stmt)[0] if stmt.type == "expression_statement" and sx.named(stmt) \
            else None
        if expr is not None and expr.type == "assignment_expression" \
                and sx.text(sx.field(expr, "operator")) == "=":
            plain.add(sx.field(expr, "left"))
    written = [a for a in accesses if a.written]
    keys = [a.key for a in written]
    return all(a.node in plain for a in written) and len(keys) == len(set(keys))


def _vectorised(src: bytes, lp: _Loop, n: int) -> str:
    indent = sx.indent_at(src, lp.node) or "    "
    inner, deeper = "    ", "        "  # after the loop's own indent, which joins the lines
    sfx = f"_{n}" if n else ""
    q, n4 = f"kfbot_q{sfx}", f"kfbot_n4{sfx}"
    reads = list(dict.fromkeys(a.key for a in lp.accesses if not a.written))
    writes = list(dict.fromkeys(a.key for a in lp.accesses if a.written))
    names = {key: f"kfbot_v{i}{sfx}" for i, key in enumerate(reads)}
    names |= {key: f"kfbot_w{i}{sfx}" for i, key in enumerate(writes)}
    guard = " && ".join(f"{GUARD}({key})" for key in [*reads, *writes])
    step = f"{q} += {lp.step}" if lp.step != "1" else f"++{q}"
    out = [f"if ({guard}) {{",
           f"{inner}const {lp.index_type} {n4} = ({lp.bound}) / 4;",
           f"{inner}for ({lp.index_type} {q} = {lp.start}; {q} < {n4}; {step}) {{"]
    out += [f"{deeper}const float4 {names[k]} = reinterpret_cast<const float4*>({k})[{q}];"
            for k in reads]
    out += [f"{deeper}float4 {names[k]};" for k in writes]
    body = sx.field(lp.node, "body")
    assert body is not None
    uses_j = _uses(body, lp.j) > sum(_uses(a.node, lp.j) for a in lp.accesses)
    for part, letter in enumerate(_PARTS):
        text = _body_text(body, {a.node: f"{names[a.key]}.{letter}" for a in lp.accesses})
        column = f"const {lp.index_type} {lp.j} = {q} * 4 + {part}; " if uses_j else ""
        out.append(f"{deeper}{{ {column}{text} }}")
    out += [f"{deeper}reinterpret_cast<float4*>({k})[{q}] = {names[k]};" for k in writes]
    update = f"{lp.j} += {lp.step}" if lp.step != "1" else f"++{lp.j}"
    tail_start = f"{n4} * 4" if lp.start == "0" else f"{n4} * 4 + {lp.start}"
    original = sx.text(lp.node)
    out += [f"{inner}}}",
            f"{inner}for ({lp.index_type} {lp.j} = {tail_start}; {lp.j} < {lp.bound}; "
            f"{update}) {{ {_body_text(body, {})} }}",
            "} else {", f"{inner}{_reindent(original, indent, indent + inner)}", "}"]
    return f"\n{indent}".join(out)


def _uses(node: sx.Node, name: str) -> int:
    return sum(1 for n in sx.walk(node) if n.type == "identifier" and sx.text(n) == name)


def _body_text(body: sx.Node, replace: dict[sx.Node, str]) -> str:
    """The body's statements on one line, with the given subscripts replaced."""
    base = body.start_byte
    edits = [(n.start_byte - base, n.end_byte - base, new.encode())
             for n, new in replace.items()]
    edits += [(n.start_byte - base, n.end_byte - base, b"") for n in sx.walk(body)
              if n.type == "comment"]  # a line comment would swallow what follows
    text = sx.splice(sx.text(body).encode(), edits).decode()
    if body.type == "compound_statement":
        text = text.strip()[1:-1]
    return " ".join(line.strip() for line in text.split("\n") if line.strip())


def _reindent(text: str, old: str, new: str) -> str:
    return text.replace(f"\n{old}", f"\n{new}")
