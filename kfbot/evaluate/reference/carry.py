"""Carry a reference out of the test or script that holds it, with what it needs.

A reference expression such as `gelu_ref(x)` or `x * SCALE` names things the test
defines: a function in the test module or in a module of the repository it imports
from (a conftest, a `reference.py`), a constant, a lambda or a helper defined inside
the test function. The worker cannot import the test module (it may build or import
the extension at import time), so the definitions themselves are carried: each one
the expression needs, then each one those need, in an order that runs.

What is not carried, with the reason: a value made at random or by loading something
(`w = torch.randn(n)` in the test: the reference would see other values than the op),
anything that calls the op itself (then it is no independent reference), a local
module used as a whole (`import mypkg; mypkg.ref(x)`), and names found nowhere.
"""

from __future__ import annotations

import ast
import builtins
import symtable
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

_BUILTINS = frozenset(dir(builtins))
MAX_CARRIED = 60  # statements: past this the reference is the repository, not a function
# A call to one of these makes a value that differs from run to run, or builds and
# loads code: never a reference's constant.
_UNSTABLE = ("rand", "normal", "seed", "empty", "load", "bernoulli", "multinomial",
             "randperm", "uniform", "time", "perf_counter")


class NotCarried(Exception):
    """Why a reference cannot be carried; becomes the task's `Unusable` reason."""


@dataclass(frozen=True)
class Carried:
    imports: tuple[str, ...]  # import statements of packages outside the repository
    definitions: tuple[str, ...]  # statements to run after the imports, in order


@dataclass
class Scope:
    """Where names are looked up: a module of the repository, and inside it the
    function bodies around the op call (innermost first), cut at the call's line."""

    file: str  # repository path of the module
    module: ast.Module
    locals: list[list[ast.stmt]] = field(default_factory=list)


def carry(root: Path, scope: Scope, names: set[str], forbidden: set[str]) -> Carried:
    """The imports and definitions `names` need; NotCarried when they cannot be had.

    `forbidden` names the op as the test reaches it (`ext`, `fused_gelu`): a
    reference that needs it is the op compared with itself."""
    carrier = _Carrier(root, forbidden)
    for name in sorted(names):
        carrier.need(name, scope)
    return Carried(tuple(dict.fromkeys(carrier.imports)),
                   tuple(reversed(carrier.definitions)))


def module_scope(root: Path, file: str, call: ast.AST | None = None,
                 module: ast.Module | None = None) -> Scope:
    tree = module or ast.parse((root / file).read_bytes())
    scope = Scope(file, tree)
    if call is not None:
        scope.locals = _enclosing_bodies(tree, call)
    return scope


def _enclosing_bodies(tree: ast.Module, call: ast.AST) -> list[list[ast.stmt]]:
    """The bodies of the functions around `call`, innermost first, each cut at the
    statement holding the call (what runs after it cannot feed the reference)."""
    line = getattr(call, "lineno", 0)
    found: list[list[ast.stmt]] = []
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and \
                node.lineno <= line <= (node.end_lineno or line):
            found.append([s for s in _flat(node.body) if s.lineno <= line])
    return sorted(found, key=lambda body: -body[0].lineno if body else 0)


def _flat(body: Sequence[ast.stmt]) -> Iterator[ast.stmt]:
    """The statements of a body and of the blocks in it (if, with, try, for), but not
    of the functions and classes it defines."""
    for stmt in body:
        yield stmt
        if isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            continue
        for part in ("body", "orelse", "finalbody"):
            yield from _flat(getattr(stmt, part, []) or [])
        for handler in getattr(stmt, "handlers", []) or []:
            yield from _flat(handler.body)


