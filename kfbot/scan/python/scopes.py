"""The scope and assignment model of one Python file, built by a single walk of its tree.

Each module, class and function is a `Scope` that records the calls, comparisons and
returns written in it and, per name, every `Bind` (assignment) made to it. Loops and
`pytest.mark.parametrize` bind a name to each of several alternatives (a group); a test
parameter named after a fixture of the file takes the fixture's returned value.
`ScopeIndex.lookup` answers which assignment a use of a name sees.
"""

from __future__ import annotations

import ast
import itertools
import posixpath
from dataclasses import dataclass, field
from operator import attrgetter
from typing import Literal

from kfbot.scan.python.syntax import dotted_endswith, dotted_name, known

MAX_DEPTH = 8  # how many assignments a name is followed through
MAX_ITEMS = 256  # list elements read from one expression

World = dict[int, int]  # parametrize/loop group -> chosen alternative

_LINE = attrgetter("line")  # sort keys
_POSITION = attrgetter("lineno", "col_offset")


@dataclass(eq=False, slots=True)
class Bind:
    """A name's value from one assignment; `alts` when it takes each of several values."""

    line: int
    value: ast.expr | None
    scope: Scope
    alts: tuple[tuple[ast.expr, Scope], ...] = ()
    group: int = 0


@dataclass(eq=False, slots=True)
class Scope:
    name: str
    kind: Literal["module", "class", "function"]
    parent: Scope | None = None  # where free names are looked up (classes are skipped)
    cls: Scope | None = None  # the class whose `self.x` attributes a method sees
    node: ast.AST | None = None
    report: Scope | None = None  # the top-level function or method it reports as
    is_test: bool = False
    binds: dict[str, list[Bind]] = field(default_factory=dict)
    funcs: dict[str, Scope] = field(default_factory=dict)
    calls: list[ast.Call] = field(default_factory=list)
    compares: list[ast.Compare] = field(default_factory=list)
    returns: list[ast.expr] = field(default_factory=list)
    asserts: list[ast.Assert] = field(default_factory=list)
    globals_: set[str] = field(default_factory=set)
    builds: list[str] = field(default_factory=list)

    def bind(self, key: str, b: Bind) -> None:
        self.binds.setdefault(key, []).append(b)


@dataclass(frozen=True)
class _Pending:
    """Names bound to the elements of a list, resolved once every assignment is known."""

    scope: Scope
    names: tuple[str, ...]
    source: ast.expr
    source_scope: Scope
    line: int
    mode: Literal["rows", "product", "zip"]


def _last_known(binds: list[Bind]) -> Bind | None:
    for b in reversed(binds):
        if b.value is not None or b.alts:
            return b
    return binds[-1] if binds else None


def _is_test_file(rel_path: str) -> bool:
    parts = rel_path.split("/")
    base = parts[-1]
    return (base.startswith("test_") or base.endswith("_test.py") or base in ("test.py",
                                                                              "tests.py")
            or any(p in ("tests", "test") for p in parts[:-1]))


def _target_names(target: ast.expr) -> tuple[str, ...] | None:
    if isinstance(target, ast.Name):
        return (target.id,)
    if isinstance(target, (ast.Tuple, ast.List)) and all(
            isinstance(e, ast.Name) for e in target.elts):
        return tuple(e.id for e in target.elts if isinstance(e, ast.Name))
    return None


def _item(value: ast.expr, i: int) -> ast.expr:
    """`value[i]`, placed where `value` is written."""
    index = ast.copy_location(ast.Constant(value=i), value)
    return ast.copy_location(ast.Subscript(value=value, slice=index, ctx=ast.Load()), value)


def _row(element: ast.expr, width: int) -> list[ast.expr] | None:
    """One parametrize row: a tuple, a list or `pytest.param(...)`."""
    if isinstance(element, ast.Call) and dotted_endswith(element.func, "param"):
        values = list(element.args)
    elif isinstance(element, (ast.Tuple, ast.List)):
        values = list(element.elts)
    else:
        return None
    return values if len(values) == width else None


