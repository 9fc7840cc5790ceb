"""Extension builds: `CUDAExtension`/`CppExtension` in setup scripts, `load`, `load_inline`.

Each build call is read into a `BuildRecipe` with its sources, flags, defines and include
folders; the sources a `load_inline` call holds in strings are read by `py_inline`.
"""

from __future__ import annotations

import ast
from collections.abc import Iterable
from dataclasses import replace
from typing import Literal

from kfbot.scan.model import BuildRecipe, InlineSource
from kfbot.scan.py_inline import InlineReader
from kfbot.scan.py_scopes import MAX_DEPTH, MAX_ITEMS, Bind, Scope, ScopeIndex
from kfbot.scan.py_syntax import as_written, dotted_name, known, unique
from kfbot.scan.py_values import Evaluator, Glob

BuildKind = Literal["setup_py", "load", "load_inline"]
_INLINE_KEYS: tuple[tuple[Literal["cpp", "cuda"], str], ...] = (
    ("cpp", "cpp_sources"), ("cuda", "cuda_sources"))
_BUILD_NAMES = frozenset({"CUDAExtension", "CppExtension", "load_inline", "load"})
_BUILD_PARAMS: dict[BuildKind, tuple[str, ...]] = {
    "setup_py": ("name", "sources"),
    "load": ("name", "sources", "extra_cflags", "extra_cuda_cflags"),
    "load_inline": ("name", "cpp_sources", "cuda_sources", "functions", "extra_cflags",
                    "extra_cuda_cflags"),
}


def _call_args(call: ast.Call, params: tuple[str, ...]) -> dict[str, ast.expr]:
    out: dict[str, ast.expr] = {}
    for name, arg in zip(params, call.args, strict=False):
        if isinstance(arg, ast.Starred):
            break  # positions after *args are unknown
        out[name] = arg
    out.update({k.arg: k.value for k in call.keywords if k.arg is not None})
    return out


def _defines(flags: Iterable[str]) -> list[tuple[str, str]]:
    """-DNAME=VALUE / -DNAME / `-D NAME` flags as (name, value) pairs."""
    tokens = [t for f in flags for t in f.split()]
    out: list[tuple[str, str]] = []
    i = 0
    while i < len(tokens):
        token = tokens[i]
        if token == "-D" and i + 1 < len(tokens):
            i += 1
            token = "-D" + tokens[i]
        if token.startswith("-D") and len(token) > 2:
            name, _, value = token[2:].partition("=")
            out.append((name, value))
        i += 1
    return out


