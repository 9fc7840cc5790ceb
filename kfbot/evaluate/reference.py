"""Turn a reference test found by the scan into a callable reference.

A test such as

    out = ext.softmax(x)
    torch.testing.assert_close(out, torch.softmax(x, dim=-1))

pairs the op call `ext.softmax(x)` with the expression `torch.softmax(x, dim=-1)`.
When every free name of the expression is an argument of the op call (or a name the
test module imports), the reference is `lambda x: torch.softmax(x, dim=-1)`, which
the worker can call on fresh inputs. Otherwise the candidate is compared with the
original kernel only, and the report says so.
"""

from __future__ import annotations

import ast
import builtins
from dataclasses import dataclass
from pathlib import Path

from kfbot.scan.model import ReferenceTest

_BUILTINS = frozenset(dir(builtins))


@dataclass(frozen=True)
class ReferenceSpec:
    """Source for the worker: `imports` run first, then `lambda` is evaluated."""

    source: str  # "lambda x, _a1: torch.softmax(x, dim=-1)"
    imports: tuple[str, ...]  # import statements from the test module it needs
    description: str  # "torch.softmax(x, dim=-1) from tests/test_ops.py:13"
    callable_ref: str | None = None  # "module:function" for declared references

    def to_json(self) -> dict[str, object]:
        return {
            "source": self.source,
            "imports": list(self.imports),
            "description": self.description,
            "callable_ref": self.callable_ref,
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
    return _lambda(module, ref, call)


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


def _lambda(module: ast.Module, ref: ReferenceTest, call: ast.Call) -> ReferenceSpec | Unusable:
    if call.keywords or any(isinstance(a, ast.Starred) for a in call.args):
        return Unusable(f"the op call {ast.unparse(call)} uses keywords or *args")
    params = [a.id if isinstance(a, ast.Name) else f"_a{i}" for i, a in enumerate(call.args)]
    if len(set(params)) != len(params):
        return Unusable(f"the op call {ast.unparse(call)} repeats an argument")
    expr = ast.parse(ref.reference or "", mode="eval").body
    imports = _imports(module)
    free = _free_names(expr) - set(params) - _BUILTINS
    missing = sorted(free - set(imports))
    if missing:
        return Unusable(
            f"the reference {ref.reference} uses {', '.join(missing)}, "
            "which the op call does not pass"
        )
    source = (
        f"lambda {', '.join(params)}: {ast.unparse(expr)}"
        if params
        else f"lambda: {ast.unparse(expr)}"
    )
    needed = tuple(dict.fromkeys(imports[name] for name in sorted(free)))
    return ReferenceSpec(
        source=source, imports=needed, description=f"{ref.reference} from {ref.file}:{ref.line}"
    )


def _free_names(expr: ast.expr) -> set[str]:
    bound = {a.arg for n in ast.walk(expr) if isinstance(n, ast.Lambda) for a in n.args.args}
    return {
        n.id for n in ast.walk(expr) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load)
    } - bound


def _imports(module: ast.Module) -> dict[str, str]:
    """Names bound by the module's top-level imports -> the statement that binds each."""
    found: dict[str, str] = {}
    for node in module.body:
        if isinstance(node, ast.Import):
            for alias in node.names:
                name = alias.asname or alias.name.split(".")[0]
                found[name] = ast.unparse(ast.Import(names=[alias]))
        elif isinstance(node, ast.ImportFrom) and node.level == 0:
            for alias in node.names:
                stmt = ast.ImportFrom(module=node.module, names=[alias], level=0)
                found[alias.asname or alias.name] = ast.unparse(stmt)
    return found
