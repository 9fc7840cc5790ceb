"""Reference tests: a comparison that pairs a bound op with a pure-PyTorch computation.

Each comparison's operands are followed back through assignments: the side that reaches
an op is the op under test, the other side is the reference when it is computed with
torch (or a local or imported reference function) alone. A comparison is reported
against its test function; one in a helper is reported against each test calling it.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass, field
from typing import Literal

from kfbot.scan.model import ReferenceTest
from kfbot.scan.python.compare import Cmp, CompareFinder
from kfbot.scan.python.inputs import TENSOR_WRAPPERS, InputReader
from kfbot.scan.python.ops import REFERENCE_NAME, WELL_KNOWN, Op, OpFinder
from kfbot.scan.python.scopes import MAX_DEPTH, Scope, ScopeIndex
from kfbot.scan.python.syntax import as_written, clip, dotted_name, head_name

# Calls into these count as a pure reference computation.
_REFERENCE_LIBS = frozenset({"torch", "numpy", "math", "einops", "scipy"})
_BUILTINS = frozenset({
    "abs", "all", "any", "bool", "dict", "enumerate", "float", "getattr", "hasattr", "int",
    "isinstance", "len", "list", "map", "max", "min", "pow", "print", "range", "reversed",
    "round", "set", "sorted", "str", "sum", "tuple", "type", "zip",
})
_RESULT_WRAPPERS = TENSOR_WRAPPERS | {"numpy", "item", "tolist"}
_ALLOC = frozenset({"torch.empty", "torch.empty_like", "torch.zeros", "torch.zeros_like",
                    "torch.empty_strided", "torch.full", "torch.full_like", "torch.ones",
                    "torch.ones_like"})
_ALLOC_METHODS = frozenset({"new_empty", "new_zeros", "new_full", "new_ones"})
_EXITS = frozenset({"sys.exit", "exit", "quit", "os._exit", "SystemExit"})


@dataclass
class _Side:
    """What one operand of a comparison computes."""

    ops: list[tuple[Op, bool]] = field(default_factory=list)  # (op, reached directly)
    evidence: bool = False  # some torch computation seen
    unknown: bool = False  # a call into something that is neither torch nor local

    @property
    def pure(self) -> bool:
        return self.evidence and not self.unknown and not any(d for _, d in self.ops)


@dataclass(frozen=True)
class _Pairing:
    op: Op
    reference: str | None
    confidence: float
    backward: bool = False


def _operand_children(node: ast.AST) -> list[ast.AST]:
    """The sub-expressions an operand's value flows from (calls and names handled apart)."""
    if isinstance(node, (ast.Attribute, ast.Subscript, ast.Starred)):
        return [node.value]
    if isinstance(node, ast.UnaryOp):
        return [node.operand]
    if isinstance(node, (ast.Tuple, ast.List)):
        return list(node.elts)
    if isinstance(node, ast.IfExp):
        return [node.body, node.orelse]
    return []


def _is_grad(expr: ast.expr) -> bool:
    """`x.grad` (through `.cpu()`-like wrappers) or a `torch.autograd.grad(...)` result."""
    while isinstance(expr, ast.Call) and isinstance(expr.func, ast.Attribute) \
            and expr.func.attr in _RESULT_WRAPPERS:
        expr = expr.func.value
    if isinstance(expr, ast.Subscript):
        expr = expr.value
    return isinstance(expr, ast.Attribute) and expr.attr == "grad"


def _import_kind(full: str) -> str:
    top = full.lstrip(".").split(".")[0]
    if top in _REFERENCE_LIBS:
        return "torch"
    if REFERENCE_NAME.search(full.rsplit(".", 1)[-1]):
        return "ref"
    return "neutral" if top in WELL_KNOWN else "unknown"


def _best(side: _Side) -> tuple[int, Op] | None:
    """The side's most convincing op: reached directly first, then resolved firmly."""
    best: tuple[int, Op] | None = None
    for op, direct in side.ops:
        score = 2 * direct + (op.confidence >= 0.9)
        if best is None or score > best[0]:
            best = (score, op)
    return best


