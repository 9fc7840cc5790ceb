"""Ops: calls that reach a compiled extension, and what tells them from a reference.

A call is an op when it goes through `torch.ops.<namespace>`, through a module bound to
a `load`/`load_inline` result, an import of the repository's own extension, or a local
function, lambda, module or autograd Function (one level deep) that calls one. A call
of something imported from the repository's own Python code (a package's wrapper, a
class, a `functools.partial` of one) is an op candidate too: it keeps the import path
it calls (`Op.target`), which `graph` follows through the repository's modules once
every file is read. A method called on a call's result (`op(x).float()`) is never the
op: the op is the inner call.
"""

from __future__ import annotations

import ast
import posixpath
import re
from collections.abc import Callable
from dataclasses import dataclass, replace

from kfbot.scan.python.builds import BuildReader
from kfbot.scan.python.modules import GET_KERNEL, Paths, hub_package
from kfbot.scan.python.scopes import Bind, Scope, ScopeIndex
from kfbot.scan.python.syntax import as_written, dotted_name, head_name
from kfbot.scan.python.values import Evaluator

# Imports from these are never the repository's own extension.
WELL_KNOWN = frozenset({
    "torch", "numpy", "pytest", "math", "os", "sys", "time", "typing", "functools",
    "itertools", "triton", "random", "unittest", "json", "re", "collections", "dataclasses",
    "pathlib", "subprocess", "argparse", "logging", "warnings", "copy", "statistics",
    "contextlib", "importlib", "glob", "shutil", "tempfile", "inspect", "abc", "enum",
    "textwrap", "timeit", "gc", "traceback", "io", "string", "operator", "platform",
    "datetime", "pickle", "csv", "hashlib", "threading", "multiprocessing", "ctypes",
    "einops", "scipy", "pandas", "matplotlib", "tqdm", "transformers", "setuptools",
    "distutils", "pkg_resources", "packaging", "hypothesis", "tabulate", "yaml", "jax",
    "numba", "cupy", "tensorflow", "__future__", "types", "weakref", "heapq", "bisect",
    "queue", "fractions", "decimal", "cmath", "uuid", "fnmatch", "shlex", "pprint", "rich",
    "click", "psutil", "pynvml", "codecs", "struct", "signal", "socket", "atexit",
})
# torch.ops namespaces that belong to PyTorch itself, not to an extension.
_TORCH_NAMESPACES = frozenset({"aten", "prims", "prim", "quantized", "_quantized"})
# Imported functions named like this are the reference, not the op under test.
REFERENCE_NAME = re.compile(
    r"(?:^|_)(?:ref|reference|naive|baseline|golden|expected|eager|torch|python|py)(?:_|$)")


# Tensor methods: called on an op's result they convert or reduce it; never the op.
TENSOR_METHODS = frozenset({
    "float", "half", "double", "bfloat16", "int", "long", "bool", "cpu", "cuda", "to",
    "detach", "clone", "contiguous", "numpy", "item", "tolist", "sum", "mean", "max", "min",
    "abs", "view", "reshape", "flatten", "squeeze", "unsqueeze", "permute", "transpose",
    "backward", "requires_grad_", "type", "type_as", "chunk", "split", "norm", "amax", "amin",
    "softmax", "sigmoid", "tanh", "exp", "log", "sqrt", "pow", "mul", "add", "sub", "div",
    "all", "any", "eq", "ne", "isnan", "isfinite", "nan_to_num", "cumsum", "argmax",
})
_PARTIAL = frozenset({"functools.partial", "partial"})


@dataclass(frozen=True)
class Op:
    text: str  # as written, e.g. "ext.softmax"
    name: str
    hint: str | None
    confidence: float
    call: ast.Call  # the call in the analysed scope (the wrapper call for wrapped ops)
    scope: Scope
    target: str | None = None  # the import path called, for repository Python code


