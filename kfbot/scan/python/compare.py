"""Comparisons of two tensors: `assert_close`-like calls, `(a - b).abs().max() < tol`,
and helpers that compare their arguments so.

A helper of the same file is read: `def allclose(a, b): return (a - b).abs().max() <= tol`
compares its first two parameters, so `allclose(op(x), ref(x))` compares those. A helper
from elsewhere (a conftest fixture `check`, an imported `assert_close_fn`) is taken by
its name here, and confirmed (or not) once the files are linked.
"""

from __future__ import annotations

import ast
import functools
import re
from dataclasses import dataclass

from kfbot.scan.python.scopes import Scope, ScopeIndex
from kfbot.scan.python.syntax import head_name

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
# Names of helpers that compare their first two arguments, found in real test suites:
# check, allclose, assert_close_fn, assert_equal, compare_tensors, verify_outputs.
HELPER_NAME = re.compile(
    r"^_*(?:assert_?|check_?|verify_?|compare_?)?(?:all_?close|close|equal|same|match|"
    r"tensors?|outputs?|results?)?(?:_fn|_tensors?|_outputs?)?$|^_*check$", re.I)
_REDUCTIONS = frozenset({"torch.max", "torch.amax", "torch.mean"})
_ASSERT_ORDER: dict[str, ast.cmpop] = {
    "assertLess": ast.Lt(), "assertLessEqual": ast.LtE(), "assertGreater": ast.Gt(),
    "assertGreaterEqual": ast.GtE()}
_UNWRAP = frozenset({"cpu", "float", "double", "detach", "contiguous", "flatten", "numpy",
                     "to", "cuda", "clone", "reshape", "view"})


@dataclass(frozen=True)
class Cmp:
    kind: str
    a: ast.expr
    b: ast.expr
    scope: Scope  # where `a` and `b` are evaluated
    line: int
    helper: str | None = None  # the helper compared through, "name (file:line)" if read
    atol: float | None = None  # the comparison's own tolerances, when written as numbers
    rtol: float | None = None


@functools.lru_cache(maxsize=4096)  # asked of every call of every scope: names repeat
def is_helper_name(name: str) -> bool:
    return bool(name) and HELPER_NAME.match(name) is not None and any(
        w in name.lower() for w in ("close", "check", "equal", "same", "compare", "verify",
                                    "match"))


# Where `allclose`-like functions take rtol and atol positionally (after the two operands).
_POSITIONAL_TOLERANCES = {"torch.allclose": ("rtol", "atol"), "numpy.allclose": ("rtol", "atol"),
                          "numpy.testing.assert_allclose": ("rtol", "atol")}


def _number(node: ast.expr | None) -> float | None:
    if isinstance(node, ast.Constant) and isinstance(node.value, (int, float)) \
            and not isinstance(node.value, bool) and node.value >= 0:
        return float(node.value)
    return None


