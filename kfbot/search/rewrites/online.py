"""online-softmax: the max pass and the sum-of-exponentials pass of a split row kernel
fused into one (single-pass max and sum, Milakov and Gimelshein 2018).

The shape, as the warp-per-row and block-per-row rewrites leave a softmax:

    float m = -INFINITY;                       // any start
    for (J) m = fmaxf(m, E);                   // the max pass
    m = kfbot_warp_max(m);                     // or kfbot_block_max
    float s = 0.0f;
    for (J) s += expf(E - m);                  // the same loop header and E
    s = kfbot_warp_sum(s);                     // or kfbot_block_sum

becomes one loop that keeps a running maximum and rescales the running sum whenever
the maximum grows, then one combine of the (max, sum) pairs across the row's threads:

    float s = 0.0f;
    for (J) { const float v = E; const float nm = fmaxf(m, v);
              if (nm != -INFINITY) { s = s * expf(m - nm) + expf(v - nm); m = nm; } }
    kfbot_warp_online(m, s);

A row read twice instead of three times. A value of -INFINITY (a masked element) adds
nothing and never makes a NaN: the update is skipped while the maximum is -INFINITY,
and pairs whose maximum is -INFINITY combine to a zero sum.
"""

from __future__ import annotations

from kfbot.search.rewrites import syntax as sx
from kfbot.search.rewrites.syntax import Target

_EXP = ("expf", "__expf", "exp")
_MAX = ("fmaxf", "fmax", "max")

_WARP_ONLINE = """\
// Combines running (max, sum of exp(x - max)) pairs across a warp: every lane gets the
// same result. A pair whose max is -INFINITY is empty and adds nothing.
__device__ __forceinline__ void kfbot_warp_online(float& m, float& s) {
    for (int offset = 16; offset > 0; offset >>= 1) {
        const float om = __shfl_xor_sync(0xffffffffu, m, offset);
        const float os = __shfl_xor_sync(0xffffffffu, s, offset);
        const float nm = fmaxf(m, om);
        s = nm == -INFINITY ? 0.0f : s * EXP(m - nm) + os * EXP(om - nm);
        m = nm;
    }
}"""

_BLOCK_ONLINE = """\
// The same across the whole block (whole warps), through shared memory.
__device__ __forceinline__ void kfbot_block_online(float& m, float& s) {
    __shared__ float kfbot_pm[32];
    __shared__ float kfbot_ps[32];
    const int lane = threadIdx.x % 32;
    kfbot_warp_online(m, s);
    __syncthreads();  // the previous call's readers are done with the partials
    if (lane == 0) {
        kfbot_pm[threadIdx.x / 32] = m;
        kfbot_ps[threadIdx.x / 32] = s;
    }
    __syncthreads();
    const bool mine = lane < (int)((blockDim.x + 31) / 32);
    m = mine ? kfbot_pm[lane] : -INFINITY;
    s = mine ? kfbot_ps[lane] : 0.0f;
    kfbot_warp_online(m, s);
}"""


def online_softmax(source: str, target: Target) -> str | None:
    root = sx.parse(source)
    kernels = sx.kernels_named(root, target.kernel)
    if len(kernels) != 1:
        return None
    body = sx.field(kernels[0], "body")
    if body is None:
        return None
    src = source.encode()
    for block in [body, *[n for n in sx.walk(body) if n.type == "compound_statement"]]:
        stmts = sx.named(block)
        for i in range(len(stmts) - 4):
            found = _fused(src, stmts[i:i + 5])
            if found is not None:
                edit, prefix, exp = found
                helpers = _helpers(root, kernels[0], prefix, exp)
                return sx.spliced(src, [edit, *helpers])
    return None


