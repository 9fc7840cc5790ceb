"""Extension builds: `CUDAExtension`/`CppExtension` in setup scripts, `load`, `load_inline`.

Each build call is read into a `BuildRecipe` with its sources, flags, defines and include
folders; the sources a `load_inline` call holds in strings are read by `inline`, the
lists a setup script builds step by step by `flow`. The extension class may be an
alias (`Ext = CUDAExtension if with_cuda else CppExtension`), taken as CUDAExtension.
What cannot be decided statically is said in the recipe's `cannot_tell`, with its line.
"""

from __future__ import annotations

import ast
from collections.abc import Iterable
from dataclasses import replace
from typing import Literal

from kfbot.scan.model import BuildRecipe, InlineSource
from kfbot.scan.python.flow import Flow
from kfbot.scan.python.inline import InlineReader
from kfbot.scan.python.scopes import MAX_DEPTH, MAX_ITEMS, Bind, Scope, ScopeIndex
from kfbot.scan.python.syntax import as_written, clip, dotted_name, known, unique
from kfbot.scan.python.values import Evaluator, Glob

BuildKind = Literal["setup_py", "load", "load_inline"]
_INLINE_KEYS: tuple[tuple[Literal["cpp", "cuda"], str], ...] = (
    ("cpp", "cpp_sources"), ("cuda", "cuda_sources"))
_BUILD_NAMES = frozenset({"CUDAExtension", "CppExtension", "load_inline", "load"})
_EXTENSION_CLASSES = ("CUDAExtension", "CppExtension")
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


def _suffix_filter(ifs: list[ast.expr], var: str) -> tuple[str, ...] | None:
    """The suffixes `if name.endswith((".cu", ".cpp"))` keeps; () for no filter, None
    for a filter that is not read."""
    found: tuple[str, ...] = ()
    for test in ifs:
        if not (isinstance(test, ast.Call) and isinstance(test.func, ast.Attribute)
                and test.func.attr == "endswith" and isinstance(test.func.value, ast.Name)
                and test.func.value.id == var and len(test.args) == 1):
            return None
        arg = test.args[0]
        items = arg.elts if isinstance(arg, ast.Tuple) else [arg]
        if not all(isinstance(i, ast.Constant) and isinstance(i.value, str) for i in items):
            return None
        found += tuple(str(i.value) for i in items if isinstance(i, ast.Constant))
    return found


def _is_listdir(it: ast.expr, index: ScopeIndex) -> bool:
    while isinstance(it, ast.Call) and dotted_name(it.func) in ("sorted", "list") and it.args:
        it = it.args[0]
    return isinstance(it, ast.Call) and index.qualname(it.func) == "os.listdir"


def _with_suffix(pattern: str, suffix: str) -> str:
    return pattern[:-1] + "*" + suffix if suffix and pattern.endswith("*") else pattern


