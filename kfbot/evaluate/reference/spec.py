"""Turn a reference test found by the scan into a callable reference.

A test such as

    out = ext.softmax(x)
    torch.testing.assert_close(out, torch.softmax(x, dim=-1))

pairs the op call `ext.softmax(x)` with the expression `torch.softmax(x, dim=-1)`.
The reference is `lambda x: torch.softmax(x, dim=-1)`, which the worker can call on
fresh inputs: the op call's arguments are its parameters, and every other name it
uses is carried with it (`kfbot.evaluate.reference.carry`): the test module's imports, and the
functions, lambdas and constants the test, its module or the repository's modules
it imports from define. When that cannot be done the candidate is compared with the
original kernel only, and every report says so.
"""

from __future__ import annotations

import ast
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kfbot.evaluate.reference.carry import NotCarried, carry, expression_needs, module_scope
from kfbot.paths import inside
from kfbot.scan.model import ReferenceTest


@dataclass(frozen=True)
class ReferenceSpec:
    """Source for the worker: `imports` run first, then `definitions`, then `source`
    (a lambda) is evaluated."""

    source: str  # "lambda x, _a1: torch.softmax(x, dim=-1)"
    imports: tuple[str, ...]  # import statements from the test module it needs
    description: str  # "torch.softmax(x, dim=-1) from tests/test_ops.py:13"
    callable_ref: str | None = None  # "module:function" for declared references
    definitions: tuple[str, ...] = ()  # carried statements: functions, constants
    # The test (file::function) or script it came from: it judges the calls that test
    # made, not another test's, whose literal arguments may differ.
    tests: tuple[str, ...] = ()
    # The wrapper the test calls ("fusedact:fused_gelu") when it is not the op: the
    # reference is over its arguments (see `kfbot.evaluate.capture.via`).
    outer: str | None = None
    # How the test compares ("torch.allclose"): what it accepts, kfbot accepts too,
    # and says where its own comparison would have been stricter.
    comparison: str = ""

    def to_json(self) -> dict[str, object]:
        return {
            "source": self.source,
            "imports": list(self.imports),
            "definitions": list(self.definitions),
            "description": self.description,
            "callable_ref": self.callable_ref,
            "tests": list(self.tests),
            "outer": self.outer,
            "comparison": self.comparison,
        }


@dataclass(frozen=True)
class Unusable:
    reason: str


def reference_spec(root: Path, ref: ReferenceTest) -> ReferenceSpec | Unusable:
    if ref.origin == "declared" and ref.reference:
        return ReferenceSpec(
            source="",
            imports=(),
            callable_ref=ref.reference,
            description=f"{ref.reference} (declared in {ref.file})",
        )
    if not ref.reference:
        return Unusable("the test names no reference expression")
    try:
        module = ast.parse((root / ref.file).read_bytes())
    except (OSError, SyntaxError, ValueError) as exc:
        return Unusable(f"{ref.file} cannot be read: {exc}")
    call = _op_call(module, ref)
    if call is None:
        return Unusable(f"the call {ref.op}(...) was not found in {ref.test}")
    return _lambda(root, module, ref, call)


def _op_call(module: ast.Module, ref: ReferenceTest) -> ast.Call | None:
    scope: ast.AST = _function(module, ref.test) or module
    calls = [
        n for n in ast.walk(scope) if isinstance(n, ast.Call) and ast.unparse(n.func) == ref.op
    ]
    calls.sort(key=lambda c: abs(c.lineno - ref.line))
    return calls[0] if calls else None


def _function(module: ast.Module, name: str) -> ast.AST | None:
    target = name.split(".")[-1]
    for node in ast.walk(module):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name == target:
            return node
    return None


def _lambda(
    root: Path, module: ast.Module, ref: ReferenceTest, call: ast.Call
) -> ReferenceSpec | Unusable:
    if call.keywords or any(isinstance(a, ast.Starred) for a in call.args):
        return Unusable(f"the op call {ast.unparse(call)} uses keywords or *args")
    params = [a.id if isinstance(a, ast.Name) else f"_a{i}" for i, a in enumerate(call.args)]
    if len(set(params)) != len(params):
        return Unusable(f"the op call {ast.unparse(call)} repeats an argument")
    parsed = _called(ast.parse(ref.reference or "", mode="eval").body, module, params)
    expr = _literals_as_parameters(parsed, call)
    source = f"lambda {', '.join(params)}: {expr}" if params else f"lambda: {expr}"
    # The op as the test reaches it; a torch op's root is torch itself, found by text.
    forbidden = set() if ref.op.startswith("torch.ops.") else {ref.op.split(".")[0]}
    try:
        carried = carry(root, module_scope(root, ref.file, call, module),
                        expression_needs(expr, params), forbidden)
    except NotCarried as exc:
        return Unusable(f"the reference {ref.reference} cannot be carried: {exc}")
    if ref.op.startswith("torch.ops.") and any(ref.op in d for d in (expr, *carried.definitions)):
        return Unusable(f"the reference {ref.reference} calls the op itself ({ref.op})")
    return ReferenceSpec(source=source, imports=carried.imports,
                         description=f"{ref.reference} from {ref.file}:{ref.line}",
                         definitions=carried.definitions, tests=(_test_id(ref),),
                         outer=outer_ref(root, ref), comparison=ref.comparison)