def _fused(src: bytes, five: list[sx.Node]) -> tuple[sx.Edit, str, str] | None:
    loop_a, reduce_a, decl_s, loop_b, reduce_b = five
    if loop_a.type != "for_statement" or loop_b.type != "for_statement":
        return None
    if _header(loop_a) is None or _header(loop_a) != _header(loop_b):
        return None
    max_of = _max_step(loop_a)
    sum_of = _sum_step(loop_b)
    if max_of is None or sum_of is None:
        return None
    m, value = max_of
    s, exp, shifted, minus = sum_of
    if shifted != value or minus != m or s == m:
        return None
    prefix_a, prefix_b = _reduced(reduce_a, m, "max"), _reduced(reduce_b, s, "sum")
    if prefix_a is None or prefix_a != prefix_b or not _zero_float(decl_s, s):
        return None
    ind = sx.indent_at(src, loop_a) or "    "
    inner = ind + "    "
    header = sx.text(loop_a)[: sx.field(loop_a, "body").start_byte - loop_a.start_byte]  # type: ignore[union-attr]
    text = "\n".join([
        f"{sx.text(decl_s)}",
        f"{ind}{header.rstrip()} {{  // max and sum in one pass (online softmax)",
        f"{inner}const float kfbot_v = {value};",
        f"{inner}const float kfbot_m = fmaxf({m}, kfbot_v);",
        f"{inner}if (kfbot_m != -INFINITY) {{",
        f"{inner}    {s} = {s} * {exp}({m} - kfbot_m) + {exp}(kfbot_v - kfbot_m);",
        f"{inner}    {m} = kfbot_m;",
        f"{inner}}}",
        f"{ind}}}",
        f"{ind}{prefix_a}_online({m}, {s});",
    ])
    return (loop_a.start_byte, reduce_b.end_byte, text.encode()), prefix_a, exp


def _header(loop: sx.Node) -> str | None:
    parts = [sx.field(loop, k) for k in ("initializer", "condition", "update")]
    if any(p is None for p in parts):
        return None
    norms = [sx.norm(p) for p in parts if p is not None]
    return None if any(n is None for n in norms) else "|".join(n or "" for n in norms)


def _only(loop: sx.Node) -> sx.Node | None:
    body = sx.field(loop, "body")
    if body is not None and body.type == "compound_statement":
        inner = sx.named(body)
        body = inner[0] if len(inner) == 1 else None
    if body is None or body.type != "expression_statement" or len(sx.named(body)) != 1:
        return None
    return sx.named(body)[0]


def _max_step(loop: sx.Node) -> tuple[str, str] | None:
    """(m, E) of `m = fmaxf(m, E);`."""
    expr = _only(loop)
    if expr is None or expr.type != "assignment_expression" \
            or sx.text(sx.field(expr, "operator")) != "=":
        return None
    left, right = sx.field(expr, "left"), sx.field(expr, "right")
    if left is None or right is None or left.type != "identifier" \
            or right.type != "call_expression" or sx.text(sx.field(right, "function")) not in _MAX:
        return None
    args = sx.named(sx.field(right, "arguments") or right)
    m = sx.text(left)
    if len(args) != 2 or sx.text(args[0]) != m or m in sx.identifiers(args[1]):
        return None
    return m, sx.text(args[1])


def _sum_step(loop: sx.Node) -> tuple[str, str, str, str] | None:
    """(s, exp, E, m) of `s += expf(E - m);`."""
    expr = _only(loop)
    if expr is None or expr.type != "assignment_expression" \
            or sx.text(sx.field(expr, "operator")) != "+=":
        return None
    left, right = sx.field(expr, "left"), sx.field(expr, "right")
    if left is None or right is None or left.type != "identifier" \
            or right.type != "call_expression" or sx.text(sx.field(right, "function")) not in _EXP:
        return None
    args = sx.named(sx.field(right, "arguments") or right)
    diff = sx.strip(args[0]) if len(args) == 1 else None
    if diff is None or diff.type != "binary_expression" \
            or sx.text(sx.field(diff, "operator")) != "-":
        return None
    a, b = sx.field(diff, "left"), sx.field(diff, "right")
    if a is None or b is None or b.type != "identifier":
        return None
    return sx.text(left), sx.text(sx.field(right, "function")), sx.text(a), sx.text(b)


def _reduced(stmt: sx.Node, name: str, kind: str) -> str | None:
    """The prefix (kfbot_warp or kfbot_block) of `name = <prefix>_<kind>(name);`."""
    for prefix in ("kfbot_warp", "kfbot_block"):
        if sx.norm(stmt) == f"{name}={prefix}_{kind}({name});":
            return prefix
    return None


def _zero_float(stmt: sx.Node, name: str) -> bool:
    if stmt.type != "declaration" or sx.text(sx.field(stmt, "type")) != "float":
        return False
    return sx.declares_zero(stmt, name)


def _helpers(root: sx.Node, kernel: sx.Node, prefix: str, exp: str) -> list[sx.Edit]:
    defined = {sx.fn_name(fn) for fn in sx.functions(root, sx.DEVICE_FN)}
    texts = []
    if "kfbot_warp_online" not in defined:
        texts.append(_WARP_ONLINE.replace("EXP", exp))
    if prefix == "kfbot_block" and "kfbot_block_online" not in defined:
        texts.append(_BLOCK_ONLINE)
    if not texts:
        return []
    return [sx.insert_before_definition(kernel, "\n\n".join(texts) + "\n\n")]
