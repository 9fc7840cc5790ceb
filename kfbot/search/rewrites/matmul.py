"""Matrix multiply: one thread per output element becomes shared-memory and register
tiling.

The shape (on top of `grid2d`): under the guard, `T acc = 0;` (float or double), then
`for (int k = 0; k < K; ++k) acc += X * Y;` where X reads an array at an index of one
thread variable and k only and Y at an index of k and the other, then statements that
store `acc` (an epilogue such as `C[row * N + col] = alpha * acc;`) and do not read k.
The variable the epilogue's store steps along in memory is the column (consecutive
threads take consecutive columns, so the stores are coalesced) and the other the row.

The rewrite keeps the user's expressions: a block of 16 x 16 threads computes a
(16 T) x (16 T) tile of outputs, T x T per thread; the tiles of X and Y are loaded
into shared memory BK values of k at a time by evaluating X and Y with the user's own
variable names bound to the element being loaded (zero past the bounds), and each
output's epilogue runs with `acc`, the row and the column bound to it. k is summed in
the same order as before, so results match the original's up to fused multiply-adds.
Threads own rows ty, ty + 16, ... and columns tx, tx + 16, ... of the tile, so the
shared-memory reads are conflict-free and the epilogue's stores are coalesced.
"""

from __future__ import annotations

from dataclasses import dataclass

from kfbot.search.rewrites import syntax as sx
from kfbot.search.rewrites.grid2d import Grid2D, grid2d, launch_bound, unit_variable
from kfbot.search.rewrites.launch import Condition, Dispatch, LaunchPlan, dispatched_launch_edits
from kfbot.search.rewrites.syntax import Target


@dataclass(frozen=True)
class _Matmul:
    shape: Grid2D
    row: str  # the variable of the output's row (X's other index)
    col: str
    acc: str
    acc_type: str
    k: str
    k_type: str
    k_bound: str
    left: str  # X, reading (row, k)
    right: str  # Y, reading (k, col)
    left_fast: str  # which of row/k is X's contiguous index
    right_fast: str
    epilogue: str


@dataclass(frozen=True)
class Tiling:
    per_thread: int  # T: a thread's outputs are T x T, in groups of 4 x 4
    depth: int  # BK: values of k per shared-memory tile

    @property
    def tile(self) -> int:
        return 16 * self.per_thread


SMALL = Tiling(per_thread=4, depth=8)
LARGE = Tiling(per_thread=8, depth=8)
# At most this many multiply-adds (128 x 128 x 128), a launch takes a few microseconds
# whichever kernel runs, and a tile per block leaves most of the GPU idle: measured on an
# H200, 65 x 33 x 17 took 5.6 us one thread per output and 6.7 us with 64 x 64 tiles.
SMALL_WORK = 2097152


def register_tiling(source: str, target: Target) -> str | None:
    return _rewrite(source, target, SMALL)


def register_tiling_large(source: str, target: Target) -> str | None:
    return _rewrite(source, target, LARGE)


def _rewrite(source: str, target: Target, tiling: Tiling) -> str | None:
    found_kernel = sx.sole_kernel(source, target)
    if found_kernel is None:
        return None
    root, kernel = found_kernel
    shape = grid2d(kernel)
    found = _matmul(shape) if shape is not None else None
    if found is None:
        return None
    t = tiling.tile

    def grid(args: dict[str, sx.Node]) -> str | None:
        rows = launch_bound(found.shape.var(found.row).bound, args)
        cols = launch_bound(found.shape.var(found.col).bound, args)
        if rows is None or cols is None:
            return None
        return (f"dim3((unsigned)(({cols}) + {t - 1}) / {t}, "
                f"(unsigned)(({rows}) + {t - 1}) / {t})")

    small = f"{target.kernel}_small"
    launch = dispatched_launch_edits(root, kernel, LaunchPlan(grid, "dim3(16, 16)", 256),
                                     Dispatch(small, _small_work(found), "too small to tile"))
    if launch is None or small in sx.identifiers(root):
        return None
    body = _body(found, tiling, sx.indent_at(source.encode(), found.shape.first) or "    ")
    edits = [(found.shape.first.start_byte, found.shape.last.end_byte, body.encode()),
             _copy(kernel, small), *launch]
    return sx.spliced(source.encode(), edits)