class ReferenceFinder:
    """The reference tests of one file, with the shapes and dtypes they run the op on."""

    def __init__(self, index: ScopeIndex, ops: OpFinder, compares: CompareFinder,
                 inputs: InputReader) -> None:
        self.index = index
        self.ops = ops
        self.compares = compares
        self.inputs = inputs

    def find(self) -> list[ReferenceTest]:
        """The file's reference tests by line: per test and op, the most confident one."""
        callers = self._test_callers() if self.index.test_file else {}
        best: dict[tuple[str, str, bool], ReferenceTest] = {}
        for scope in self.index.scopes:
            if scope.kind == "class" or not (scope.calls or scope.compares):
                continue
            pairs = [(cmp, pairing) for cmp in self.compares.find(scope)
                     if (pairing := self._pair(cmp, scope)) is not None]
            if not pairs and not self.index.test_file:
                pairs = self._printed(scope)
            for cmp, pairing in pairs:
                for kind, test, where in self._attribution(scope, callers):
                    ref = self._reference(pairing, cmp, kind, test, where)
                    key = (test, ref.op, ref.backward)
                    old = best.get(key)
                    if old is None or ref.confidence > old.confidence:
                        best[key] = ref
        return sorted(best.values(), key=lambda r: (r.line, r.test, r.op))

    def _printed(self, scope: Scope) -> list[tuple[Cmp, _Pairing]]:
        """A script that prints the op's output and a reference's, and compares nothing:
        paired at a low confidence, "compares by printing"."""
        printed = [(call, arg) for call in scope.calls
                   if isinstance(call.func, ast.Name) and call.func.id == "print"
                   for arg in call.args]
        ops = [(call, arg, best[1]) for call, arg in printed
               if (best := _best(self._side(arg, scope))) is not None]
        refs = [(call, arg) for call, arg in printed if self._side(arg, scope).pure]
        if not ops or not refs:
            return []
        op_call, op_arg, op = ops[0]
        ref_call, ref_arg = refs[0]
        cmp = Cmp("print", op_arg, ref_arg, scope, max(op_call.lineno, ref_call.lineno))
        return [(cmp, _Pairing(op, self._ref_text(ref_arg, scope), min(op.confidence, 0.4)))]

    def _test_callers(self) -> dict[str, list[Scope]]:
        """Helper function name -> the test scopes that call it."""
        callers: dict[str, list[Scope]] = {}
        for scope in self.index.scopes:
            top = scope.report
            if scope.kind != "function" or top is None or not top.is_test:
                continue
            for call in scope.calls:
                if isinstance(call.func, ast.Attribute) and scope.cls is None:
                    continue  # an attribute names a local function only as `self.f` in a class
                fn = self.index.local_function(call.func, scope)
                if fn is not None and fn.report is fn and not fn.is_test:
                    tests = callers.setdefault(fn.name, [])
                    if top not in tests:
                        tests.append(top)
        return callers

    def _attribution(self, scope: Scope, callers: dict[str, list[Scope]]
                     ) -> list[tuple[Literal["pytest", "script"], str, Scope]]:
        """Which test (or script part) a comparison in `scope` belongs to.

        The third item is where input tensors are looked for when the op's arguments do
        not lead to them: a helper called by tests takes its inputs from those tests.
        """
        top = scope.report or scope
        if top.kind == "module":
            return [("script", "<module>", scope)]
        if top.is_test:
            return [("pytest", top.name, scope)]
        if top.name in callers:
            return [("pytest", test.name, test) for test in callers[top.name]]
        return [("script", top.name, scope)]

    def _reference(self, pairing: _Pairing, cmp: Cmp, kind: Literal["pytest", "script"],
                   test: str, scope: Scope) -> ReferenceTest:
        op = pairing.op
        shapes, dtypes = self.inputs.read(op.call, op.scope, scope)
        shown = clip(pairing.reference, 60) if pairing.reference else "an unclear reference"
        what = "the gradients of " if pairing.backward else ""
        via = "by printing both" if cmp.kind == "print" else f"via {cmp.kind}"
        why = f"{test} compares {what}{op.text} with {shown} {via}"
        if cmp.kind == "print":
            why = f"{why} (compares by printing)"
        return ReferenceTest(
            file=self.index.rel_path, line=cmp.line, test=test, kind=kind, op=op.text,
            op_name=op.name, module_hint=op.hint, reference=pairing.reference,
            comparison=cmp.kind, shapes=shapes, dtypes=dtypes, why=why,
            confidence=round(min(max(pairing.confidence, 0.0), 1.0), 2),
            target=op.target, mismatch_signal=self._signal(cmp, kind),
            backward=pairing.backward, helper=cmp.helper, atol=cmp.atol, rtol=cmp.rtol)

    def _signal(self, cmp: Cmp, kind: str) -> Literal["exception", "exit_status", "printed"]:
        """How a mismatch shows: raised (pytest, an assert), in the exit status (a script
        that exits non-zero) or only printed."""
        if cmp.kind == "print":
            return "printed"
        if kind == "pytest" or cmp.kind.startswith(("torch.testing", "numpy.testing")) \
                or any(a.lineno <= cmp.line <= (a.end_lineno or a.lineno)
                       for a in cmp.scope.asserts):
            return "exception"
        return "exit_status" if self._exits() else "printed"

    def _exits(self) -> bool:
        return any((self.index.qualname(call.func) or "") in _EXITS
                   for scope in self.index.scopes for call in scope.calls)

    # --- pairing an op with its reference ----------------------------------------------

    def _pair(self, cmp: Cmp, scope: Scope) -> _Pairing | None:
        if _is_grad(cmp.a) or _is_grad(cmp.b):
            return self._pair_gradients(cmp, scope)
        a, b = self._side(cmp.a, cmp.scope), self._side(cmp.b, cmp.scope)
        best_a, best_b = _best(a), _best(b)
        if (best_a is None) != (best_b is None):
            # A buffer the op writes (`ext.f(x, out)`) is the op's side, over an op only
            # reached behind a helper on the other side.
            for out, found in ((cmp.a, best_a), (cmp.b, best_b)):
                op = self._out_param(out, cmp.scope) if found is None else None
                if op is not None and (best_a or best_b or (0, op))[0] < 2:
                    side = _Side(ops=[(op, True)], evidence=False)
                    pair = (side, (2 + (op.confidence >= 0.9), op))
                    return self._pair_ops(cmp, pair if out is cmp.a else (a, best_a),
                                          pair if out is cmp.b else (b, best_b))
        if best_a is not None or best_b is not None:
            return self._pair_ops(cmp, (a, best_a), (b, best_b))
        for out, other, other_expr in ((cmp.a, b, cmp.b), (cmp.b, a, cmp.a)):
            op = self._out_param(out, cmp.scope)
            if op is not None:  # `ext.f(x, out)` writes `out`, which is then compared
                confidence = op.confidence - 0.1 if other.pure else 0.5
                return _Pairing(op, self._ref_text(other_expr, cmp.scope), confidence)
        # Neither operand is seen to come from an op: in a test, one called before the
        # comparison is taken to be what it checks; elsewhere (a library's wrapper that
        # checks its inputs before calling the op) such a comparison checks nothing of it.
        ops = [op for op in self._scope_ops(scope) if op.call.lineno <= cmp.line]
        if not ops or not self.index.test_file:
            return None
        # An op is called here, but neither operand is seen to come from it.
        ref_expr = cmp.b if b.pure else cmp.a if a.pure else None
        ref = self._ref_text(ref_expr, cmp.scope) if ref_expr is not None else None
        return _Pairing(ops[0], ref, 0.5)

    def _pair_gradients(self, cmp: Cmp, scope: Scope) -> _Pairing | None:
        """`check(x.grad, x_ref.grad)` after `op(x).sum().backward()`: the op's backward
        pass is what the comparison checks."""
        ops = self._scope_ops(scope)
        if not ops:
            return None
        ref = cmp.a if _is_grad(cmp.b) and not _is_grad(cmp.a) else cmp.b
        return _Pairing(ops[0], self._ref_text(ref, cmp.scope),
                        max(ops[0].confidence - 0.2, 0.5), backward=True)

    def _pair_ops(self, cmp: Cmp, a: tuple[_Side, tuple[int, Op] | None],
                  b: tuple[_Side, tuple[int, Op] | None]) -> _Pairing:
        (side_a, best_a), (side_b, best_b) = a, b
        tie = best_a is not None and best_b is not None and best_a[0] == best_b[0]
        if best_b is None or (best_a is not None and best_a[0] >= best_b[0]):
            chosen, ref_side, ref_expr = best_a, side_b, cmp.b
        else:
            chosen, ref_side, ref_expr = best_b, side_a, cmp.a
        if chosen is None:  # unreachable: the caller saw at least one op
            raise ValueError("no op on either side")
        score, op = chosen
        confidence = op.confidence if ref_side.pure and not tie else 0.5
        if score < 2:  # the op was only found behind a name passed to another call
            confidence = min(confidence, op.confidence - 0.1)
        return _Pairing(op, self._ref_text(ref_expr, cmp.scope), confidence)

    def _side(self, expr: ast.expr, scope: Scope) -> _Side:
        """Ops and torch calls an operand is computed from, following assignments.

        A name passed as an argument is followed too, but what is found behind it is
        marked indirect: `torch.softmax(x)` is a reference even if `x` came from a helper.
        """
        side = _Side()
        stack: list[tuple[ast.AST, Scope, bool, bool, int]] = [(expr, scope, True, False, 0)]
        seen: set[int] = set()
        while stack:
            node, sc, direct, in_arg, depth = stack.pop()
            if isinstance(node, ast.Call):
                self._side_call(node, sc, direct, in_arg, depth, side, stack)
            elif isinstance(node, ast.Name):
                if depth >= 4:
                    continue
                b = self.index.lookup(node.id, sc, node.lineno)
                if b is not None and b.value is not None and id(b) not in seen:
                    seen.add(id(b))
                    stack.append((b.value, b.scope, direct and not in_arg, False, depth + 1))
            elif isinstance(node, ast.BinOp):
                side.evidence = True
                stack += [(node.right, sc, direct, in_arg, depth),
                          (node.left, sc, direct, in_arg, depth)]
            else:
                stack += [(c, sc, direct, in_arg, depth) for c in _operand_children(node)]
        return side

    def _side_call(self, call: ast.Call, scope: Scope, direct: bool, in_arg: bool,
                   depth: int, side: _Side,
                   stack: list[tuple[ast.AST, Scope, bool, bool, int]]) -> None:
        op = self.ops.op_of_call(call, scope)
        if op is not None:
            side.ops.append((op, direct))
            return
        kind = self._call_kind(call, scope)
        if kind in ("torch", "ref"):
            side.evidence = True
        elif kind == "unknown" and direct and not in_arg:
            side.unknown = True
        args = [*call.args, *(k.value for k in call.keywords)]
        # A literal argument (`atol=1e-3`) computes nothing: it is not pushed at all.
        stack += [(a, scope, direct, True, depth) for a in reversed(args)
                  if not isinstance(a, ast.Constant)]
        if isinstance(call.func, ast.Attribute):
            stack.append((call.func.value, scope, direct, in_arg, depth))

    def _call_kind(self, call: ast.Call, scope: Scope) -> str:
        """torch (a torch/numpy computation or tensor method), ref (a local pure function
        or an imported reference), neutral (a builtin or utility library) or unknown."""
        func = call.func
        fn = self.index.local_function(func, scope)
        if fn is not None:
            return "ref" if self.ops.first_op(fn) is None else "unknown"
        if isinstance(func, ast.Name):
            if func.id in self.index.classes:
                return "ref"
            b = self.index.lookup(func.id, scope, func.lineno)
            if b is not None:
                return "torch" if b.value is not None and self._torchy(b.value, b.scope) \
                    else "unknown"
            full = self.index.imports.get(func.id)
            if full is None:
                return "neutral" if func.id in _BUILTINS else "unknown"
            return _import_kind(full)
        if isinstance(func, ast.Attribute):
            head = head_name(func)
            if head is not None and head in self.index.imports \
                    and self.index.lookup(head, scope, func.lineno) is None:
                return _import_kind(self.index.qualname(func) or "")
            return "torch"  # a method on a value: a tensor method in practice
        return "unknown"

    def _torchy(self, value: ast.expr, scope: Scope) -> bool:
        """A name bound to a torch module (`torch.nn.LayerNorm(8).cuda()`) or a lambda."""
        if isinstance(value, ast.Lambda):
            return not any(isinstance(n, ast.Call) and self.ops.op_of_call(n, scope, 1)
                           for n in ast.walk(value.body))
        while isinstance(value, ast.Call) and isinstance(value.func, ast.Attribute) \
                and isinstance(value.func.value, ast.Call):
            value = value.func.value
        if not isinstance(value, ast.Call):
            return False
        if self.index.local_class(value.func) is not None:
            return True
        return (self.index.qualname(value.func) or "").split(".")[0] in _REFERENCE_LIBS

    def _ref_text(self, expr: ast.expr, scope: Scope) -> str:
        """The reference as written, after the assignments and dtype/device moves."""
        for _ in range(MAX_DEPTH):
            if isinstance(expr, ast.Call) and isinstance(expr.func, ast.Attribute) \
                    and expr.func.attr in _RESULT_WRAPPERS:
                expr = expr.func.value
                continue
            if isinstance(expr, ast.Name):
                b = self.index.lookup(expr.id, scope, expr.lineno)
                if b is not None and b.value is not None:
                    expr, scope = b.value, b.scope
                    continue
            break
        if isinstance(expr, ast.Call) and self._call_kind(expr, scope) == "ref":
            name = dotted_name(expr.func)
            if name is not None:
                return name
        return as_written(expr)

    def _out_param(self, expr: ast.expr, scope: Scope) -> Op | None:
        while isinstance(expr, ast.Call) and isinstance(expr.func, ast.Attribute) \
                and expr.func.attr in _RESULT_WRAPPERS:
            expr = expr.func.value
        if not isinstance(expr, ast.Name):
            return None
        b = self.index.lookup(expr.id, scope, expr.lineno)
        if b is None or not isinstance(b.value, ast.Call) or not self._is_alloc(b.value):
            return None
        for op in self._scope_ops(scope):
            args = [*op.call.args, *(k.value for k in op.call.keywords)]
            if any(isinstance(a, ast.Name) and a.id == expr.id for a in args):
                return op
        return None

    def _is_alloc(self, call: ast.Call) -> bool:
        if self.index.qualname(call.func) in _ALLOC:
            return True
        return isinstance(call.func, ast.Attribute) and call.func.attr in _ALLOC_METHODS

    def _scope_ops(self, scope: Scope) -> list[Op]:
        return [op for c in scope.calls if (op := self.ops.op_of_call(c, scope))]