def _result(call: ast.Call) -> bool:
    """Whether `call` computes on data (`op(x, n)`), rather than making an object: a
    class (`Ops()`, by the naming convention) or a module (`load_ext()`, `get_ext("a")`
    take no data)."""
    func = call.func
    name = func.attr if isinstance(func, ast.Attribute) else \
        func.id if isinstance(func, ast.Name) else ""
    values = [*call.args, *(k.value for k in call.keywords)]
    return not name[:1].isupper() and any(not isinstance(v, ast.Constant) for v in values)


class OpFinder:
    """The op a call in one file reaches, if any; answers are cached per call."""

    def __init__(self, index: ScopeIndex, values: Evaluator, builds: BuildReader,
                 exists: Callable[[str], bool] | None, paths: Paths) -> None:
        self.index = index
        self.values = values
        self.builds = builds
        self.exists = exists
        self.paths = paths
        self._op_cache: dict[int, Op | None] = {}
        self._first_op_cache: dict[int, Op | None] = {}
        self._local_module_cache: dict[str, bool] = {}
        self._module_cache: dict[str, tuple[str | None, float] | None] = {}

    def release(self) -> None:
        """Drop the cached answers, which hold the file's calls and scopes."""
        self._op_cache.clear()
        self._first_op_cache.clear()

    def op_of_call(self, call: ast.Call, scope: Scope, depth: int = 0) -> Op | None:
        """The op `call` reaches, or None; `depth` > 0 when looking inside a wrapper."""
        if depth:
            return self._op(call, scope, depth)
        key = id(call)
        if key not in self._op_cache:
            self._op_cache[key] = self._op(call, scope, 0)
        return self._op_cache[key]

    def _op(self, call: ast.Call, scope: Scope, depth: int) -> Op | None:
        func = call.func
        if isinstance(func, ast.Attribute):
            return self._attr_op(call, func, scope, scope, depth)
        if isinstance(func, ast.Name):
            return self._name_op(call, func, scope, depth)
        if isinstance(func, ast.Call):  # MyModule(...)(x)
            cls = self.index.local_class(func.func)
            return self._wrapped(cls.funcs.get("forward") if cls else None, call, scope, depth)
        return None

    def _attr_op(self, call: ast.Call, func: ast.Attribute, scope: Scope, site: Scope,
                 depth: int) -> Op | None:
        q = self.index.qualname(func)
        if q is not None and q.startswith("torch.ops."):
            parts = q.split(".")
            if len(parts) < 4 or parts[2] in _TORCH_NAMESPACES:
                return None
            return Op(as_written(func), parts[3], parts[2], 0.9, call, site)
        base = func.value
        if isinstance(base, ast.Call) and (func.attr in TENSOR_METHODS
                                           or self.op_of_call(base, scope, depth + 1)):
            return None  # a method of the op's result: the op is the inner call
        if func.attr in TENSOR_METHODS and isinstance(base, ast.Name):
            held = self.index.lookup(base.id, scope, base.lineno)
            made = held.value if held is not None else None
            if held is not None and isinstance(made, ast.Call) and _result(made) \
                    and self._extension_value(made, held.scope, depth + 1) is None:
                return None  # `out = op(x); out.cpu()`: a method of a result
        cls = self.index.local_class(base)
        if cls is not None and func.attr == "apply":  # autograd.Function subclass
            return self._wrapped(cls.funcs.get("forward"), call, site, depth)
        method = self.index.local_function(func, scope)
        if method is not None:
            return self._wrapped(method, call, site, depth)
        ext = self._extension(base, scope, depth)
        if ext is None or (ext[1] < 0.9 and REFERENCE_NAME.search(func.attr)):
            return None
        if func.attr[:1].isupper():
            return None  # `pkg.Layer(8)` makes an object of a class: not the op
        # Followed across modules: what is imported, or held less surely than a build
        # of this file (a module from get_kernel, a factory's result).
        imported = head_name(base) in self.index.imports
        target = self.paths.of(func, scope) if imported or ext[1] < 0.9 else None
        return Op(as_written(func), func.attr, ext[0], ext[1], call, site, target)

    def _name_op(self, call: ast.Call, func: ast.Name, scope: Scope, depth: int) -> Op | None:
        b = self.index.lookup(func.id, scope, func.lineno)
        if b is not None:
            return self._bound_op(call, b, scope, depth)
        fn = self.index.local_function(func, scope)
        if fn is not None:
            return self._wrapped(fn, call, scope, depth)
        full = self.index.imports.get(func.id)
        if full is None or full.split(".")[0] in WELL_KNOWN:
            return None
        op_name = full.rsplit(".", 1)[-1]
        if REFERENCE_NAME.search(op_name) or op_name[:1].isupper():
            return None  # a reference, or a class (making an object is not the op)
        module = full[: full.rfind(".")] if "." in full.lstrip(".") else ""
        hint = module.rsplit(".", 1)[-1] or None
        confidence = 0.7 if module and self._is_local_python(module) else 0.8
        return Op(func.id, op_name, hint, confidence, call, scope, full)

    def _bound_op(self, call: ast.Call, b: Bind, site: Scope, depth: int) -> Op | None:
        """`f = ext.softmax; f(x)`, `m = MyModule(); m(x)`, `f = lambda x: ext.f(x)`,
        `f = functools.partial(op, ...)` and `g = imported_function`."""
        value = b.value
        if isinstance(value, ast.Call) and value.args and \
                self.index.qualname(value.func) in _PARTIAL:
            value = value.args[0]
        if isinstance(value, ast.Attribute) and depth < 2:
            return self._attr_op(call, value, b.scope, site, depth + 1)
        if isinstance(value, ast.Name) and depth < 2:
            return self._name_op(call, value, b.scope, depth + 1)
        if isinstance(value, ast.Call) and depth == 0:
            cls = self.index.local_class(value.func)
            if cls is None:
                return self._instance_op(call, value, b.scope, site)
            return self._wrapped(cls.funcs.get("forward"), call, site, depth)
        if isinstance(value, ast.Lambda) and depth == 0:
            for node in ast.walk(value.body):
                if isinstance(node, ast.Call) and (op := self.op_of_call(node, b.scope, 1)):
                    return replace(op, call=call, scope=site)
        return None

    def _instance_op(self, call: ast.Call, made: ast.Call, scope: Scope,
                     site: Scope) -> Op | None:
        """`layer = FusedGELU().cuda(); layer(x)` with the class imported from the
        repository."""
        target = self.paths.value(made, scope)
        if target is None or not target.endswith(".__call__") or (
                not target.startswith(".") and target.split(".")[0] in WELL_KNOWN):
            return None
        cls = target[: -len(".__call__")]
        name = cls.rsplit(".", 1)[-1]
        hint = cls.rsplit(".", 2)[-2] if cls.count(".") > 1 else None
        return Op(as_written(call.func), name, hint, 0.6, call, site, target)

    def _wrapped(self, fn: Scope | None, call: ast.Call, site: Scope,
                 depth: int) -> Op | None:
        """A local function (one level deep) that calls an op stands for that op."""
        if fn is None or depth > 0:
            return None
        inner = self.first_op(fn)
        return replace(inner, call=call, scope=site) if inner is not None else None

    def first_op(self, fn: Scope) -> Op | None:
        key = id(fn)
        if key not in self._first_op_cache:
            self._first_op_cache[key] = next(
                (op for c in fn.calls if (op := self.op_of_call(c, fn, 1))), None)
        return self._first_op_cache[key]

    def _extension(self, base: ast.expr, scope: Scope,
                   depth: int) -> tuple[str | None, float] | None:
        """(module hint, confidence) when `base` denotes a loaded extension module."""
        if depth > 4:
            return None
        if isinstance(base, ast.Call):
            return self._extension_value(base, scope, depth + 1)
        dotted = dotted_name(base)
        if dotted is None:
            return None
        if "." not in dotted or dotted.startswith(("self.", "cls.")):
            b = self.index.lookup(dotted, scope, base.lineno)
            if b is not None:
                return self._extension_value(b.value, b.scope, depth + 1) if b.value else None
        head, _, rest = dotted.partition(".")
        full = self.index.imports.get(head)
        if full is None:
            return None
        q = f"{full}.{rest}" if rest else full  # `qualname(base)`, its head known imported
        if q not in self._module_cache:  # the same few modules are asked about per call
            self._module_cache[q] = self._extension_module(q)
        return self._module_cache[q]

    def _extension_module(self, q: str) -> tuple[str | None, float] | None:
        parts = q.split(".")
        if q.startswith("torch.ops.") and len(parts) == 3:
            return None if parts[2] in _TORCH_NAMESPACES else (parts[2], 0.9)
        if not q.startswith(".") and parts[0] in WELL_KNOWN:
            return None
        # A local .py module (or a name defined in one) is a helper around the extension.
        return parts[-1] or None, 0.7 if self._is_local_python(q) else 0.9

    def _extension_value(self, value: ast.expr, scope: Scope,
                         depth: int) -> tuple[str | None, float] | None:
        if isinstance(value, (ast.Name, ast.Attribute)):
            return self._extension(value, scope, depth + 1)
        if not isinstance(value, ast.Call) or depth > 6:
            return None
        if self.builds.kind(value) in ("load", "load_inline"):
            return self.builds.names.get(id(value)), 0.9
        fn = self.index.local_function(value.func, scope)
        if fn is not None:
            return self._factory(fn, depth)
        q = self.index.qualname(value.func) or ""
        if q in ("importlib.import_module", "pytest.importorskip") and value.args:
            name = self.values.eval(value.args[0], scope)
            return (name.rsplit(".", 1)[-1], 0.9) if isinstance(name, str) else None
        if GET_KERNEL.search(q) and value.args:  # kernels.get_kernel("org/name")
            repo = self.values.eval(value.args[0], scope)
            return (hub_package(repo), 0.7) if isinstance(repo, str) else None
        head = head_name(value.func)
        if head in self.index.imports and "." in q.lstrip(".") \
                and q.split(".")[0] not in WELL_KNOWN and not _result(value):
            module = q[: q.rfind(".")]  # `helper.get_ext()`: an extension from a helper module
            return module.rsplit(".", 1)[-1] or None, 0.7
        return None

    def _factory(self, fn: Scope, depth: int) -> tuple[str | None, float] | None:
        if fn.builds:
            return fn.builds[0], 0.9
        for r in fn.returns:
            found = self._extension_value(r, fn, depth + 1)
            if found is not None:
                return found
        return None

    def _is_local_python(self, module: str) -> bool:
        """Whether `module` (or the module it is a name in) is a .py file of the repo."""
        if self.exists is None:
            return False
        if module not in self._local_module_cache:
            stripped = module.lstrip(".")
            parent = module[: module.rfind(".")] if "." in stripped else None
            self._local_module_cache[module] = any(
                self._module_file(m) for m in (module, parent) if m and m.strip("."))
        return self._local_module_cache[module]

    def _module_file(self, module: str) -> bool:
        level = len(module) - len(module.lstrip("."))
        rel = module.lstrip(".").replace(".", "/")
        if level:
            base = self.index.pydir
            for _ in range(level - 1):
                base = posixpath.dirname(base)
            candidates = [posixpath.join(base, rel)]
        else:
            candidates = [posixpath.join(self.index.pydir, rel), rel]
        exists = self.exists
        return exists is not None and any(
            exists(c + ".py") or exists(c + "/__init__.py") for c in candidates)