def _small_work(m: _Matmul) -> Condition:
    """The launch's multiply-adds (rows x columns x k) and the test for a small problem."""
    def condition(args: dict[str, sx.Node]) -> tuple[str, str] | None:
        sizes = [launch_bound(b, args) for b in
                 (m.shape.var(m.row).bound, m.shape.var(m.col).bound, m.k_bound)]
        if any(s is None for s in sizes):
            return None
        product = " * ".join(f"({s})" for s in sizes)
        return (f"const long long kfbot_work = (long long){product};",
                f"kfbot_work <= {SMALL_WORK}")
    return condition


def _copy(kernel: sx.Node, name: str) -> sx.Edit:
    """The original kernel under `name`, put before it (its template, if any, with it)."""
    top = sx.definition(kernel)
    ident = sx.fn_name_node(kernel)
    assert ident is not None  # the kernel was found by this name
    text = sx.splice(top.text or b"", [(ident.start_byte - top.start_byte,
                                        ident.end_byte - top.start_byte, name.encode())])
    comment = (f"// {sx.fn_name(kernel)} as it was: problems too small to fill the GPU with "
               "tiles run it unchanged.\n")
    return sx.insert_before_definition(kernel, comment + text.decode() + "\n\n")


def _matmul(shape: Grid2D) -> _Matmul | None:
    if len(shape.body) < 3:
        return None
    init, loop, *epilogue = shape.body
    acc = _zero_declaration(init)
    header = _k_loop(loop)
    if acc is None or header is None or not epilogue:
        return None
    acc_name, acc_type = acc
    k, k_type, k_bound, product = header
    names = {shape.x.name, shape.y.name}
    if k in names or acc_name in names or k_bound in names:
        return None
    update = _product(product, acc_name)
    if update is None:
        return None
    operands = _operands(update, k, names)
    if operands is None:
        return None
    (left, row, left_fast), (right, col, right_fast) = operands
    if _stored_along(epilogue, {row, col}) == row:  # the output's neighbours differ in `row`
        (left, row, left_fast), (right, col, right_fast) = operands[1], operands[0]
    for stmt in epilogue:
        if stmt.type not in ("expression_statement", "declaration", "if_statement") \
                or any(n.type in ("return_statement", "for_statement", "while_statement")
                       for n in sx.walk(stmt)) or k in sx.identifiers(stmt):
            return None
    return _Matmul(shape, row, col, acc_name, acc_type, k, k_type, k_bound, sx.text(left),
                   sx.text(right), left_fast, right_fast,
                   "\n".join(sx.text(s) for s in epilogue))


def _stored_along(epilogue: list[sx.Node], names: set[str]) -> str | None:
    """The variable the epilogue's first store steps along in memory (`+ v` in its index):
    it becomes the column, which consecutive threads take, so stores are coalesced."""
    for stmt in epilogue:
        for node in sx.walk(stmt):
            left = sx.field(node, "left")
            if node.type == "assignment_expression" and left is not None \
                    and left.type == "subscript_expression":
                inner = sx.named(sx.field(left, "indices") or left)
                return unit_variable(inner[0], names) if len(inner) == 1 else None
    return None


def _zero_declaration(stmt: sx.Node) -> tuple[str, str] | None:
    if stmt.type != "declaration" or "const" in sx.qualifiers(stmt):
        return None
    sole = sx.sole_init(stmt)
    if sole is None:
        return None
    name, value = sole
    type_ = sx.text(sx.field(stmt, "type"))
    if name is None or name.type != "identifier" \
            or sx.text(value).lower() not in sx.ZERO_LITERALS \
            or type_ not in ("float", "double"):
        return None
    return sx.text(name), type_


def _k_loop(loop: sx.Node) -> tuple[str, str, str, sx.Node] | None:
    """(k, its type, its bound, the update) of `for (T k = 0; k < K; ++k) acc += X * Y;`."""
    if loop.type != "for_statement":
        return None
    init, cond, update, body = (sx.field(loop, f)
                                for f in ("initializer", "condition", "update", "body"))
    if init is None or cond is None or update is None or body is None \
            or init.type != "declaration":
        return None
    decls = init.children_by_field_name("declarator")
    if len(decls) != 1 or decls[0].type != "init_declarator" \
            or sx.text(sx.field(decls[0], "value")) != "0":
        return None
    k = sx.text(sx.field(decls[0], "declarator"))
    bound = sx.field(cond, "right")
    if cond.type != "binary_expression" or sx.text(sx.field(cond, "left")) != k \
            or sx.text(sx.field(cond, "operator")) != "<" or bound is None \
            or bound.type not in ("identifier", "number_literal") \
            or sx.norm(update) not in (f"++{k}", f"{k}++", f"{k}+=1"):
        return None
    stmts = sx.named(body) if body.type == "compound_statement" else [body]
    if len(stmts) != 1 or stmts[0].type != "expression_statement" \
            or len(sx.named(stmts[0])) != 1:
        return None
    return k, sx.text(sx.field(init, "type")), sx.text(bound), sx.named(stmts[0])[0]