def _glob_node(pattern: str, like: ast.expr) -> ast.expr:
    """An expression the evaluator reads as that glob: `glob.glob(pattern)`."""
    call = ast.Call(func=ast.Attribute(value=ast.Name(id="glob", ctx=ast.Load()), attr="glob",
                                       ctx=ast.Load()),
                    args=[ast.Constant(value=pattern)], keywords=[])
    return ast.fix_missing_locations(ast.copy_location(call, like))


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
        self._notes: list[str] = []  # what the build being read could not tell
        self.flow = Flow(index, values, self._note)

    def _note(self, line: int, message: str) -> None:
        self._notes.append(f"{self.index.rel_path}:{line}: {message}")

    def extension_class(self, func: ast.expr, scope: Scope | None) -> tuple[str, str] | None:
        """("CUDAExtension", how it was chosen) when `func` names an extension class,
        directly or through a variable (`Ext = CUDAExtension if cuda else CppExtension`)."""
        last = func.attr if isinstance(func, ast.Attribute) else \
            func.id if isinstance(func, ast.Name) else ""
        if last in _EXTENSION_CLASSES:
            return last, ""
        if scope is None or not isinstance(func, ast.Name) or last in self.index.imports:
            return None
        b = self.index.lookup(last, scope, func.lineno)
        value = b.value if b is not None else None
        choices = [value.body, value.orelse] if isinstance(value, ast.IfExp) else [value]
        names = [(dotted_name(c) or "").rsplit(".", 1)[-1] for c in choices if c is not None]
        found = [n for n in names if n in _EXTENSION_CLASSES]
        if not found or b is None:
            return None
        chosen = "CUDAExtension" if "CUDAExtension" in found else found[0]
        shown = clip(as_written(value), 60) if value is not None else last
        how = "" if len(found) == 1 else \
            f"`{last} = {shown}` (line {b.line}) is chosen at run time; taken as " \
            f"{chosen}, the class that compiles .cu sources"
        return chosen, how

    def kind(self, call: ast.Call, scope: Scope | None = None) -> BuildKind | None:
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
            return "setup_py" if self.extension_class(func, scope) is not None else None
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
                kind = self.kind(call, scope)
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
        self._notes = []
        chosen = self.extension_class(call.func, scope) if kind == "setup_py" else None
        if chosen is not None and chosen[1]:
            self._note(call.lineno, chosen[1])
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
            include_dirs=unique(include_dirs), variable=self.index.targets.get(id(call)),
            cannot_tell=unique(self._notes),
            extension_class=chosen[0] if chosen is not None else None)
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
                elif isinstance(e, ast.IfExp):  # `"-O3" if not debug else "-O0"`
                    out += self._items(e, scope, depth + 1)
                else:
                    out.append((e, scope))
            return out[:MAX_ITEMS]
        if isinstance(expr, ast.Name):
            return self._name_items(expr, scope, depth)
        if isinstance(expr, ast.BinOp) and isinstance(expr.op, ast.Add) \
                and not isinstance(self.values.eval(expr, scope), str):
            return self._items(expr.left, scope, depth + 1) + \
                self._items(expr.right, scope, depth + 1)
        if isinstance(expr, ast.ListComp):
            return self._comprehension(expr, scope, depth)
        if isinstance(expr, ast.IfExp):
            taken = self.flow.decide(expr.test, scope)
            if taken is None:
                self._note(expr.lineno, f"`{clip(as_written(expr), 60)}` cannot be told "
                                        "statically; taken as its first branch")
            return self._items(expr.body if taken is not False else expr.orelse, scope,
                               depth + 1)
        if isinstance(expr, ast.Call):
            return self._call_items(expr, scope, depth)
        return [(expr, scope)]

    def _name_items(self, expr: ast.Name, scope: Scope,
                    depth: int) -> list[tuple[ast.expr, Scope]]:
        """A list variable, replayed through the statements that build it."""
        b = self.index.lookup(expr.id, scope, expr.lineno)
        if b is None or b.value is None:
            return [(expr, scope)]
        owner = b.scope
        node = owner.node
        if isinstance(node, (ast.Module, ast.FunctionDef, ast.AsyncFunctionDef)) and b.line:
            upto = expr.lineno if owner is scope else 1 << 30
            built = self.flow.built(expr.id, node.body, owner, upto, depth + 1)
            if built is not None:
                return [i for e, s in built for i in self._items(e, s, depth + 1)]
        return self._items(b.value, b.scope, depth + 1)

    def _call_items(self, call: ast.Call, scope: Scope,
                    depth: int) -> list[tuple[ast.expr, Scope]]:
        if dotted_name(call.func) in ("list", "tuple", "sorted", "set") and call.args:
            return self._items(call.args[0], scope, depth + 1)
        fn = self.index.local_function(call.func, scope)
        if fn is not None:  # a helper that returns the list: `nvcc_flags()`
            frame = self.flow.frame(fn, call, scope)
            returned = self.flow.returned(frame, depth + 1)
            if returned is not None:
                return [i for e, s in returned for i in self._items(e, s, depth + 1)]
        return [(call, scope)]

    def _comprehension(self, comp: ast.ListComp, scope: Scope,
                       depth: int) -> list[tuple[ast.expr, Scope]]:
        gen = comp.generators[0]
        if len(comp.generators) != 1 or not isinstance(gen.target, ast.Name):
            return [(comp, scope)]
        suffixes = _suffix_filter(gen.ifs, gen.target.id)
        if suffixes is None:
            self._note(comp.lineno, f"the filter of `{clip(as_written(comp), 60)}` cannot be "
                                    "read statically; left out")
            return [(comp, scope)]
        out: list[tuple[ast.expr, Scope]] = []
        for element, where in self._iterated(gen.iter, scope, suffixes, depth):
            # A scope of its own binds the loop variable to this one element.
            inner = Scope("<comprehension>", "function", parent=scope, cls=scope.cls)
            inner.bind(gen.target.id, Bind(0, element, where))
            out.append((comp.elt, inner))
        return out

    def _iterated(self, it: ast.expr, scope: Scope, suffixes: tuple[str, ...],
                  depth: int) -> list[tuple[ast.expr, Scope]]:
        """What a comprehension iterates over: list items, or the matches of a glob
        (`glob.glob`, `Path.glob`, `os.listdir`), kept as patterns filtered by suffix."""
        value = self.values.eval(it, scope)
        if not isinstance(value, Glob):
            return self._items(it, scope, depth + 1)
        listed = _is_listdir(it, self.index)
        pattern = "*" if listed else value.pattern  # os.listdir yields names, not paths
        return [(_glob_node(_with_suffix(pattern, suffix), it), scope)
                for suffix in suffixes or ("",)]

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
