"""The shapes and dtypes of the tensors an op is called with in a test.

The op's arguments are followed back to the `torch.randn(...)`-like calls that create
them; each parametrize/loop combination they depend on (up to a limit) gives one shape.
"""

from __future__ import annotations

import ast
import itertools

from kfbot.scan.python.scopes import MAX_DEPTH, Scope, ScopeIndex, World
from kfbot.scan.python.syntax import as_written, names_in, unique
from kfbot.scan.python.values import Dtype, Evaluator

_MAX_WORLDS = 32  # parametrize/loop combinations enumerated for shapes and dtypes

_DTYPE_METHODS = {"half": "float16", "float": "float32", "double": "float64",
                  "bfloat16": "bfloat16", "int": "int32", "long": "int64", "bool": "bool"}
# Methods that change dtype, device or copy a tensor but not its values or shape.
TENSOR_WRAPPERS = frozenset({"cuda", "to", "contiguous", "half", "float", "double",
                             "bfloat16", "requires_grad_", "detach", "clone", "cpu"})

_CREATION = frozenset({"torch.randn", "torch.rand", "torch.zeros", "torch.ones", "torch.empty",
                       "torch.full", "torch.randint", "torch.empty_strided"})
_LIKE = frozenset({"torch.randn_like", "torch.rand_like", "torch.zeros_like", "torch.ones_like",
                   "torch.empty_like", "torch.full_like", "torch.randint_like"})


def _fmt_shape(dims: list[str]) -> str:
    return "(" + ", ".join(dims) + ("," if len(dims) == 1 else "") + ")"