def _product(expr: sx.Node, acc: str) -> sx.Node | None:
    """X * Y of `acc += X * Y`."""
    left, right = sx.field(expr, "left"), sx.field(expr, "right")
    if expr.type != "assignment_expression" or sx.text(sx.field(expr, "operator")) != "+=" \
            or sx.text(left) != acc or right is None or right.type != "binary_expression" \
            or sx.text(sx.field(right, "operator")) != "*":
        return None
    return right


def _operands(product: sx.Node, k: str, names: set[str]
              ) -> tuple[tuple[sx.Node, str, str], tuple[sx.Node, str, str]] | None:
    """(X, its output variable, its contiguous index) and the same for Y: X's output
    variable is the row, Y's the column."""
    found = []
    for side in (sx.field(product, "left"), sx.field(product, "right")):
        side = sx.strip(side)
        base, index = sx.field(side, "argument"), sx.field(side, "indices")
        inner = sx.named(index) if index is not None else []
        if side.type != "subscript_expression" or base is None or base.type != "identifier" \
                or len(inner) != 1:
            return None
        used = sx.identifiers(inner[0]) & (names | {k})
        outer = used - {k}
        if k not in used or len(outer) != 1:
            return None
        var = outer.pop()
        fast = unit_variable(inner[0], {k, var}) or k
        found.append((side, var, fast))
    (x, xv, xf), (y, yv, yf) = found
    if xv == yv:
        return None
    return (x, xv, xf), (y, yv, yf)


def _body(m: _Matmul, tiling: Tiling, ind: str) -> str:
    t, bk, n = tiling.per_thread, tiling.depth, tiling.tile
    row_t, col_t = m.shape.var(m.row).type, m.shape.var(m.col).type
    row_b, col_b = m.shape.var(m.row).bound, m.shape.var(m.col).bound
    a_load = _tile_load("kfbot_As", m.left, (m.row, row_t, "kfbot_row0"), m.k, m.k_type,
                        m.left_fast == m.k, n, bk, row_b, m.k_bound, m.acc_type)
    b_load = _tile_load("kfbot_Bs", m.right, (m.col, col_t, "kfbot_col0"), m.k, m.k_type,
                        m.right_fast == m.k, n, bk, col_b, m.k_bound, m.acc_type)
    epilogue = m.epilogue.replace("\n", "\n            ")
    lines = [
        f"// A {n}x{n} tile of the output per block of 16x16 threads, {t}x{t} per thread",
        "// in groups of 4 rows (ty * 4 + 64 g) and 4 columns (tx * 4 + 64 g), so each",
        "// group is one 16-byte read of shared memory; the operands go through shared",
        f"// memory {bk} values of {m.k} at a time.",
        f"__shared__ __align__(16) {m.acc_type} kfbot_As[{bk}][{n + 4}];  // +4: no bank "
        "conflicts on stores",
        f"__shared__ __align__(16) {m.acc_type} kfbot_Bs[{bk}][{n + 4}];",
        "const int kfbot_tid = threadIdx.y * 16 + threadIdx.x;",
        f"const {row_t} kfbot_row0 = ({row_t})blockIdx.y * {n};",
        f"const {col_t} kfbot_col0 = ({col_t})blockIdx.x * {n};",
        f"{m.acc_type} kfbot_acc[{t}][{t}];",
        "#pragma unroll",
        f"for (int kfbot_i = 0; kfbot_i < {t}; ++kfbot_i)",
        "    #pragma unroll",
        f"    for (int kfbot_j = 0; kfbot_j < {t}; ++kfbot_j) kfbot_acc[kfbot_i][kfbot_j] = 0;",
        f"for ({m.k_type} kfbot_k0 = 0; kfbot_k0 < {m.k_bound}; kfbot_k0 += {bk}) {{",
        *a_load, *b_load,
        "    __syncthreads();",
        "    #pragma unroll",
        f"    for (int kk = 0; kk < {bk}; ++kk) {{  // no user code in here: plain names",
        f"        {m.acc_type} a[{t}], b[{t}];",
        *_fragment_reads(m.acc_type, t),
        "        #pragma unroll",
        f"        for (int i = 0; i < {t}; ++i)",
        "            #pragma unroll",
        f"            for (int j = 0; j < {t}; ++j) kfbot_acc[i][j] += a[i] * b[j];",
        "    }",
        "    __syncthreads();",
        "}",
        "#pragma unroll",
        f"for (int kfbot_i = 0; kfbot_i < {t}; ++kfbot_i) {{",
        "    #pragma unroll",
        f"    for (int kfbot_j = 0; kfbot_j < {t}; ++kfbot_j) {{",
        f"        const {row_t} {m.row} = kfbot_row0 + threadIdx.y * 4 + 64 * (kfbot_i / 4) "
        "+ kfbot_i % 4;",
        f"        const {col_t} {m.col} = kfbot_col0 + threadIdx.x * 4 + 64 * (kfbot_j / 4) "
        "+ kfbot_j % 4;",
        f"        if ({m.row} < {row_b} && {m.col} < {col_b}) {{",
        f"            {m.acc_type} {m.acc} = kfbot_acc[kfbot_i][kfbot_j];",
        f"            {epilogue}",
        "        }",
        "    }",
        "}",
    ]
    return ("\n" + ind).join(lines)