class _Carrier:
    def __init__(self, root: Path, forbidden: set[str]) -> None:
        self.root = root
        self.forbidden = forbidden
        self.imports: list[str] = []
        self.definitions: list[str] = []
        self._done: set[tuple[str, str]] = set()
        self._modules: dict[str, Scope] = {}

    def need(self, name: str, scope: Scope) -> None:
        if name in _BUILTINS or (scope.file, name) in self._done:
            return
        self._done.add((scope.file, name))
        if name in self.forbidden:
            raise NotCarried(f"it calls the op itself ({name})")
        stmt, local = _binding(scope, name)
        if stmt is None:
            raise NotCarried(f"{name} is defined nowhere the test can see")
        if isinstance(stmt, (ast.Import, ast.ImportFrom)):
            self._imported(name, stmt, scope)
            return
        self._defined(name, stmt, scope, local)

    def _defined(self, name: str, stmt: ast.stmt, scope: Scope, local: bool) -> None:
        if isinstance(stmt, (ast.Assign, ast.AnnAssign, ast.AugAssign)):
            _stable_value(name, stmt, local)
        if len(self.definitions) >= MAX_CARRIED:
            raise NotCarried(f"it needs more than {MAX_CARRIED} definitions of the repository")
        # Unparsed, not cut out of the file: a statement from inside a function must run
        # at the top level, without its indentation.
        self.definitions.append(ast.unparse(stmt))
        for needed in sorted(_needs(self.definitions[-1])):
            self.need(needed, scope)

    def _imported(self, name: str, stmt: ast.Import | ast.ImportFrom, scope: Scope) -> None:
        if isinstance(stmt, ast.Import):
            alias = next(a for a in stmt.names if (a.asname or a.name.split(".")[0]) == name)
            if self._local_module(alias.name, scope, 0) is not None:
                raise NotCarried(f"it uses {alias.name}, a module of the repository, as a "
                                 "whole")
            self.imports.append(ast.unparse(ast.Import(names=[alias])))
            return
        alias = next(a for a in stmt.names if (a.asname or a.name) == name)
        local = self._local_module(stmt.module or "", scope, stmt.level)
        if local is None:
            if stmt.level:
                raise NotCarried(f"{name} comes from a relative import that is not a file "
                                 "of the repository")
            self.imports.append(ast.unparse(ast.ImportFrom(stmt.module, [alias], 0)))
            return
        if self._local_module(f"{stmt.module}.{alias.name}" if stmt.module else alias.name,
                              scope, stmt.level) is not None:
            raise NotCarried(f"it uses {alias.name}, a module of the repository, as a whole")
        # Definitions are run in the reverse order of their finding: the alias first
        # here, so that it runs after what it names.
        if alias.asname and alias.asname != alias.name:
            self.definitions.append(f"{alias.asname} = {alias.name}")
        self.need(alias.name, local)

    def _local_module(self, dotted: str, scope: Scope, level: int) -> Scope | None:
        """The repository file `dotted` names, seen from `scope`'s file."""
        here = (self.root / scope.file).parent
        parts = dotted.split(".") if dotted else []
        bases = [here.parents[level - 2] if level > 1 else here] if level else \
            [here, *here.parents]
        for base in bases:
            if not base.is_relative_to(self.root):
                continue
            for path in (base.joinpath(*parts).with_suffix(".py") if parts else None,
                         base.joinpath(*parts, "__init__.py")):
                if path is not None and path.is_file() and path.resolve().is_relative_to(
                        self.root.resolve()):
                    return self._module(path.relative_to(self.root).as_posix())
        return None

    def _module(self, rel: str) -> Scope:
        if rel not in self._modules:
            try:
                self._modules[rel] = module_scope(self.root, rel)
            except (OSError, SyntaxError, UnicodeDecodeError, ValueError) as exc:
                raise NotCarried(f"{rel} cannot be read: {exc}") from exc
        return self._modules[rel]


def _binding(scope: Scope, name: str) -> tuple[ast.stmt | None, bool]:
    """The last statement that binds `name` in the innermost scope that binds it, and
    whether that scope is a function's."""
    for body in scope.locals:
        found = _last_binding(body, name)
        if found is not None:
            return found, True
    return _last_binding(list(_flat(scope.module.body)), name), False


def _last_binding(body: Sequence[ast.stmt], name: str) -> ast.stmt | None:
    found = None
    for stmt in body:
        if name in _bound(stmt):
            found = stmt
    return found


def _bound(stmt: ast.stmt) -> set[str]:
    if isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
        return {stmt.name}
    if isinstance(stmt, ast.Import):
        return {a.asname or a.name.split(".")[0] for a in stmt.names}
    if isinstance(stmt, ast.ImportFrom):
        return {a.asname or a.name for a in stmt.names}
    targets: list[ast.expr] = []
    if isinstance(stmt, ast.Assign):
        targets = list(stmt.targets)
    elif isinstance(stmt, (ast.AnnAssign, ast.AugAssign)) and \
            (not isinstance(stmt, ast.AnnAssign) or stmt.value is not None):
        targets = [stmt.target]
    return {n.id for t in targets for n in ast.walk(t) if isinstance(n, ast.Name)}


def _stable_value(name: str, stmt: ast.Assign | ast.AnnAssign | ast.AugAssign,
                  local: bool) -> None:
    """A carried value must be the same every time it is made."""
    value = stmt.value
    calls = [n for n in ast.walk(value) if isinstance(n, ast.Call)] if value else []
    if isinstance(value, ast.Lambda):
        return
    if local and calls:
        raise NotCarried(f"{name} is a value the test computes ({ast.unparse(stmt)[:80]}), "
                         "which the op call does not pass")
    for call in calls:
        called = ast.unparse(call.func).lower()
        if any(word in called for word in _UNSTABLE):
            raise NotCarried(f"{name} is made by {ast.unparse(call.func)}, which gives other "
                             "values each time")


def _needs(source: str) -> set[str]:
    """The global names a snippet reads and does not bind itself."""
    top = symtable.symtable(source, "<carried>", "exec")
    needed: set[str] = set()
    tables = [top]
    while tables:
        table = tables.pop()
        if isinstance(table, symtable.Function):
            needed |= set(table.get_globals())
        else:
            needed |= {s.get_name() for s in table.get_symbols()
                       if s.is_referenced() and not s.is_assigned() and not s.is_imported()}
        tables.extend(table.get_children())
    return needed - _BUILTINS - _bound_at_top(source)


def _bound_at_top(source: str) -> set[str]:
    return {name for stmt in ast.parse(source).body for name in _bound(stmt)}


def expression_needs(expression: str, params: Sequence[str]) -> set[str]:
    """The global names `lambda <params>: <expression>` reads."""
    return _needs(f"lambda {', '.join(params)}: {expression}")
