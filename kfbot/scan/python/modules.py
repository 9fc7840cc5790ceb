"""What a Python file offers to the files that import it: its `PySymbol`s.

Tests seldom call an extension themselves: they call a package's wrapper, which calls
an autograd Function, whose `forward` calls the compiled module under another name,
in other files. Each file is read alone (in parallel, before any linking), so it can
only say where its own names lead, as import paths: `fused_gelu` calls
`.._autograd.GeluFunction.apply`; `_autograd` imports `_C` from `fusedact` as `ops`;
`GeluFunction.forward` calls `fusedact._C.gelu_fwd`. `graph` follows the paths
across files once every file is read.

Test files are not summarised (nothing imports a test module); conftest.py and helper
modules beside the tests are.
"""

from __future__ import annotations

import ast
import posixpath
import re

from kfbot.scan.model import PySymbol
from kfbot.scan.python.builds import BuildReader
from kfbot.scan.python.compare import CompareFinder
from kfbot.scan.python.scopes import Scope, ScopeIndex
from kfbot.scan.python.syntax import dotted_name
from kfbot.scan.python.values import Evaluator

MAX_TARGETS = 64  # paths kept per function
_CALL = ".__call__"  # calling an instance
# Methods of a torch module that return the module itself.
_SAME_OBJECT = frozenset({"cuda", "to", "eval", "train", "half", "float", "double", "cpu",
                          "requires_grad_", "bfloat16"})
# Methods of a call's result that only convert it: `op(x).float()` calls `op`.
_METHODS = frozenset({"float", "half", "double", "cpu", "cuda", "to", "detach", "clone",
                      "contiguous", "item", "tolist", "numpy", "view", "reshape"})
_PARTIAL = frozenset({"functools.partial", "partial"})
GET_KERNEL = re.compile(r"(?:^|\.)get_(?:local_)?kernel$")


def here(rel_path: str) -> str:
    """The relative import path of the file's own names: ".mod" (or "" in __init__.py)."""
    stem = posixpath.splitext(posixpath.basename(rel_path))[0]
    return "" if stem == "__init__" else f".{stem}"


def hub_package(repo_id: str) -> str:
    """`kernels.get_kernel("kernels-community/causal-conv1d")` loads the package
    `causal_conv1d` that a kernel-builder repository of that name builds."""
    return repo_id.rsplit("/", 1)[-1].replace("-", "_")


class Paths:
    """The import path a name or attribute chain of one file stands for."""

    def __init__(self, index: ScopeIndex, values: Evaluator, builds: BuildReader,
                 summarised: bool = True) -> None:
        self.index = index
        self.values = values
        self.builds = builds
        self.own = here(index.rel_path)
        self.summarised = summarised  # the file has symbols to route a path through

    def of(self, expr: ast.expr, scope: Scope, depth: int = 0) -> str | None:
        """`fusedact.ops.swiglu`, `.functional.fused_gelu`, ... or None: not a name
        that can lead out of the function (a local value, a literal, a call result)."""
        if isinstance(expr, ast.Attribute) and isinstance(expr.value, ast.Call):
            # `_ext().softmax`: an attribute of what a factory (or a class) returns
            made = self.of(expr.value.func, scope, depth + 1)
            return f"{made}.{expr.attr}" if made is not None else None
        dotted = dotted_name(expr)
        if dotted is None or depth > 3:
            return None
        head, _, rest = dotted.partition(".")
        tail = f".{rest}" if rest else ""
        if head in ("self", "cls"):
            cls = scope.cls
            return f"{self.own}.{cls.name}{tail}" if cls is not None and rest else None
        b = self.index.lookup(head, scope, getattr(expr, "lineno", 0))
        if b is not None:
            value = self.value(b.value, b.scope, depth + 1) if b.value is not None else None
            if value is not None and rest and value.endswith(_CALL):
                return value[: -len(_CALL)] + tail  # a method of an instance: `C.method`
            if value is not None:
                return value + tail
            # A module-level name the file's symbols describe (an extension it loads).
            described = b in self.index.module.binds.get(head, ())
            return f"{self.own}.{dotted}" if described else None
        if head in self.index.alternatives and self.summarised:
            return f"{self.own}.{dotted}"  # through the import symbol, to each alternative
        if head in self.index.imports:
            return self.index.imports[head] + tail
        if head in self.index.module.funcs or head in self.index.classes:
            return f"{self.own}.{dotted}"
        return None

    def value(self, value: ast.expr, scope: Scope, depth: int = 0) -> str | None:
        """The path a variable's value leads to: an alias, a partial, an instance."""
        if isinstance(value, (ast.Name, ast.Attribute)):
            return self.of(value, scope, depth)
        if not isinstance(value, ast.Call) or self.builds.kind(value) is not None:
            return None  # a build's module is an extension, described by the symbols
        func = value.func
        if isinstance(func, ast.Attribute) and func.attr in _SAME_OBJECT \
                and isinstance(func.value, ast.Call):
            return self.value(func.value, scope, depth + 1)  # `Layer(8).cuda()`: the layer
        q = self.index.qualname(value.func) or ""
        if q in _PARTIAL and value.args:
            return self.of(value.args[0], scope, depth)
        if GET_KERNEL.search(q) and value.args:
            repo = self.values.eval(value.args[0], scope)
            return hub_package(repo) if isinstance(repo, str) else None
        cls = self.of(value.func, scope, depth)
        return f"{cls}{_CALL}" if cls is not None else None


