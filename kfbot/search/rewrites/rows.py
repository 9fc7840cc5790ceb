"""Row-wise reductions: a thread-per-row kernel (see `rowshape.py`) split across a warp
or a block per row, its accumulators combined with shuffles, and its launches changed
to match.

warp-per-row: a block of 256 threads holds 8 warps, each owning one row; lane `l`
handles columns l, l + 32, ... so a warp reads 32 consecutive floats at a time
(coalesced) where the original thread walked its row alone. block-per-row: the 256
threads of a block share one row (better for long rows), and accumulators go through
shared memory between the warps. In both, every loop over the row's columns keeps its
body as written and only strides differently; each accumulator starts from its
identity on every lane (a sum from 0, its old value added back once; a max or min
from its old value, which repeating cannot change) and is combined across the lanes
with a butterfly, so every lane ends with the same value, bit for bit, and the code
after the loop reads it as before. A loop without accumulators is followed by a
barrier when memory is touched after it, and a write outside the loops is done by one
thread. Any row count, column count, tail and size 1 stay correct: rows past the end
return as a whole warp or block, and strided loops stop at the column bound.
"""

from __future__ import annotations

from dataclasses import dataclass

from kfbot.search.rewrites import syntax as sx
from kfbot.search.rewrites.launch import LaunchPlan, kernel_launch_edits
from kfbot.search.rewrites.rowshape import ColumnLoop, RowKernel, row_kernel
from kfbot.search.rewrites.syntax import Target

THREADS = 256
WARP_ROWS = THREADS // 32


@dataclass(frozen=True)
class _Split:
    index: str  # the thread's position within its row's threads
    declare: str  # the statement declaring it
    step: str  # the column stride
    row: str  # the row index, `{t}` standing for its type
    reduce: str  # prefix of the reduction helpers
    barrier: str
    grid: str  # the launch's grid, `{rows}` standing for the row count


_WARP = _Split(
    index="kfbot_lane",
    declare="const int kfbot_lane = threadIdx.x % 32;  // this thread's lane in its row's warp",
    step="32",
    row="({t})blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32",
    reduce="kfbot_warp",
    barrier="__syncwarp();",
    grid=f"(unsigned)((({{rows}}) + {WARP_ROWS - 1}) / {WARP_ROWS})",
)
_BLOCK = _Split(
    index="kfbot_tid",
    declare="const int kfbot_tid = threadIdx.x;  // this thread's place among its row's threads",
    step="(int)blockDim.x",
    row="({t})blockIdx.x",
    reduce="kfbot_block",
    barrier="__syncthreads();",
    grid="(unsigned)({rows})",
)


def warp_per_row(source: str, target: Target) -> str | None:
    return _rewrite(source, target, _WARP)


def block_per_row(source: str, target: Target) -> str | None:
    return _rewrite(source, target, _BLOCK)


def row_map_per_block(source: str, target: Target) -> str | None:
    """block-per-row for a thread-per-row kernel with no accumulator at all: an
    elementwise map written as a loop over each row's columns (the elementwise class's
    form of the same rewrite, so that a reduction is not taken for a map)."""
    return _rewrite(source, target, _BLOCK, maps_only=True)


def _rewrite(source: str, target: Target, split: _Split, maps_only: bool = False) -> str | None:
    found_kernel = sx.sole_kernel(source, target)
    if found_kernel is None:
        return None
    root, kernel = found_kernel
    shape = row_kernel(kernel)
    if shape is None or (maps_only and any(loop.accumulators for loop in shape.loops)):
        return None
    src = source.encode()
    plan = LaunchPlan(grid=lambda args: _grid(split, shape, args), block=str(THREADS),
                      threads=THREADS)
    launch = kernel_launch_edits(root, kernel, plan)
    if launch is None:
        return None
    used = {(split.reduce, a.combine) for loop in shape.loops for a in loop.accumulators}
    helpers = reduction_helpers(root, kernel, sorted(used))
    return sx.spliced(src, [*_kernel_edits(src, shape, split), *launch, *helpers])


