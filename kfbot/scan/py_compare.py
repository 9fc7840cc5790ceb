"""Comparisons of two tensors: `assert_close`-like calls and `(a - b).abs().max() < tol`."""

from __future__ import annotations

import ast
from dataclasses import dataclass

from kfbot.scan.py_scopes import Scope, ScopeIndex
from kfbot.scan.py_syntax import head_name

_COMPARE_FUNCS = frozenset({
    "torch.testing.assert_close", "torch.testing.assert_allclose", "torch.allclose",
    "torch.equal", "numpy.testing.assert_allclose", "numpy.testing.assert_array_almost_equal",
    "numpy.testing.assert_almost_equal", "numpy.testing.assert_array_equal", "numpy.allclose",
    "numpy.array_equal",
})
# The last names of the calls `_compare_call` accepts: a cheap first test for each call.
_COMPARE_LAST_NAMES = frozenset({q.rsplit(".", 1)[-1] for q in _COMPARE_FUNCS}
                                | {"allclose", "equal"})
_ACTUAL_KEYWORDS = ("actual", "input", "a", "x")
_EXPECTED_KEYWORDS = ("expected", "desired", "other", "b", "y")


@dataclass(frozen=True)
class Cmp:
    kind: str
    a: ast.expr
    b: ast.expr
    scope: Scope  # where `a` and `b` are evaluated
    line: int


def _operands(call: ast.Call) -> tuple[ast.expr, ast.expr] | None:
    keywords = {k.arg: k.value for k in call.keywords if k.arg}
    positional = [a for a in call.args if not isinstance(a, ast.Starred)]
    actual = positional[0] if positional else next(
        (keywords[k] for k in _ACTUAL_KEYWORDS if k in keywords), None)
    expected = positional[1] if len(positional) > 1 else next(
        (keywords[k] for k in _EXPECTED_KEYWORDS if k in keywords), None)
    return (actual, expected) if actual is not None and expected is not None else None


class CompareFinder:
    """The comparisons written in the scopes of one file."""

    def __init__(self, index: ScopeIndex) -> None:
        self.index = index

    def find(self, scope: Scope) -> list[Cmp]:
        """The comparisons written in `scope`, by line."""
        found: list[Cmp] = []
        for call in scope.calls:
            func = call.func
            # An attribute keeps its last name through `qualname`: most calls end here.
            if isinstance(func, ast.Attribute) and func.attr not in _COMPARE_LAST_NAMES:
                continue
            if c := self._compare_call(call, scope):
                found.append(c)
        found += [c for node in scope.compares if (c := self._abs_max_compare(node, scope))]
        return sorted(found, key=lambda c: c.line)

    def _compare_call(self, call: ast.Call, scope: Scope) -> Cmp | None:
        func = call.func
        # A bare name that was not imported stays as written (`qualname` keeps it), and
        # only `assert_close` is accepted bare.
        if isinstance(func, ast.Name) and func.id not in self.index.imports \
                and func.id != "assert_close":
            return None
        q = self.index.qualname(func) or ""
        if q == "assert_close":  # a bare name from a star import
            q = "torch.testing.assert_close"
        elif q.startswith("np."):  # `np` used without an import seen here
            q = "numpy." + q[3:]
        if q in _COMPARE_FUNCS:
            operands = _operands(call)
            return Cmp(q, *operands, scope, call.lineno) if operands else None
        if isinstance(func, ast.Attribute) and func.attr in ("allclose", "equal") \
                and call.args and head_name(func) not in self.index.imports:
            return Cmp(f"torch.{func.attr}", func.value, call.args[0], scope, call.lineno)
        return None

    def _abs_max_compare(self, node: ast.Compare, scope: Scope) -> Cmp | None:
        """`(a - b).abs().max() < tol`, either way round, in an assert, an if or anywhere."""
        if len(node.ops) != 1 or not isinstance(node.ops[0], (ast.Lt, ast.LtE, ast.Gt, ast.GtE)):
            return None
        for side in (node.left, node.comparators[0]):
            found = self._abs_max_diff(side, scope)
            if found is not None:
                return Cmp("abs-max-diff", found[0], found[1], found[2], node.lineno)
        return None

    def _follow(self, expr: ast.expr, scope: Scope) -> tuple[ast.expr, Scope]:
        for _ in range(3):
            if not isinstance(expr, ast.Name):
                break
            b = self.index.lookup(expr.id, scope, expr.lineno)
            if b is None or b.value is None:
                break
            expr, scope = b.value, b.scope
        return expr, scope

    def _abs_max_diff(self, expr: ast.expr,
                      scope: Scope) -> tuple[ast.expr, ast.expr, Scope] | None:
        expr, scope = self._follow(expr, scope)
        expr = self._strip_scalar(expr)
        if isinstance(expr, ast.BinOp) and isinstance(expr.op, ast.Div):  # relative error
            expr = self._strip_scalar(expr.left)
        inner = self._reduced(expr)
        if inner is None:
            return None
        inner, scope = self._follow(inner, scope)
        diff = self._abs_of(inner)
        if diff is None:
            return None
        diff, scope = self._follow(diff, scope)
        if isinstance(diff, ast.BinOp) and isinstance(diff.op, ast.Sub):
            return diff.left, diff.right, scope
        return None

    def _strip_scalar(self, expr: ast.expr) -> ast.expr:
        while isinstance(expr, ast.Call):
            func = expr.func
            if isinstance(func, ast.Attribute) and func.attr in ("item", "cpu", "float") \
                    and not expr.args:
                expr = func.value
            elif isinstance(func, ast.Name) and func.id == "float" and len(expr.args) == 1:
                expr = expr.args[0]
            else:
                break
        return expr

    def _reduced(self, expr: ast.expr) -> ast.expr | None:
        """x for `x.max()` / `x.amax()` / `torch.max(x)`."""
        if not isinstance(expr, ast.Call):
            return None
        func = expr.func
        if isinstance(func, ast.Attribute) and func.attr in ("max", "amax") and not expr.args \
                and self.index.qualname(func) not in ("torch.max", "torch.amax"):
            return func.value
        if self.index.qualname(func) in ("torch.max", "torch.amax") and len(expr.args) == 1:
            return expr.args[0]
        return None

    def _abs_of(self, expr: ast.expr) -> ast.expr | None:
        if not isinstance(expr, ast.Call):
            return None
        func = expr.func
        if isinstance(func, ast.Attribute) and func.attr == "abs" and not expr.args \
                and self.index.qualname(func) != "torch.abs":
            return func.value
        if self.index.qualname(func) in ("torch.abs", "abs") and len(expr.args) == 1:
            return expr.args[0]
        return None
