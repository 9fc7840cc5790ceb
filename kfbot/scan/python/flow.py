"""Lists a setup script builds step by step, read without running it.

`setup.py` files build their flags and sources in several statements: a helper
returns `flags` after `flags.append("-gencode")` in a loop over architectures, `cc_flag`
grows under `if bare_metal_version >= Version("11.8")`, `sources += cuda_sources` only
`if use_cuda`. The statements that change one list are replayed in order: loops over
literal sequences are unrolled, a helper called with arguments is read with its
parameters bound to them, and a condition is decided where it can be:

* a static value decides it;
* a condition about HIP/ROCm is taken as false and one about CUDA being available as
  true, since kfbot builds for CUDA (said in `cannot_tell`);
* any other condition cannot be told: what it guards is kept, so that no flag is lost,
  and said in `cannot_tell` with its line.

Nothing is executed; a statement this cannot follow leaves the list as far as it got.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Callable
from dataclasses import dataclass

from kfbot.scan.python.scopes import MAX_DEPTH, Bind, Scope, ScopeIndex
from kfbot.scan.python.syntax import as_written, clip
from kfbot.scan.python.values import Evaluator

Item = tuple[ast.expr, Scope]
Note = Callable[[int, str], None]
_ROCM = re.compile(r"hip|rocm", re.I)
_CUDA = re.compile(r"cuda|CUDA_HOME|nvcc|gpu", re.I)
_SKIP = re.compile(r"skip|no_?cuda|disable", re.I)
_MAX_UNROLL = 64
# What a setup script may do when it is run: start programs, fetch, write or delete.
_EFFECTS = re.compile(r"^(?:subprocess\.\w+|os\.(?:system|popen|spawn\w*|exec\w*|remove|"
                      r"unlink|makedirs|rename)|shutil\.\w+|urllib\.\w+.*|requests\.\w+|"
                      r"exec|eval|compile|__import__|importlib\.import_module)$")


def import_effects(index: ScopeIndex) -> list[tuple[int, str]]:
    """(line, call) for the commands a build script runs when it is run, at module level
    or in a function its module level calls. The scan runs none of them: what they would
    compute cannot be told."""
    module = index.module
    scopes = [module] + [fn for call in module.calls
                         if (fn := index.local_function(call.func, module)) is not None]
    found: dict[int, str] = {}
    for scope in scopes:
        for call in scope.calls:
            name = index.qualname(call.func) or ""
            if _EFFECTS.match(name):
                found.setdefault(call.lineno, clip(as_written(call), 60))
    return sorted(found.items())


@dataclass
class Flow:
    """Replays the statements of one file that build a list (see module docstring)."""

    index: ScopeIndex
    values: Evaluator
    note: Note

    def decide(self, test: ast.expr, scope: Scope) -> bool | None:
        """True or False where the condition can be told or assumed, else None."""
        value = self.values.eval(test, scope)
        if isinstance(value, (bool, int, str)):
            return bool(value)
        text = as_written(test)
        if isinstance(test, ast.UnaryOp) and isinstance(test.op, ast.Not):
            inner = self.decide(test.operand, scope)
            return None if inner is None else not inner
        if _ROCM.search(text):
            self.note(test.lineno, f"`{clip(text, 60)}`: taken as false (a CUDA build, not "
                                   "ROCm)")
            return False
        if _CUDA.search(text):
            assumed = not _SKIP.search(text)
            self.note(test.lineno, f"`{clip(text, 60)}`: taken as {str(assumed).lower()} "
                                   "(CUDA is available where kfbot builds)")
            return assumed
        return None

    def returned(self, fn: Scope, depth: int) -> list[Item] | None:
        """The items of the list `fn` returns (its last `return`)."""
        node = fn.node
        if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) or not fn.returns:
            return None
        ret = fn.returns[-1]
        if isinstance(ret, ast.Name):
            return self.built(ret.id, node.body, fn, ret.lineno, depth + 1)
        return [(ret, fn)]

    def built(self, name: str, body: list[ast.stmt], scope: Scope, upto: int,
              depth: int) -> list[Item] | None:
        """The items of list variable `name` after the statements of `body` before
        line `upto`, or None when `name` is never assigned there."""
        if depth > MAX_DEPTH:
            return None
        replay = _Replay(self, name, scope, upto, depth)
        replay.block(body, scope)
        return replay.items

    def frame(self, fn: Scope, call: ast.Call, caller: Scope) -> Scope:
        """`fn`'s scope with its parameters bound to the arguments of `call`."""
        node = fn.node
        frame = Scope(fn.name, "function", parent=fn.parent, cls=fn.cls, node=node,
                      report=fn.report, binds=dict(fn.binds), calls=fn.calls,
                      returns=fn.returns)
        if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            return frame
        params = [a.arg for a in [*node.args.posonlyargs, *node.args.args]]
        bound = dict(zip(params, call.args, strict=False))
        bound.update({k.arg: k.value for k in call.keywords if k.arg in params})
        for param, value in bound.items():
            frame.binds[param] = [Bind(0, value, caller)]
        return frame