class SymbolReader:
    """The top-level symbols of one file (see module docstring)."""

    def __init__(self, index: ScopeIndex, paths: Paths, builds: BuildReader,
                 helpers: CompareFinder) -> None:
        self.index = index
        self.paths = paths
        self.builds = builds
        self.helpers = helpers
        self._bodies: dict[int, list[Scope]] = {}
        for scope in index.scopes:
            if scope.report is not None:
                self._bodies.setdefault(id(scope.report), []).append(scope)

    def read(self) -> list[PySymbol]:
        out: list[PySymbol] = []
        for name, full in self.index.imports.items():
            every = self.index.alternatives.get(name, [full])
            line = self.index.import_lines.get(name, 0)
            out.append(PySymbol(name, line, "import", tuple((f, line) for f in every)))
        module = self.index.module
        for name, binds in module.binds.items():
            symbol = self._variable(name, binds[-1].value, binds[-1].line)
            if symbol is not None:
                out.append(symbol)
        for fn in module.funcs.values():
            out.append(self._function(fn.name, fn))
        for cls in self.index.classes.values():
            out += self._class(cls)
        return out

    def _variable(self, name: str, value: ast.expr | None, line: int) -> PySymbol | None:
        if value is None:
            return None
        module = self.index.module
        if isinstance(value, ast.Call) and self.builds.kind(value) in ("load", "load_inline"):
            return PySymbol(name, line, "extension",
                            extension=self.builds.names.get(id(value)))
        q = self.index.qualname(value) or ""
        if q.startswith("torch.ops.") and q.count(".") == 2:
            return PySymbol(name, line, "extension", extension=q.split(".")[2])
        target = self.paths.value(value, module)
        return PySymbol(name, line, "variable", ((target, line),)) if target else None

    def _function(self, name: str, fn: Scope) -> PySymbol:
        targets: dict[str, int] = {}
        for scope in self._body(fn):
            for call in scope.calls:
                for entry, at in self._dispatched(call.func, scope):
                    targets.setdefault(entry, at)
                for expr in (call.func, *call.args, *(k.value for k in call.keywords)):
                    if isinstance(expr, (ast.Name, ast.Attribute)) and not (
                            expr is call.func and isinstance(expr, ast.Attribute)
                            and isinstance(expr.value, ast.Call) and expr.attr in _METHODS):
                        path = self.paths.of(expr, scope)
                        if path is not None:
                            targets.setdefault(path, expr.lineno)
            for ret in scope.returns:
                path = self.paths.of(ret, scope) if isinstance(
                    ret, (ast.Name, ast.Attribute)) else None
                if path is not None:
                    targets.setdefault(path, ret.lineno)
        node = fn.node
        line = node.lineno if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) else 0
        kept = tuple(list(targets.items())[:MAX_TARGETS])
        helper = self.helpers.helper_params(fn)
        built = next((b for s in self._body(fn) for b in s.builds), None)
        return PySymbol(name, line, "function", kept, extension=built,  # a factory
                        compares=helper[:2] if helper is not None else None)

    def _dispatched(self, func: ast.expr, scope: Scope) -> list[tuple[str, int]]:
        """A call through a table, `{"cpu": _cpu, "cuda": _cuda}[x.device.type].op(x)`
        (or a table bound to a name): each entry's op is a target."""
        attr = None
        if isinstance(func, ast.Attribute) and isinstance(func.value, ast.Subscript):
            attr, func = func.attr, func.value
        if not isinstance(func, ast.Subscript):
            return []
        table = func.value
        if isinstance(table, ast.Name):
            bound = self.index.lookup(table.id, scope, table.lineno)
            table = bound.value if bound is not None and bound.value is not None else table
        if not isinstance(table, ast.Dict):
            return []
        found = []
        for value in table.values:
            if not isinstance(value, (ast.Name, ast.Attribute)):
                continue
            entry = ast.copy_location(ast.Attribute(value=value, attr=attr, ctx=ast.Load()),
                                      value) if attr else value
            path = self.paths.of(entry, scope)
            if path is not None:
                found.append((path, value.lineno))
        return found

    def _body(self, fn: Scope) -> list[Scope]:
        """The function's scope and the scopes nested in it (lambdas, inner functions)."""
        return [s for s in self._bodies.get(id(fn.report), [fn]) if _inside(s, fn)]

    def _class(self, cls: Scope) -> list[PySymbol]:
        node = cls.node
        bases: tuple[tuple[str, int], ...] = ()
        if isinstance(node, ast.ClassDef):
            found = [(p, b.lineno) for b in node.bases
                     if (p := self.paths.of(b, self.index.module)) is not None
                     or (p := dotted_name(b)) is not None]
            bases = tuple(found)
        line = node.lineno if isinstance(node, ast.ClassDef) else 0
        out = [PySymbol(cls.name, line, "class", bases)]
        out += [self._function(f"{cls.name}.{name}", fn) for name, fn in cls.funcs.items()]
        return out


def _inside(scope: Scope, fn: Scope) -> bool:
    s: Scope | None = scope
    while s is not None:
        if s is fn:
            return True
        s = s.parent
    return False
