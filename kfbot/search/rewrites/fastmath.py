"""Fast math two ways: as code the repository can hold, and as the nvcc flag.

fast-math-intrinsics writes what `--use_fast_math` would do into the target kernel's
source (and the device functions only it calls), so the gain is committable:
`expf`/`logf`/`sinf`/`cosf` of a float become `__expf`/`__logf`/`__sinf`/`__cosf`,
`1.0f / sqrtf(x)` becomes `rsqrtf(x)`, `1.0f / x` becomes `__frcp_rn(x)` (correctly
rounded: the same bits) and a division of two floats becomes `__fdividef`. Each
intrinsic is used only where the task's float32 tolerance is at least `MARGIN` times
its documented worst error in the range kernels usually call it on (CUDA C++
Programming Guide, "Intrinsic Functions"); verification at the task's tolerance still
decides. Types are read off declarations: an operand whose type is not plainly
`float` is left alone, so integer and double arithmetic never change.

fast-math-flags changes no source: it adds `--use_fast_math` to the candidate's
`KFBOT_NVCC_FLAGS` param, which the build passes to device-code compiles.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator, Mapping

from kfbot.evaluate.candidate import NVCC_FLAGS_PARAM
from kfbot.evaluate.scope import definitions, in_scope
from kfbot.search.rewrites import syntax as sx
from kfbot.search.rewrites.files import CUDA_SUFFIXES, cuda_literal
from kfbot.search.rewrites.syntax import Target

FAST_MATH_FLAG = "--use_fast_math"
# kfbot's float32 tolerance when a task declares none (kfbot.evaluate.verdict.compare, which
# imports torch and so cannot be read from the search process).
DEFAULT_RTOL = 1e-4
MARGIN = 8.0  # the tolerance must hold this many times an intrinsic's error
ULP = 2.0 ** -23  # relative spacing of float32 numbers near 1
# Worst error in units of the last place over the arguments kernels usually pass:
# __expf is 2 + floor(1.173 * |x|) ulp (|x| <= 16 here: the shifted logits of a
# softmax); __logf, __sinf and __cosf are exact to 2^-21.41 absolute near their usual
# range (4 ulp is a relative reading of that); __fdividef is 2 ulp; rsqrtf 2 ulp.
INTRINSICS: dict[str, tuple[str, float]] = {  # call -> (intrinsic, worst ulp)
    "expf": ("__expf", 20.0),
    "logf": ("__logf", 4.0),
    "sinf": ("__sinf", 4.0),
    "cosf": ("__cosf", 4.0),
}
DIVIDE_ULP = 2.0
RSQRT_ULP = 2.0
_OVERLOADED = {"exp": "expf", "log": "logf", "sin": "sinf", "cos": "cosf"}  # on a float
_FLOAT_CALLS = frozenset({
    "expf", "logf", "sinf", "cosf", "tanf", "tanhf", "sqrtf", "rsqrtf", "fabsf", "fmaxf",
    "fminf", "powf", "exp2f", "log2f", "log1pf", "expm1f", "erff", "fmaf", "floorf", "ceilf",
    "__expf", "__logf", "__sinf", "__cosf", "__fdividef", "__frcp_rn", "__fsqrt_rn",
    "__int2float_rn", "__half2float", "__bfloat162float"})
_MAX_PASSES = 16  # nested divisions are rewritten from the inside out, one level a pass


def allowed(ulps: float, target: Target) -> bool:
    rtol = DEFAULT_RTOL if target.rtol is None else target.rtol
    return rtol >= MARGIN * ulps * ULP


def fast_math_intrinsics(source: str, target: Target) -> str | None:
    current = source
    for _ in range(_MAX_PASSES):
        src = current.encode()
        edits = list(_edits(src, sx.parse(current), target))
        if not edits:
            break
        current = sx.splice(src, edits).decode()
    return current if current != source else None


def _edits(src: bytes, root: sx.Node, target: Target) -> Iterator[sx.Edit]:
    """One pass: renamed calls, then the divisions that hold no other division."""
    scope = in_scope(definitions([("", src.decode())]), target.kernel)
    for fn in sx.functions(root, sx.DEVICE_FN):
        if sx.fn_name(fn) not in scope:
            continue
        types = _Types(fn)
        renames = list(_renames(fn, types, target))
        if renames:
            yield from renames
            continue  # divisions next pass: a rename inside one would overlap it
        yield from _divisions(fn, types, target)


def _renames(fn: sx.Node, types: _Types, target: Target) -> Iterator[sx.Edit]:
    for node in sx.walk(fn):
        if node.type != "call_expression":
            continue
        callee = sx.field(node, "function")
        args = sx.named(sx.field(node, "arguments") or node)
        name = sx.text(callee)
        if callee is None or callee.type != "identifier":
            continue
        if name in _OVERLOADED and len(args) == 1 and types.is_float(args[0]):
            name = _OVERLOADED[name]
        if name in INTRINSICS and allowed(INTRINSICS[name][1], target):
            yield callee.start_byte, callee.end_byte, INTRINSICS[name][0].encode()


def _divisions(fn: sx.Node, types: _Types, target: Target) -> Iterator[sx.Edit]:
    for node in sx.walk(fn):
        if node.type != "binary_expression" or sx.text(sx.field(node, "operator")) != "/":
            continue
        left, right = sx.field(node, "left"), sx.field(node, "right")
        if left is None or right is None or any(
                n.type == "binary_expression" and sx.text(sx.field(n, "operator")) == "/"
                for side in (left, right) for n in sx.walk(side)):
            continue  # the inner division goes first
        new = _division(left, right, types, target)
        if new is not None:
            yield node.start_byte, node.end_byte, new.encode()


def _division(left: sx.Node, right: sx.Node, types: _Types, target: Target) -> str | None:
    inner = sx.strip(right) if right.type == "parenthesized_expression" else right
    root_arg = _sqrtf_argument(inner)
    if _is_one(left) and root_arg is not None and allowed(RSQRT_ULP, target):
        return f"rsqrtf({root_arg})"
    if root_arg is not None and types.is_float(left) and allowed(RSQRT_ULP, target):
        return f"{sx.text(left)} * rsqrtf({root_arg})"
    if _is_one(left) and types.is_float(right):
        return f"__frcp_rn({sx.text(right)})"  # correctly rounded: always within tolerance
    if types.is_float(left) and types.is_float(right) and allowed(DIVIDE_ULP, target):
        return f"__fdividef({sx.text(left)}, {sx.text(right)})"
    return None


def _sqrtf_argument(node: sx.Node) -> str | None:
    if node.type != "call_expression" or sx.text(sx.field(node, "function")) != "sqrtf":
        return None
    args = sx.named(sx.field(node, "arguments") or node)
    return sx.text(args[0]) if len(args) == 1 else None


def _is_one(node: sx.Node) -> bool:
    return sx.text(node).lower() in ("1.0f", "1.f")


class _Types:
    """The declared float scalars and float pointers/arrays of one function."""

    def __init__(self, fn: sx.Node) -> None:
        seen: dict[str, list[str]] = {}
        for node in sx.walk(fn):
            if node.type not in ("parameter_declaration", "declaration"):
                continue
            base = sx.text(sx.field(node, "type"))
            for decl in node.children_by_field_name("declarator"):
                kind, name = _declarator(decl)
                seen.setdefault(name, []).append(f"{base}{kind}")
        self.kinds = {k: v[0] for k, v in seen.items() if len(set(v)) == 1}

    def is_float(self, node: sx.Node) -> bool:
        t = node.type
        if t == "number_literal":
            return sx.text(node).lower().endswith("f") and not sx.text(node).lower() \
                .startswith("0x")
        if t == "identifier":
            return self.kinds.get(sx.text(node)) == "float"
        if t == "subscript_expression":
            base = sx.field(node, "argument")
            return base is not None and base.type == "identifier" \
                and self.kinds.get(sx.text(base)) in ("float*", "float[]")
        if t == "call_expression":
            return sx.text(sx.field(node, "function")) in _FLOAT_CALLS
        if t == "parenthesized_expression":
            inner = sx.named(node)
            return len(inner) == 1 and self.is_float(inner[0])
        if t == "unary_expression" and sx.text(sx.field(node, "operator")) in ("-", "+"):
            arg = sx.field(node, "argument")
            return arg is not None and self.is_float(arg)
        if t == "cast_expression":
            return sx.text(sx.field(node, "type")) == "float"
        if t == "binary_expression" and sx.text(sx.field(node, "operator")) in "+-*/":
            left, right = sx.field(node, "left"), sx.field(node, "right")
            return left is not None and right is not None and self.is_float(left) \
                and self.is_float(right)
        return False


def _declarator(decl: sx.Node) -> tuple[str, str]:
    """('' | '*' | '[]', name) of a declarator; ('?', name) for anything else."""
    if decl.type == "init_declarator":
        decl = sx.field(decl, "declarator") or decl
    if decl.type == "identifier":
        return "", sx.text(decl)
    inner = sx.field(decl, "declarator")
    if decl.type == "pointer_declarator" and inner is not None and inner.type == "identifier":
        return "*", sx.text(inner)
    if decl.type == "array_declarator" and inner is not None and inner.type == "identifier":
        return "[]", sx.text(inner)
    return "?", sx.text(inner or decl)


def fast_math_flags(files: Mapping[str, str], params: Mapping[str, str]) -> dict[str, str] | None:
    current = params.get(NVCC_FLAGS_PARAM, "")
    if "use_fast_math" in current:
        return None
    has_kernel = False
    for path, content in files.items():
        if path.endswith(".py"):
            if _python_mentions_fast_math(content):
                return None
            found = cuda_literal(content)
            has_kernel = has_kernel or (found is not None and _has_kernel(found[4]))
        elif path.endswith(CUDA_SUFFIXES):
            has_kernel = has_kernel or _has_kernel(content)
    if not has_kernel:
        return None
    return {**params, NVCC_FLAGS_PARAM: f"{current} {FAST_MATH_FLAG}".strip()}


def _has_kernel(source: str) -> bool:
    return bool(sx.functions(sx.parse(source), sx.KERNEL_FN))


def _python_mentions_fast_math(content: str) -> bool:
    try:
        tree = ast.parse(content)
    except SyntaxError:
        return False
    return any(isinstance(n, ast.Constant) and isinstance(n.value, str)
               and "use_fast_math" in n.value and "__global__" not in n.value
               for n in ast.walk(tree))