def _unwrap_param(element: ast.expr) -> ast.expr:
    if (isinstance(element, ast.Call) and dotted_endswith(element.func, "param")
            and element.args):
        return element.args[0]
    return element


def _parametrize(dec: ast.expr) -> tuple[tuple[str, ...], ast.expr] | None:
    if not isinstance(dec, ast.Call) or not dotted_endswith(dec.func, "parametrize"):
        return None
    args = dict(zip(("argnames", "argvalues"), dec.args, strict=False))
    args.update({k.arg: k.value for k in dec.keywords if k.arg})
    names, values = args.get("argnames"), args.get("argvalues")
    if values is None:
        return None
    if isinstance(names, ast.Constant) and isinstance(names.value, str):
        found = tuple(s.strip() for s in names.value.split(",") if s.strip())
    elif isinstance(names, (ast.List, ast.Tuple)):
        found = tuple(e.value for e in names.elts
                      if isinstance(e, ast.Constant) and isinstance(e.value, str))
    else:
        return None
    return (found, values) if found else None


def _defaults(args: ast.arguments, positional: list[ast.arg]) -> dict[str, ast.expr]:
    """Parameter name -> its default value."""
    defaults = {p.arg: d for p, d in zip(
        positional[len(positional) - len(args.defaults):], args.defaults, strict=True)}
    defaults.update({p.arg: d for p, d in zip(args.kwonlyargs, args.kw_defaults,
                                              strict=True) if d is not None})
    return defaults


def _is_fixture(node: ast.AST | None) -> bool:
    if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
        return False
    for dec in node.decorator_list:
        target = dec.func if isinstance(dec, ast.Call) else dec
        if dotted_endswith(target, "fixture"):
            return True
    return False


# Nodes that hold nothing the index records; the walk does not visit them.
_LEAVES = frozenset({ast.Name, ast.Constant, ast.alias} | {
    cls for base in (ast.expr_context, ast.operator, ast.unaryop, ast.cmpop, ast.boolop)
    for cls in base.__subclasses__()})
_RECORDED = frozenset({ast.Compare, ast.Assign, ast.AnnAssign, ast.AugAssign, ast.NamedExpr,
                       ast.For, ast.AsyncFor, ast.With, ast.AsyncWith, ast.Import,
                       ast.ImportFrom, ast.Global, ast.Return, ast.Yield, ast.Assert})
# Nodes whose only child the walk visits is `value` and which record nothing themselves:
# the walk steps straight through them (`a.b.c` costs one step, not three).
_THROUGH = frozenset({ast.Attribute, ast.keyword, ast.Expr, ast.Starred, ast.Await})
# Fields that hold names, operators or annotations: nothing the index records.
_SKIPPED_FIELDS = frozenset({"ctx", "op", "ops", "id", "attr", "arg", "name", "names", "module",
                             "level", "asname", "conversion", "kind", "type_comment",
                             "is_async", "annotation", "returns", "type_ignores", "tag"})


def _node_classes(base: type[ast.AST]) -> set[type[ast.AST]]:
    """Every node class derived from `base`, at any depth."""
    found: set[type[ast.AST]] = set()
    for cls in base.__subclasses__():
        found |= {cls} | _node_classes(cls)
    return found


# Every node class the walk can meet -> the fields it descends into; `_WALKED` are the
# classes whose nodes it pushes (a type test is cheaper than `isinstance(v, ast.AST)`).
_CHILD_FIELDS: dict[type[ast.AST], tuple[str, ...]] = {
    cls: () if cls in _LEAVES else tuple(f for f in cls._fields if f not in _SKIPPED_FIELDS)
    for cls in _node_classes(ast.AST)}
_WALKED = frozenset(_CHILD_FIELDS) - _LEAVES - _THROUGH