class _Replay:
    """One list variable followed through a block of statements."""

    def __init__(self, flow: Flow, name: str, scope: Scope, upto: int, depth: int) -> None:
        self.flow = flow
        self.name = name
        self.upto = upto
        self.depth = depth
        self.items: list[Item] | None = None
        self.scope = scope

    def block(self, body: list[ast.stmt], scope: Scope) -> None:
        for stmt in body:
            if stmt.lineno >= self.upto:
                return
            self.statement(stmt, scope)

    def statement(self, stmt: ast.stmt, scope: Scope) -> None:
        if isinstance(stmt, ast.Assign) and self._names(stmt.targets):
            self.items = self._elements(stmt.value, scope)
        elif isinstance(stmt, ast.AugAssign) and self._is_list(stmt.target) \
                and isinstance(stmt.op, ast.Add):
            self._extend(self._elements(stmt.value, scope))
        elif isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Call):
            self._method(stmt.value, scope)
        elif isinstance(stmt, ast.If):
            self._if(stmt, scope)
        elif isinstance(stmt, (ast.For, ast.AsyncFor)):
            self._for(stmt, scope)
        elif isinstance(stmt, (ast.With, ast.AsyncWith, ast.Try)):
            self.block(stmt.body, scope)

    def _names(self, targets: list[ast.expr]) -> bool:
        return any(self._is_list(t) for t in targets)

    def _is_list(self, target: ast.expr) -> bool:
        return isinstance(target, ast.Name) and target.id == self.name

    def _method(self, call: ast.Call, scope: Scope) -> None:
        func = call.func
        if not (isinstance(func, ast.Attribute) and self._is_list(func.value) and call.args):
            return
        if func.attr == "append":
            self._extend([(call.args[0], scope)])
        elif func.attr == "extend":
            self._extend(self._elements(call.args[0], scope))
        elif func.attr == "insert" and len(call.args) == 2:
            self._extend([(call.args[1], scope)])

    def _extend(self, items: list[Item] | None) -> None:
        self.items = [*(self.items or []), *(items or [])]

    def _if(self, stmt: ast.If, scope: Scope) -> None:
        taken = self.flow.decide(stmt.test, scope)
        if taken is None:
            before = len(self.items or [])
            self.block(stmt.body, scope)
            self.block(stmt.orelse, scope)
            if len(self.items or []) > before:
                self.flow.note(stmt.lineno, f"`{clip(as_written(stmt.test), 60)}` cannot be "
                                            f"told statically; what `{self.name}` gets under "
                                            "it (and its else) is kept")
            return
        self.block(stmt.body if taken else stmt.orelse, scope)

    def _for(self, stmt: ast.For | ast.AsyncFor, scope: Scope) -> None:
        values = self.flow.values.eval(stmt.iter, scope)
        if not isinstance(stmt.target, ast.Name) or not isinstance(values, tuple) \
                or len(values) > _MAX_UNROLL:
            self.block(stmt.body, scope)
            return
        elements = stmt.iter.elts if isinstance(stmt.iter, (ast.Tuple, ast.List)) else \
            [ast.copy_location(ast.Constant(value=v), stmt.iter) for v in values]
        for element in elements:
            inner = Scope("<loop>", "function", parent=scope, cls=scope.cls)
            inner.bind(stmt.target.id, Bind(0, element, scope))
            self.block(stmt.body, inner)

    def _elements(self, expr: ast.expr, scope: Scope) -> list[Item]:
        if isinstance(expr, (ast.List, ast.Tuple)):
            return [(e, scope) for e in expr.elts]
        if isinstance(expr, ast.BinOp) and isinstance(expr.op, ast.Add):
            return self._elements(expr.left, scope) + self._elements(expr.right, scope)
        if isinstance(expr, ast.Name) and expr.id == self.name:
            return list(self.items or [])
        return [(expr, scope)]