def _grid(split: _Split, shape: RowKernel, args: dict[str, sx.Node]) -> str | None:
    """The grid for the launch: from the argument passed for the row bound, or the
    bound itself when it is a literal or a file-level constant."""
    if shape.bound in args:
        rows = sx.text(args[shape.bound])
    elif shape.bound.isdigit() or shape.bound.isupper():
        rows = shape.bound
    else:
        return None
    return split.grid.format(rows=rows)


def _kernel_edits(src: bytes, shape: RowKernel, split: _Split) -> list[sx.Edit]:
    indent = sx.indent_at(src, shape.row_decl) or "    "
    row_type = shape.row_type.replace("const", "").strip() or "int"
    edits: list[sx.Edit] = [
        (shape.row_decl.start_byte, shape.row_decl.start_byte,
         f"{split.declare}\n{indent}".encode()),
        (shape.row_value.start_byte, shape.row_value.end_byte,
         split.row.format(t=row_type).encode()),
    ]
    every, others = _memory_after(shape)
    for loop in shape.loops:
        edits += _loop_edits(src, loop, split, every[loop.node.id])
    for stmt in shape.single_writes:
        here = sx.indent_at(src, stmt) or indent
        edits.append((stmt.start_byte, stmt.start_byte,
                      f"if ({split.index} == 0) ".encode()))
        if others[stmt.id]:
            edits.append((stmt.end_byte, stmt.end_byte, f"\n{here}{split.barrier}".encode()))
    return edits


def _memory_after(shape: RowKernel) -> tuple[dict[int, bool], dict[int, bool]]:
    """For each statement of the row's work: does a later one touch memory, and does a
    later one that every thread runs (not a single write, which the same one thread
    does in order) touch it? Either calls for a barrier after a write."""
    every: dict[int, bool] = {}
    others: dict[int, bool] = {}
    seen_any = seen_shared = False
    singles = {s.id for s in shape.single_writes}
    for stmt in reversed(shape.statements):
        every[stmt.id], others[stmt.id] = seen_any, seen_shared
        touches = any(n.type == "subscript_expression" for n in sx.walk(stmt))
        seen_any = seen_any or touches
        seen_shared = seen_shared or (touches and stmt.id not in singles)
    return every, others


def _loop_edits(src: bytes, loop: ColumnLoop, split: _Split, memory_after: bool
                ) -> list[sx.Edit]:
    indent = sx.indent_at(src, loop.node) or "    "
    j = _loop_variable(loop)
    start = split.index if sx.text(loop.start) == "0" else \
        f"({sx.text(loop.start)}) + {split.index}"
    before, after = [], []
    for acc in loop.accumulators:
        if acc.combine == "sum" and _starts_at_zero(loop, acc.name):
            after.append(f"{acc.name} = {split.reduce}_sum({acc.name});")
        elif acc.combine == "sum":
            before.append(f"const auto kfbot_{acc.name}_start = {acc.name};")
            before.append(f"{acc.name} = 0;")
            after.append(f"{acc.name} = kfbot_{acc.name}_start + "
                         f"{split.reduce}_sum({acc.name});")
        else:
            after.append(f"{acc.name} = {split.reduce}_{acc.combine}({acc.name});")
    if not loop.accumulators and memory_after:
        after.append(split.barrier)
    edits: list[sx.Edit] = [
        (loop.start.start_byte, loop.start.end_byte, start.encode()),
        (loop.update.start_byte, loop.update.end_byte, f"{j} += {split.step}".encode()),
    ]
    if before:
        edits.append((loop.node.start_byte, loop.node.start_byte,
                      "".join(f"{line}\n{indent}" for line in before).encode()))
    if after:
        edits.append((loop.node.end_byte, loop.node.end_byte,
                      "".join(f"\n{indent}{line}" for line in after).encode()))
    return edits