class ScopeIndex:
    """Scopes, imports, classes and assignments of one file, and name lookup in them."""

    def __init__(self, rel_path: str, tree: ast.Module) -> None:
        self.rel_path = rel_path
        self.pydir = posixpath.dirname(rel_path)
        self.test_file = _is_test_file(rel_path)
        self.module = Scope("<module>", "module", node=tree)
        self.module.report = self.module
        self.scopes: list[Scope] = [self.module]
        self.imports: dict[str, str] = {}  # local name -> dotted name it refers to
        # Names imported more than once (`try: from .a import x` / `except: from .b import
        # x`): every dotted name each may refer to.
        self.alternatives: dict[str, list[str]] = {}
        self.import_lines: dict[str, int] = {}  # local name -> line of its (last) import
        self.star_imports: list[str] = []
        self.classes: dict[str, Scope] = {}
        self.function_names: set[str] = set()  # of every function defined in the file
        self.targets: dict[int, str] = {}  # id(call) -> the name its result is assigned to
        self._pending: list[_Pending] = []
        self._params: list[tuple[Scope, str, int]] = []  # parameters that may be fixtures
        self._groups = itertools.count(1)
        self._index(tree)

    def release(self) -> None:
        """Break the scope <-> binding cycles so the tree is freed as soon as the file is
        done; left to the cyclic collector, freeing costs more than the analysis."""
        for scope in self.scopes:
            scope.binds, scope.funcs = {}, {}
            scope.parent = scope.cls = scope.report = None
        self.scopes = []

    # --- indexing: one walk records scopes, names, calls and comparisons --------------

    def _index(self, tree: ast.Module) -> None:
        """Walk each scope's body; a nested function or class body is walked as a scope
        of its own once the enclosing body is done.

        This walk is most of the index's cost, so the children are pushed inline rather
        than by `ast.iter_child_nodes`: in field order, leaves left out and a node reached
        through `_THROUGH` nodes pushed in their place, so nodes are met in the same order.
        """
        bodies: list[tuple[list[ast.AST], Scope]] = [(list(tree.body), self.module)]
        while bodies:
            stack, scope = bodies.pop()
            calls, push = scope.calls, stack.append
            while stack:
                node = stack.pop()
                if type(node) is ast.Call:
                    calls.append(node)
                elif type(node) in _RECORDED:
                    self._record(node, scope)
                elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    inner = self._enter_function(node, scope)
                    stack.extend(self._evaluated_outside(node))
                    bodies.append((list(node.body), inner))
                    continue
                elif isinstance(node, ast.ClassDef):
                    inner = self._enter_class(node, scope)
                    stack.extend([*node.decorator_list, *node.bases])
                    bodies.append((list(node.body), inner))
                    continue
                for name in _CHILD_FIELDS[type(node)]:
                    value = getattr(node, name)
                    if type(value) is list:
                        for v in value:
                            while type(v) in _THROUGH:
                                v = v.value
                            if type(v) in _WALKED:
                                push(v)
                    else:
                        while type(value) in _THROUGH:
                            value = value.value
                        if type(value) in _WALKED:
                            push(value)
        self._finish()

    @staticmethod
    def _outer(scope: Scope) -> Scope:
        return (scope.parent or scope) if scope.kind == "class" else scope

    @staticmethod
    def _evaluated_outside(node: ast.FunctionDef | ast.AsyncFunctionDef) -> list[ast.expr]:
        defaults = [d for d in node.args.kw_defaults if d is not None]
        return [*node.decorator_list, *node.args.defaults, *defaults]

    def _enter_class(self, node: ast.ClassDef, scope: Scope) -> Scope:
        cls = Scope(node.name, "class", parent=scope, node=node, report=scope.report)
        cls.is_test = node.name.startswith("Test") or any(
            dotted_endswith(b, "TestCase") for b in node.bases)
        if scope.kind == "module":
            self.classes[node.name] = cls
        self.scopes.append(cls)
        return cls

    def _enter_function(self, node: ast.FunctionDef | ast.AsyncFunctionDef,
                        scope: Scope) -> Scope:
        in_class = scope.kind == "class"
        name = node.name if scope.kind == "module" else f"{scope.name}.{node.name}"
        fn = Scope(name, "function", parent=self._outer(scope),
                   cls=scope if in_class else scope.cls, node=node)
        fn.report = scope.report if scope.kind == "function" else fn
        fn.is_test = self.test_file and node.name.startswith("test") and (
            scope.kind == "module" or (in_class and scope.is_test))
        scope.funcs[node.name] = fn
        self.function_names.add(node.name)
        self.scopes.append(fn)
        self._bind_params(node, fn, scope)
        return fn

    def _bind_params(self, node: ast.FunctionDef | ast.AsyncFunctionDef, fn: Scope,
                     scope: Scope) -> None:
        args = node.args
        positional = [*args.posonlyargs, *args.args] if args.posonlyargs else args.args
        defaults = _defaults(args, positional) if args.defaults or args.kwonlyargs else {}
        decorators = node.decorator_list
        if scope.kind == "class" and isinstance(scope.node, ast.ClassDef):
            # class-level parametrize applies too
            decorators = [*decorators, *scope.node.decorator_list]
        outer = self._outer(scope)
        parametrized: set[str] = set()
        for dec in decorators:
            spec = _parametrize(dec)
            if spec is not None:
                self._pending.append(_Pending(fn, spec[0], spec[1], outer, node.lineno, "rows"))
                parametrized.update(spec[0])
        for p in [*positional, *args.kwonlyargs, args.vararg, args.kwarg]:
            if p is None or p.arg in parametrized:
                continue
            if p.arg in defaults:
                fn.bind(p.arg, Bind(node.lineno, known(defaults[p.arg]), outer))
            else:
                self._params.append((fn, p.arg, node.lineno))

    def _record(self, node: ast.AST, scope: Scope) -> None:
        # Most frequent first: this runs for every statement the index records.
        if isinstance(node, ast.Assign):
            self._assign(node.targets, node.value, scope, node)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            self._import(node)
        elif isinstance(node, (ast.Return, ast.Yield)):
            if node.value is not None:
                scope.returns.append(node.value)
        elif isinstance(node, ast.Compare):
            scope.compares.append(node)
        elif isinstance(node, (ast.With, ast.AsyncWith)):
            for item in node.items:
                if item.optional_vars is not None:
                    self._bind_target(item.optional_vars, item.context_expr, scope, node.lineno)
        elif isinstance(node, (ast.For, ast.AsyncFor)):
            self._loop(node, scope)
        elif isinstance(node, ast.AnnAssign):
            if node.value is not None:
                self._assign([node.target], node.value, scope, node)
        elif isinstance(node, ast.AugAssign):
            self._aug_assign(node, scope)
        elif isinstance(node, ast.NamedExpr):
            self._bind_target(node.target, node.value, scope, node.end_lineno or node.lineno)
        elif isinstance(node, ast.Global):
            scope.globals_.update(node.names)
        elif isinstance(node, ast.Assert):
            scope.asserts.append(node)

    def _assign(self, targets: list[ast.expr], value: ast.expr, scope: Scope,
                stmt: ast.stmt) -> None:
        # The end line: a use inside a multi-line assignment still sees the old value.
        line = stmt.end_lineno or stmt.lineno
        for target in targets:
            self._bind_target(target, value, scope, line)
        if isinstance(value, ast.Call) and (name := dotted_name(targets[0])):
            self.targets[id(value)] = name

    def _aug_assign(self, node: ast.AugAssign, scope: Scope) -> None:
        if not isinstance(node.target, ast.Name):
            return
        previous = ast.copy_location(ast.Name(id=node.target.id, ctx=ast.Load()), node)
        combined = ast.copy_location(ast.BinOp(left=previous, op=node.op, right=node.value), node)
        self._bind_target(node.target, combined, scope, node.end_lineno or node.lineno)

    def _bind_target(self, target: ast.expr, value: ast.expr | None, scope: Scope,
                     line: int) -> None:
        if isinstance(target, ast.Name):
            key = target.id if scope.kind != "class" else f"self.{target.id}"
            scope.bind(key, Bind(line, known(value), scope))
        elif isinstance(target, ast.Attribute):
            if isinstance(target.value, ast.Name) and target.value.id in ("self", "cls") \
                    and scope.cls is not None:
                scope.cls.bind(f"self.{target.attr}", Bind(line, known(value), scope))
        elif isinstance(target, (ast.Tuple, ast.List)):
            values: list[ast.expr | None] = [None] * len(target.elts)
            if isinstance(value, (ast.Tuple, ast.List)) and len(value.elts) == len(values) \
                    and not any(isinstance(e, ast.Starred) for e in value.elts):
                values = list(value.elts)
            elif isinstance(value, ast.Call):  # `out, res = op(x)`: each is a part of it
                values = [_item(value, i) for i in range(len(values))]
            for t, v in zip(target.elts, values, strict=True):
                self._bind_target(t, v, scope, line)
        elif isinstance(target, ast.Starred):
            self._bind_target(target.value, None, scope, line)

    def _loop(self, node: ast.For | ast.AsyncFor, scope: Scope) -> None:
        names = _target_names(node.target)
        if names is None:
            self._bind_target(node.target, None, scope, node.lineno)
            return
        mode: Literal["rows", "product", "zip"] = "rows"
        it = node.iter
        if isinstance(it, ast.Call) and len(names) > 1 and len(it.args) == len(names):
            last = (dotted_name(it.func) or "").rsplit(".", 1)[-1]
            mode = "product" if last == "product" else "zip" if last == "zip" else "rows"
        self._pending.append(_Pending(scope, names, it, scope, node.lineno, mode))

    def _import(self, node: ast.Import | ast.ImportFrom) -> None:
        if isinstance(node, ast.Import):
            for alias in node.names:
                top = alias.name.split(".")[0]
                self._imported(alias.asname or top, alias.name if alias.asname else top,
                               node.lineno)
            return
        base = "." * node.level + (node.module or "")
        for alias in node.names:
            if alias.name == "*":
                self.star_imports.append(base)
                continue
            full = f"{base}.{alias.name}" if node.module else f"{base}{alias.name}"
            self._imported(alias.asname or alias.name, full, node.lineno)

    def _imported(self, name: str, full: str, line: int) -> None:
        self.import_lines[name] = line
        old = self.imports.get(name)
        if old is not None and old != full:
            found = self.alternatives.setdefault(name, [old])
            if full not in found:
                found.append(full)
        self.imports[name] = full

    def _finish(self) -> None:
        for scope in self.scopes:
            for name in scope.globals_:
                for b in scope.binds.pop(name, []):
                    self.module.bind(name, b)
        for fn, name, line in self._params:
            fn.bind(name, self._fixture_bind(name, line) or Bind(line, None, fn))
        self._sort_binds(self.scopes)
        for p in self._pending:
            self._bind_pending(p)
        # Only the scopes the pending names were bound in changed since the first sort.
        self._sort_binds(list({id(p.scope): p.scope for p in self._pending}.values()))
        for scope in self.scopes:
            if len(scope.calls) > 1:
                scope.calls.sort(key=_POSITION)

    @staticmethod
    def _sort_binds(scopes: list[Scope]) -> None:
        for scope in scopes:
            for binds in scope.binds.values():
                if len(binds) > 1:
                    binds.sort(key=_LINE)

    def _fixture_bind(self, name: str, line: int) -> Bind | None:
        """A test parameter named after a fixture of this file takes its returned value."""
        fixture = self.module.funcs.get(name)
        if fixture is None or not _is_fixture(fixture.node) or not fixture.returns:
            return None
        return Bind(line, fixture.returns[0], fixture)

    def _bind_pending(self, p: _Pending) -> None:
        if p.mode != "rows" and isinstance(p.source, ast.Call):
            group = next(self._groups)
            for name, arg in zip(p.names, p.source.args, strict=True):
                elements = self._elements(arg, p.source_scope) or []
                g = group if p.mode == "zip" else next(self._groups)
                p.scope.bind(name, Bind(p.line, None, p.source_scope, tuple(elements), g))
            return
        elements = self._elements(p.source, p.source_scope) or []
        group = next(self._groups)
        if len(p.names) == 1:
            alts = tuple((_unwrap_param(e), s) for e, s in elements)
            p.scope.bind(p.names[0], Bind(p.line, None, p.source_scope, alts, group))
            return
        rows = [(_row(e, len(p.names)), s) for e, s in elements]
        for i, name in enumerate(p.names):
            alts = tuple((r[i] if r else ast.Constant(value=None), s) for r, s in rows)
            p.scope.bind(name, Bind(p.line, None, p.source_scope, alts, group))

    def _elements(self, expr: ast.expr, scope: Scope,
                  depth: int = 0) -> list[tuple[ast.expr, Scope]] | None:
        """The elements of a list written in the file, following names to it."""
        if depth > MAX_DEPTH:
            return None
        if isinstance(expr, (ast.List, ast.Tuple, ast.Set)):
            out: list[tuple[ast.expr, Scope]] = []
            for e in expr.elts:
                if isinstance(e, ast.Starred):
                    out += self._elements(e.value, scope, depth + 1) or []
                else:
                    out.append((e, scope))
            return out[:MAX_ITEMS]
        if isinstance(expr, ast.Name):
            b = self.lookup(expr.id, scope, expr.lineno)
            if b is not None and b.value is not None:
                return self._elements(b.value, b.scope, depth + 1)
        if isinstance(expr, ast.BinOp) and isinstance(expr.op, ast.Add):
            left = self._elements(expr.left, scope, depth + 1)
            right = self._elements(expr.right, scope, depth + 1)
            return left + right if left is not None and right is not None else None
        if isinstance(expr, ast.Call) and dotted_name(expr.func) in ("list", "tuple", "sorted") \
                and expr.args:
            return self._elements(expr.args[0], scope, depth + 1)
        return None

    # --- names ------------------------------------------------------------------

    def lookup(self, key: str, scope: Scope, line: int) -> Bind | None:
        """The assignment a use of `key` at `line` sees: locals before the line first."""
        if "." in key and key.startswith(("self.", "cls.")):
            holder = scope.cls
            binds = holder.binds.get("self." + key.split(".", 1)[1]) if holder else None
            return _last_known(binds) if binds else None
        s: Scope | None = scope
        while s is not None:
            binds = s.binds.get(key)
            if binds and s.kind == "module" and key in self.imports and all(
                    b.value is None and not b.alts for b in binds):
                return None  # `except ImportError: ext = None`: a run that works imported it
            if binds:
                if s is not scope:
                    return _last_known(binds)
                # The last one in the list made before the line, else the last one.
                for b in reversed(binds):
                    if b.line < line:
                        return b
                return binds[-1]
            s = s.parent
        return None

    def qualname(self, expr: ast.AST) -> str | None:
        """The dotted name with its first part replaced by what it was imported as."""
        if isinstance(expr, ast.Name):
            return self.imports.get(expr.id, expr.id)
        if isinstance(expr, ast.Attribute) and isinstance(expr.value, ast.Name):  # `a.b`
            head = expr.value.id
            return f"{self.imports.get(head, head)}.{expr.attr}"
        dotted = dotted_name(expr)
        if dotted is None:
            return None
        head, _, rest = dotted.partition(".")
        full = self.imports.get(head)
        if full is None:
            return dotted
        return f"{full}.{rest}" if rest else full

    def local_function(self, func: ast.expr, scope: Scope) -> Scope | None:
        if isinstance(func, ast.Name):
            if func.id not in self.function_names:  # most calls: no need to climb scopes
                return None
            s: Scope | None = scope
            while s is not None:
                if s.kind != "class" and func.id in s.funcs:
                    return s.funcs[func.id]
                s = s.parent
        elif isinstance(func, ast.Attribute) and isinstance(func.value, ast.Name) \
                and func.value.id in ("self", "cls") and scope.cls is not None:
            return scope.cls.funcs.get(func.attr)
        return None

    def local_class(self, func: ast.expr) -> Scope | None:
        return self.classes.get(func.id) if isinstance(func, ast.Name) else None