def tolerances(call: ast.Call, name: str = "") -> tuple[float | None, float | None]:
    """(atol, rtol) a comparison call writes as numbers: keywords, or positions after the
    two operands for the functions that take them so."""
    found = {k.arg: _number(k.value) for k in call.keywords if k.arg in ("atol", "rtol")}
    for key, node in zip(_POSITIONAL_TOLERANCES.get(name, ()), call.args[2:], strict=False):
        found.setdefault(key, _number(node))
    return found.get("atol"), found.get("rtol")


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
        self._helpers: dict[int, tuple[int, int, str] | None] = {}

    def find(self, scope: Scope) -> list[Cmp]:
        """The comparisons written in `scope`, by line."""
        found: list[Cmp] = []
        for call in scope.calls:
            func = call.func
            name = func.attr if isinstance(func, ast.Attribute) else \
                func.id if isinstance(func, ast.Name) else ""
            if isinstance(func, ast.Name) and name in self.index.function_names \
                    and (c := self._local_helper_call(call, scope)):
                found.append(c)
                continue
            if name not in _COMPARE_LAST_NAMES and not is_helper_name(name):
                continue  # the cheap test first: most calls end here
            if c := self._compare_call(call, scope) or self._named_helper_call(call, scope):
                found.append(c)
        found += [c for node in scope.compares if (c := self._abs_max_compare(node, scope))]
        found += [c for call in scope.calls if (c := self._assert_less(call, scope))]
        return sorted(found, key=lambda c: c.line)

    def _assert_less(self, call: ast.Call, scope: Scope) -> Cmp | None:
        """`self.assertLess(err, tol)` (unittest) as `err < tol`."""
        func = call.func
        if not (isinstance(func, ast.Attribute) and func.attr in _ASSERT_ORDER
                and len(call.args) >= 2):
            return None
        compare = ast.copy_location(ast.Compare(left=call.args[0], ops=[_ASSERT_ORDER[func.attr]],
                                                comparators=[call.args[1]]), call)
        return self._abs_max_compare(compare, scope)

    def helper_params(self, fn: Scope) -> tuple[int, int, str] | None:
        """(i, j, kind) when function `fn` compares its parameters i and j."""
        key = id(fn)
        if key not in self._helpers:
            self._helpers[key] = None  # a helper calling itself compares nothing more
            self._helpers[key] = self._read_helper(fn)
        return self._helpers[key]

    def _read_helper(self, fn: Scope) -> tuple[int, int, str] | None:
        node = fn.node
        if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            return None
        params = [a.arg for a in [*node.args.posonlyargs, *node.args.args]]
        if params and params[0] in ("self", "cls"):
            params = params[1:]
        for cmp in self.find(fn):
            a, b = self._param(cmp.a, fn, params), self._param(cmp.b, fn, params)
            if a is not None and b is not None and a != b:
                return min(a, b), max(a, b), cmp.kind
        return None

    def _param(self, expr: ast.expr, fn: Scope, params: list[str]) -> int | None:
        for _ in range(4):
            while isinstance(expr, ast.Call) and isinstance(expr.func, ast.Attribute) \
                    and expr.func.attr in _UNWRAP:
                expr = expr.func.value
            if not isinstance(expr, ast.Name):
                return None
            if expr.id in params:
                return params.index(expr.id)
            b = self.index.lookup(expr.id, fn, expr.lineno)
            if b is None or b.value is None or b.scope is not fn:
                return None
            expr = b.value
        return None

    def _local_helper_call(self, call: ast.Call, scope: Scope) -> Cmp | None:
        fn = self.index.local_function(call.func, scope)
        if fn is None or fn is scope:
            return None
        found = self.helper_params(fn)
        if found is None or len(call.args) <= found[1]:
            return None
        i, j, kind = found
        node = fn.node
        line = node.lineno if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) else 0
        inner = next((c for c in self.find(fn) if c.atol is not None or c.rtol is not None), None)
        atol, rtol = tolerances(call)
        return Cmp(kind, call.args[i], call.args[j], scope, call.lineno,
                   helper=f"{fn.name} ({self.index.rel_path}:{line})",
                   atol=atol if atol is not None else inner.atol if inner else None,
                   rtol=rtol if rtol is not None else inner.rtol if inner else None)

    def _named_helper_call(self, call: ast.Call, scope: Scope) -> Cmp | None:
        """`check(out, ref)` with `check` from a conftest fixture or another module."""
        func = call.func
        name = func.attr if isinstance(func, ast.Attribute) else \
            func.id if isinstance(func, ast.Name) else ""
        positional = [a for a in call.args if not isinstance(a, ast.Starred)]
        if len(positional) < 2 or not is_helper_name(name) or \
                self.index.local_function(func, scope) is not None:
            return None
        return Cmp(name, positional[0], positional[1], scope, call.lineno, helper=name,
                   atol=tolerances(call)[0], rtol=tolerances(call)[1])

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
            atol, rtol = tolerances(call, q)
            return Cmp(q, *operands, scope, call.lineno, atol=atol, rtol=rtol) if operands \
                else None
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
        """x for `x.max()` / `x.amax()` / `x.mean()` / `torch.max(x)` / `torch.mean(x)`."""
        if not isinstance(expr, ast.Call):
            return None
        func = expr.func
        if isinstance(func, ast.Attribute) and func.attr in ("max", "amax", "mean") \
                and not expr.args and self.index.qualname(func) not in _REDUCTIONS:
            return func.value
        if self.index.qualname(func) in _REDUCTIONS and len(expr.args) == 1:
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