def _starts_at_zero(loop: ColumnLoop, name: str) -> bool:
    """The statement before the loop declares `name` as zero: no start to add back."""
    prev = loop.node.prev_named_sibling
    while prev is not None and prev.type == "comment":
        prev = prev.prev_named_sibling
    if prev is None or prev.type != "declaration":
        return False
    return sx.declares_zero(prev, name)


def _loop_variable(loop: ColumnLoop) -> str:
    init = sx.field(loop.node, "initializer")
    decl = init.children_by_field_name("declarator")[0] if init is not None else None
    return sx.text(sx.field(decl, "declarator"))


# --- the reduction helpers -------------------------------------------------------------------

_COMBINE = {"sum": "{a} + {b}", "max": "kfbot_max({a}, {b})", "min": "kfbot_min({a}, {b})"}
_IDENTITY = {"sum": "T(0)", "max": "partials[0]", "min": "partials[0]"}  # for unused lanes

_PICK = """\
// fmaxf/fminf for floating point (NaN-ignoring, like the loops they replace), else > / <.
__device__ __forceinline__ float kfbot_{kind}(float a, float b) {{ return f{kind}f(a, b); }}
__device__ __forceinline__ double kfbot_{kind}(double a, double b) {{ return f{kind}(a, b); }}
template <typename T>
__device__ __forceinline__ T kfbot_{kind}(T a, T b) {{ return a {op} b ? a : b; }}"""

_WARP_REDUCE = """\
// Combines v across the 32 lanes of a warp with a butterfly: every lane gets the same result.
template <typename T>
__device__ __forceinline__ T kfbot_warp_{kind}(T v) {{
    for (int offset = 16; offset > 0; offset >>= 1)
        v = {step};
    return v;
}}"""

_BLOCK_REDUCE = """\
// Combines v across the whole block (whole warps): every thread gets the same result.
template <typename T>
__device__ __forceinline__ T kfbot_block_{kind}(T v) {{
    __shared__ T partials[32];
    const int lane = threadIdx.x % 32;
    v = kfbot_warp_{kind}(v);
    __syncthreads();  // the previous call's readers are done with partials
    if (lane == 0) partials[threadIdx.x / 32] = v;
    __syncthreads();
    v = lane < (int)((blockDim.x + 31) / 32) ? partials[lane] : {identity};
    return kfbot_warp_{kind}(v);
}}"""


def helper_texts(needed: list[tuple[str, str]]) -> dict[str, str]:
    """The helpers for (prefix, combine) pairs, with what they call, by name, in the order
    they must be defined."""
    out: dict[str, str] = {}
    for prefix, kind in needed:
        if kind in ("max", "min"):
            out[f"kfbot_{kind}"] = _PICK.format(kind=kind, op=">" if kind == "max" else "<")
        shuffled = "__shfl_xor_sync(0xffffffffu, v, offset)"
        out[f"kfbot_warp_{kind}"] = _WARP_REDUCE.format(
            kind=kind, step=_COMBINE[kind].format(a="v", b=shuffled))
        if prefix == "kfbot_block":
            out[f"kfbot_block_{kind}"] = _BLOCK_REDUCE.format(kind=kind,
                                                              identity=_IDENTITY[kind])
    return out


def reduction_helpers(root: sx.Node, kernel: sx.Node, needed: list[tuple[str, str]]
                      ) -> list[sx.Edit]:
    """The edit inserting the helpers the file does not define yet, just before the
    kernel (in its namespace, so it calls them unqualified)."""
    defined = {sx.fn_name(fn) for fn in sx.functions(root, sx.DEVICE_FN)}
    texts = [t for name, t in helper_texts(needed).items() if name not in defined]
    if not texts:
        return []
    return [sx.insert_before_definition(kernel, "\n\n".join(texts) + "\n\n")]