class InputReader:
    """Shapes and dtypes of an op call's input tensors in one file."""

    def __init__(self, index: ScopeIndex, values: Evaluator) -> None:
        self.index = index
        self.values = values

    def read(self, call: ast.Call, scope: Scope,
             fallback: Scope) -> tuple[tuple[str, ...], tuple[str, ...]]:
        """(shapes, dtypes) of `call`'s inputs; the tensors created in `fallback` stand in
        when the arguments do not lead to any."""
        dtypes: list[str] = []
        creations = self._creations(call, scope, dtypes)
        if not creations:  # inputs passed in another way: any tensor created in the test
            creations = [(c, fallback) for c in fallback.calls
                         if self.index.qualname(c.func) in _CREATION]
        shapes: list[str] = []
        for c, where in creations:
            shapes += self._shapes(c, where)
            dtype = next((k.value for k in c.keywords if k.arg == "dtype"), None)
            if dtype is not None:
                dtypes += self._dtypes(dtype, where)
        return unique(shapes), unique(dtypes)

    def _creations(self, call: ast.Call, scope: Scope,
                   dtypes: list[str]) -> list[tuple[ast.Call, Scope]]:
        """The torch.randn(...)-like calls that the op's arguments come from."""
        out: list[tuple[ast.Call, Scope]] = []
        args = [*call.args, *(k.value for k in call.keywords)]
        stack: list[tuple[ast.expr, Scope, int]] = [(a, scope, 0) for a in reversed(args)]
        seen: set[int] = set()
        while stack:
            expr, sc, depth = stack.pop()
            if isinstance(expr, ast.Name) and depth < 4:
                b = self.index.lookup(expr.id, sc, expr.lineno)
                if b is not None and b.value is not None and id(b) not in seen:
                    seen.add(id(b))
                    stack.append((b.value, b.scope, depth + 1))
            elif isinstance(expr, (ast.Tuple, ast.List)):
                stack += [(e, sc, depth) for e in reversed(expr.elts)]
            elif isinstance(expr, ast.BinOp):  # torch.randn(n) * 50.0
                stack += [(expr.right, sc, depth), (expr.left, sc, depth)]
            elif isinstance(expr, ast.Call):
                self._trace_call(expr, sc, depth, out, dtypes, stack)
        return out

    def _trace_call(self, call: ast.Call, scope: Scope, depth: int,
                    out: list[tuple[ast.Call, Scope]], dtypes: list[str],
                    stack: list[tuple[ast.expr, Scope, int]]) -> None:
        q = self.index.qualname(call.func) or ""
        if q in _CREATION:
            out.append((call, scope))
            return
        func = call.func
        if q in _LIKE and call.args:
            dtypes += [d for k in call.keywords if k.arg == "dtype"
                       for d in self._dtypes(k.value, scope)]
            stack.append((call.args[0], scope, depth))
        elif isinstance(func, ast.Attribute) and func.attr in TENSOR_WRAPPERS:
            if func.attr in _DTYPE_METHODS and not call.args:
                dtypes.append(_DTYPE_METHODS[func.attr])
            elif func.attr == "to":
                dtypes += [d for a in [*call.args, *(k.value for k in call.keywords)]
                           for d in self._dtypes(a, scope)]
            stack.append((func.value, scope, depth))

    def _dtypes(self, expr: ast.expr, scope: Scope) -> list[str]:
        out: list[str] = []
        for world in self._worlds([expr], scope):
            value = self.values.eval(expr, scope, world)
            if isinstance(value, Dtype) and value.name not in out:
                out.append(value.name)
        return out

    def _shapes(self, call: ast.Call, scope: Scope) -> list[str]:
        dims = self._shape_args(call)
        if not dims:
            return []
        out: list[str] = []
        for world in self._worlds(dims, scope):
            shape = self._shape_text(dims, scope, world)
            if shape is not None and shape not in out:
                out.append(shape)
        return out

    def _shape_args(self, call: ast.Call) -> list[ast.expr]:
        size = next((k.value for k in call.keywords if k.arg == "size"), None)
        if size is not None:
            return [size]
        if len(call.args) == 1 and isinstance(call.args[0], ast.Starred):
            return [call.args[0].value]  # torch.randn(*shape)
        positional = [a for a in call.args if not isinstance(a, ast.Starred)]
        q = self.index.qualname(call.func)
        if q in ("torch.full", "torch.empty_strided"):
            return positional[:1]
        if q == "torch.randint":
            return positional[-1:] if len(positional) >= 2 else []
        return positional

    def _shape_text(self, dims: list[ast.expr], scope: Scope, world: World) -> str | None:
        if len(dims) > 1:
            return _fmt_shape([self._dim(d, scope, world) for d in dims])
        seq = self._literal_seq(dims[0], scope, world, 0)
        if seq is not None:
            return _fmt_shape([self._dim(d, seq[1], world) for d in seq[0]])
        value = self.values.eval(dims[0], scope, world)
        if isinstance(value, int) and not isinstance(value, bool):
            return _fmt_shape([str(value)])
        if isinstance(value, tuple) and value and all(
                isinstance(v, int) and not isinstance(v, bool) for v in value):
            return _fmt_shape([str(v) for v in value])
        return None

    def _dim(self, expr: ast.expr, scope: Scope, world: World) -> str:
        if type(expr) is ast.Constant and type(expr.value) is int:  # most dimensions
            return str(expr.value)
        value = self.values.eval(expr, scope, world)
        if isinstance(value, int) and not isinstance(value, bool):
            return str(value)
        return as_written(expr, 40)

    def _literal_seq(self, expr: ast.expr, scope: Scope, world: World,
                     depth: int) -> tuple[list[ast.expr], Scope] | None:
        """The tuple/list literal a shape argument is written as, following names."""
        if depth > MAX_DEPTH:
            return None
        if isinstance(expr, (ast.Tuple, ast.List)):
            return list(expr.elts), scope
        if isinstance(expr, ast.Call) and self.index.qualname(expr.func) in (
                "torch.Size", "tuple", "list") and len(expr.args) == 1:
            return self._literal_seq(expr.args[0], scope, world, depth + 1)
        if not isinstance(expr, ast.Name):
            return None
        b = self.index.lookup(expr.id, scope, expr.lineno)
        if b is None:
            return None
        if b.alts:
            i = world.get(b.group)
            return None if i is None else self._literal_seq(*b.alts[i], world, depth + 1)
        return self._literal_seq(b.value, b.scope, world, depth + 1) if b.value else None

    def _worlds(self, exprs: list[ast.expr], scope: Scope) -> list[World]:
        """Every combination of the parametrize/loop alternatives the expressions use."""
        groups: dict[int, int] = {}
        stack = [(e, scope, 0) for e in exprs]
        while stack:
            expr, sc, depth = stack.pop()
            for node in names_in(expr):
                b = self.index.lookup(node.id, sc, node.lineno)
                if b is None:
                    continue
                if b.alts:
                    groups[b.group] = len(b.alts)
                elif b.value is not None and depth < 4:
                    stack.append((b.value, b.scope, depth + 1))
        keys = sorted(groups)
        combos = itertools.islice(itertools.product(*(range(groups[k]) for k in keys)),
                                  _MAX_WORLDS)
        return [dict(zip(keys, combo, strict=True)) for combo in combos]