class BuildReader:
    """The builds of one file; `names` maps each build call (by id) to its build name."""

    def __init__(self, index: ScopeIndex, values: Evaluator, inline: InlineReader) -> None:
        self.index = index
        self.values = values
        self.inline = inline
        self.names: dict[int, str] = {}  # id(build call) -> build name

    def kind(self, call: ast.Call) -> BuildKind | None:
        """Which kind of build `call` is, or None for a call that builds nothing."""
        func = call.func
        if isinstance(func, ast.Attribute):
            last = func.attr
        elif isinstance(func, ast.Name):
            last = func.id
            if last in self.index.imports:  # `load as jit_load`
                last = self.index.imports[last].rsplit(".", 1)[-1]
        else:
            return None
        if last not in _BUILD_NAMES:
            return None
        if last in ("CUDAExtension", "CppExtension"):
            return "setup_py"
        if last == "load_inline":
            return "load_inline"
        if last != "load":
            return None
        q = self.index.qualname(func) or ""
        if q.endswith("cpp_extension.load"):
            return "load"
        if q == "load" and any(s.endswith("cpp_extension") for s in self.index.star_imports):
            return "load"
        # An unqualified `load(name=..., sources=[...])` is the JIT loader in practice.
        has_sources = any(k.arg == "sources" for k in call.keywords)
        return "load" if has_sources and not q.startswith(("torch.load", "json.")) else None

    def read(self) -> tuple[list[BuildRecipe], list[InlineSource]]:
        """The file's builds by line, and the inline sources of its `load_inline` calls."""
        found: list[tuple[BuildRecipe, Scope]] = []
        inline: list[InlineSource] = []
        for scope in self.index.scopes:
            for call in scope.calls:
                func = call.func
                if isinstance(func, ast.Attribute) and func.attr not in _BUILD_NAMES:
                    continue  # the cheap test of `kind` first: most calls end here
                kind = self.kind(call)
                if kind is None:
                    continue
                recipe, sources = self._build(call, kind, scope)
                self.names[id(call)] = recipe.name
                scope.builds.append(recipe.name)
                found.append((recipe, scope))
                inline += sources
        builds = self._factory_variables(found)
        builds.sort(key=lambda b: b.line)
        return builds, inline

    def _build(self, call: ast.Call, kind: BuildKind,
               scope: Scope) -> tuple[BuildRecipe, list[InlineSource]]:
        args = _call_args(call, _BUILD_PARAMS[kind])
        name = self._build_name(args.get("name"), scope, call.lineno)
        cflags, cuda_cflags = self._flags(kind, args, scope)
        defines = self._macros(args.get("define_macros"), scope) + _defines(cflags + cuda_cflags)
        inline: list[InlineSource] = []
        if kind == "load_inline":
            for language, key in _INLINE_KEYS:
                inline += self.inline.sources(args.get(key), scope, language, name, call.lineno)
            sources = [s.path for s in inline if s.path is not None]
        else:
            sources = self._sources(args.get("sources"), scope)
        functions = self._functions(args.get("functions"), scope)
        include_dirs = self._sources(
            args.get("extra_include_paths") or args.get("include_dirs"), scope)
        recipe = BuildRecipe(
            kind=kind, name=name, file=self.index.rel_path, line=call.lineno,
            sources=unique(sources), inline=kind == "load_inline",
            defines=tuple(dict.fromkeys(defines)), extra_cflags=tuple(cflags),
            extra_cuda_cflags=tuple(cuda_cflags), functions=functions,
            include_dirs=unique(include_dirs), variable=self.index.targets.get(id(call)))
        return recipe, inline

    def _factory_variables(self, found: list[tuple[BuildRecipe, Scope]]) -> list[BuildRecipe]:
        """`ext = _load()` at module level names what `def _load(): return load(...)` built."""
        assigned: dict[str, str] = {}
        for key, binds in self.index.module.binds.items():
            for b in binds:
                if isinstance(b.value, ast.Call) and isinstance(b.value.func, ast.Name):
                    assigned.setdefault(b.value.func.id, key)
        out = []
        for recipe, scope in found:
            if recipe.variable is None and scope.kind == "function" and scope.report is scope \
                    and isinstance(scope.node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                recipe = replace(recipe, variable=assigned.get(scope.node.name))
            out.append(recipe)
        return out

    def _build_name(self, expr: ast.expr | None, scope: Scope, line: int) -> str:
        value = self.values.eval(expr, scope) if expr is not None else None
        if isinstance(value, str):
            return value
        text = as_written(expr) if expr is not None else "<unnamed>"
        self.values.note(line, f"build name `{text}` is not a static string; kept as written")
        return text

    def _items(self, expr: ast.expr, scope: Scope,
               depth: int = 0) -> list[tuple[ast.expr, Scope]]:
        """The elements of a list-valued expression, each with the scope it is read in."""
        if depth > MAX_DEPTH:
            return [(expr, scope)]
        if isinstance(expr, (ast.List, ast.Tuple, ast.Set)):
            out: list[tuple[ast.expr, Scope]] = []
            for e in expr.elts:
                if isinstance(e, ast.Starred):
                    out += self._items(e.value, scope, depth + 1)
                else:
                    out.append((e, scope))
            return out[:MAX_ITEMS]
        if isinstance(expr, ast.Name):
            b = self.index.lookup(expr.id, scope, expr.lineno)
            if b is not None and b.value is not None:
                return self._items(b.value, b.scope, depth + 1)
        elif isinstance(expr, ast.BinOp) and isinstance(expr.op, ast.Add) \
                and not isinstance(self.values.eval(expr, scope), str):
            return self._items(expr.left, scope, depth + 1) + \
                self._items(expr.right, scope, depth + 1)
        elif isinstance(expr, ast.ListComp):
            return self._comprehension(expr, scope, depth)
        elif isinstance(expr, ast.Call) and dotted_name(expr.func) in (
                "list", "tuple", "sorted", "set") and expr.args:
            return self._items(expr.args[0], scope, depth + 1)
        return [(expr, scope)]

    def _comprehension(self, comp: ast.ListComp, scope: Scope,
                       depth: int) -> list[tuple[ast.expr, Scope]]:
        gen = comp.generators[0]
        if len(comp.generators) != 1 or gen.ifs or not isinstance(gen.target, ast.Name):
            return [(comp, scope)]
        out: list[tuple[ast.expr, Scope]] = []
        for element, where in self._items(gen.iter, scope, depth + 1):
            # A scope of its own binds the loop variable to this one element.
            inner = Scope("<comprehension>", "function", parent=scope, cls=scope.cls)
            inner.bind(gen.target.id, Bind(0, element, where))
            out.append((comp.elt, inner))
        return out

    def _strings(self, expr: ast.expr | None, scope: Scope, what: str) -> list[str]:
        if known(expr) is None or expr is None:
            return []
        out: list[str] = []
        for e, where in self._items(expr, scope):
            value = self.values.eval(e, where)
            if isinstance(value, str):
                out.append(value)
            else:
                self.values.note(e.lineno, f"{what} entry `{as_written(e)}` is not a static "
                                           "string; left out")
        return out

    def _sources(self, expr: ast.expr | None, scope: Scope) -> list[str]:
        if expr is None:
            return []
        out: list[str] = []
        for e, where in self._items(expr, scope):
            value = self.values.eval(e, where)
            if isinstance(value, (str, Glob)):
                out.append(self.values.resolve_path(value, e))
            else:
                out.append(as_written(e))
                self.values.note(e.lineno, f"source `{as_written(e)}` is not a static path; "
                                           "kept as written")
        return out

    def _flags(self, kind: BuildKind, args: dict[str, ast.expr],
               scope: Scope) -> tuple[list[str], list[str]]:
        if kind != "setup_py":
            return (self._strings(args.get("extra_cflags"), scope, "extra_cflags"),
                    self._strings(args.get("extra_cuda_cflags"), scope, "extra_cuda_cflags"))
        flags = args.get("extra_compile_args")
        if flags is None:
            return [], []
        found = self._dict(flags, scope, 0)
        if found is None:
            return self._strings(flags, scope, "extra_compile_args"), []
        entries, where = found
        return (self._strings(entries.get("cxx"), where, "extra_compile_args['cxx']"),
                self._strings(entries.get("nvcc"), where, "extra_compile_args['nvcc']"))

    def _dict(self, expr: ast.expr, scope: Scope,
              depth: int) -> tuple[dict[str, ast.expr], Scope] | None:
        if depth > MAX_DEPTH:
            return None
        if isinstance(expr, ast.Dict):
            return {k.value: v for k, v in zip(expr.keys, expr.values, strict=True)
                    if isinstance(k, ast.Constant) and isinstance(k.value, str)}, scope
        if isinstance(expr, ast.Call) and dotted_name(expr.func) == "dict":
            return {k.arg: k.value for k in expr.keywords if k.arg}, scope
        if isinstance(expr, ast.Name):
            b = self.index.lookup(expr.id, scope, expr.lineno)
            if b is not None and b.value is not None:
                return self._dict(b.value, b.scope, depth + 1)
        return None

    def _macros(self, expr: ast.expr | None, scope: Scope) -> list[tuple[str, str]]:
        if expr is None:
            return []
        out: list[tuple[str, str]] = []
        for e, where in self._items(expr, scope):
            value = self.values.eval(e, where)
            if isinstance(value, tuple) and len(value) == 2 and isinstance(value[0], str):
                out.append((value[0], "" if value[1] is None else str(value[1])))
            else:
                self.values.note(e.lineno, f"define_macros entry `{as_written(e)}` is not "
                                           "static; left out")
        return out

    def _functions(self, expr: ast.expr | None, scope: Scope) -> tuple[str, ...]:
        if expr is None:
            return ()
        found = self._dict(expr, scope, 0)
        if found is not None:
            return tuple(found[0])
        return tuple(self._strings(expr, scope, "functions"))