def _fragment_reads(elem: str, t: int) -> list[str]:
    """A thread's values of a and b for one k: float4 reads of its groups of 4 (a double
    is read one at a time, in the same places)."""
    if elem != "float":
        return ["        #pragma unroll",
                f"        for (int i = 0; i < {t}; ++i) {{",
                "            a[i] = kfbot_As[kk][threadIdx.y * 4 + 64 * (i / 4) + i % 4];",
                "            b[i] = kfbot_Bs[kk][threadIdx.x * 4 + 64 * (i / 4) + i % 4];",
                "        }"]
    return ["        #pragma unroll",
            f"        for (int g = 0; g < {t // 4}; ++g) {{",
            "            const float4 va = *reinterpret_cast<const float4*>("
            "&kfbot_As[kk][threadIdx.y * 4 + 64 * g]);",
            "            const float4 vb = *reinterpret_cast<const float4*>("
            "&kfbot_Bs[kk][threadIdx.x * 4 + 64 * g]);",
            "            a[4 * g] = va.x; a[4 * g + 1] = va.y; a[4 * g + 2] = va.z; "
            "a[4 * g + 3] = va.w;",
            "            b[4 * g] = vb.x; b[4 * g + 1] = vb.y; b[4 * g + 2] = vb.z; "
            "b[4 * g + 3] = vb.w;",
            "        }"]


def _tile_load(tile: str, expr: str, outer: tuple[str, str, str], k: str, k_type: str,
               k_fast: bool, n: int, bk: int, outer_bound: str, k_bound: str, elem: str
               ) -> list[str]:
    """Lines loading a BK x N tile: the element (outer o, k kk) of the tile evaluates the
    user's operand with its variables bound; consecutive threads take consecutive
    elements of the operand's contiguous index. With rows of N + 4 and BK = 8, the 32
    stores of a warp fall in 32 different banks either way."""
    name, type_, origin = outer
    if k_fast:
        split = [f"const int kfbot_kk = kfbot_e % {bk}, kfbot_o = kfbot_e / {bk};"]
    else:
        split = [f"const int kfbot_o = kfbot_e % {n}, kfbot_kk = kfbot_e / {n};"]
    return [
        "    #pragma unroll",
        f"    for (int kfbot_e0 = 0; kfbot_e0 < {n * bk}; kfbot_e0 += 256) {{",
        "        const int kfbot_e = kfbot_e0 + kfbot_tid;",
        *(f"        {s}" for s in split),
        f"        const {type_} {name} = {origin} + kfbot_o;",
        f"        const {k_type} {k} = kfbot_k0 + kfbot_kk;",
        f"        {tile}[kfbot_kk][kfbot_o] = ({name} < {outer_bound} && {k} < {k_bound}) ? "
        f"({elem})({expr}) : ({elem})0;",
        "    }",
    ]