def outer_ref(root: Path, ref: ReferenceTest) -> str | None:
    """The wrapper the test calls, as a callable's reference ("pkg.mod:func"), from the
    scan's `target` ("pkg.mod.func"; ".ops.swiglu" beside the test: "ops:swiglu"); None
    when the test calls the op itself, held as a factory's result."""
    if not ref.target or _factory_attribute(root, ref):
        return None
    module, _, name = ref.target.lstrip(".").rpartition(".")
    return f"{module}:{name}" if module and name.isidentifier() else None


def _factory_attribute(root: Path, ref: ReferenceTest) -> bool:
    """Whether the test calls an attribute of what a function returns (`ext.matmul` with
    `ext = matmul_ops.load_ext()`, target "matmul_ops.load_ext.matmul"): the extension
    the factory builds, so the op itself, not a wrapper of it. Read from the repository's
    files: the longest prefix of the target that is a module there, then a function
    that module defines, followed by more names."""
    if not ref.target:
        return False
    relative = ref.target.startswith(".")
    base = (root / ref.file).parent if relative else root
    parts = ref.target.lstrip(".").split(".")
    for cut in range(len(parts) - 2, 0, -1):
        source = _module_file(root, base, parts[:cut])
        if source is None:
            continue
        try:
            tree = ast.parse(source.read_bytes())
        except (OSError, SyntaxError, ValueError):
            return False
        return any(isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))
                   and n.name == parts[cut] for n in tree.body)
    return False


def _module_file(root: Path, base: Path, names: list[str]) -> Path | None:
    """The repository's file of module `names` under `base`; never one a link leads to
    outside the repository."""
    path = base.joinpath(*names)
    for found in (path.with_suffix(".py"), path / "__init__.py"):
        if found.is_file() and inside(root, found):
            return found
    return None


def _called(expr: ast.expr, module: ast.Module, params: list[str]) -> ast.expr:
    """`swish_ref` named as the reference, a function the module defines, is that
    function called with the op's arguments (`ref = swish_ref(x)` compared later is
    named by its function)."""
    if not isinstance(expr, ast.Name):
        return expr
    defined = any(isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)) and n.name == expr.id
                  for n in ast.walk(module))
    if not defined:
        return expr
    return ast.Call(expr, [ast.Name(p, ast.Load()) for p in params], [])


def _test_id(ref: ReferenceTest) -> str:
    if ref.kind == "script":
        return ref.file
    return "::".join([ref.file, *ref.test.split(".")])


def _literals_as_parameters(expr: ast.expr, call: ast.Call) -> str:
    """`x * 2.5` for the call `op(x, 2.5)` is `x * _a1`: the reference follows the
    argument when other calls pass other values."""
    literals = {_literal(a): f"_a{i}" for i, a in enumerate(call.args) if _literal(a) is not None}

    class Swap(ast.NodeTransformer):
        def visit_UnaryOp(self, node: ast.UnaryOp) -> ast.expr:
            name = literals.get(_literal(node))
            if name:
                return ast.Name(name, ast.Load())
            self.generic_visit(node)
            return node

        def visit_Constant(self, node: ast.Constant) -> ast.expr:
            name = literals.get(_literal(node))
            return ast.Name(name, ast.Load()) if name else node

    return ast.unparse(Swap().visit(expr)) if literals else ast.unparse(expr)


def _literal(node: ast.expr) -> str | None:
    """A number, a negative number or a string, as text; None for anything else."""
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
        inner = _literal(node.operand)
        return f"-{inner}" if inner is not None else None
    if isinstance(node, ast.Constant) and isinstance(node.value, (int, float, str)) \
            and not isinstance(node.value, bool):
        return repr(node.value)
    return None


def belongs(spec: Mapping[str, Any], arity: int, nargs: int, tests: Sequence[str]) -> bool:
    """Whether the reference `spec` (as the worker gets it) judges a call with `nargs`
    arguments made by `tests`: a declared reference judges every call; one taken from
    a test, the calls of that test (pytest node ids carry parameters: `[...]`)."""
    if spec.get("callable_ref"):
        return True
    if arity != nargs:
        return False
    own = [str(t) for t in spec.get("tests") or []]
    if not own or not tests:
        return True
    return any(_same_test(t, s) for t in tests for s in own)


def _same_test(node: str, named: str) -> bool:
    """Whether pytest's node id `node` is the test the scan named `named` (relative to the
    task's folder), a parameter or method of it; pytest may root node ids at a folder
    above the task's (a pyproject.toml further up), so any tail of the path counts."""
    starts = [0, *(i + 1 for i, ch in enumerate(node.split("::")[0]) if ch == "/")]
    return any(tail == named or tail.startswith((f"{named}[", f"{named}::"))
               for tail in (node[start:] for start in starts))
