"""Facts from one Python file: extension builds, inline CUDA sources and reference tests.

Everything is read statically with `ast`; torch is never imported. A build is a call to
`CUDAExtension`/`CppExtension`/`load`/`load_inline`. A reference test is a scope that calls
a bound op and compares its result with a pure-PyTorch computation. Names are followed
through simple assignments, loops, `pytest.mark.parametrize` and fixtures of the same file;
what cannot be read statically is kept as written and noted as an info Problem.
"""

from __future__ import annotations

import ast
import itertools
import posixpath
import re
import textwrap
import warnings
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, replace
from typing import Literal

from kfbot.scan.model import BuildRecipe, InlineSource, Problem, PyFileFacts, ReferenceTest

# A file with none of these can hold neither a build nor a comparison this module
# recognises (a bare `load` comes from `cpp_extension`); skipping it without parsing
# keeps the scan fast on large repositories.
# Files that import torch are read too, so that a syntax error in one is reported.
_RELEVANT = re.compile(
    rb"CUDAExtension|CppExtension|load_inline|cpp_extension|assert_close|allclose|equal\(|abs\("
    rb"|import torch|from torch")

# `__file__` evaluates to a path under this marker so that paths built from it come out
# repo-relative; a NUL byte cannot occur in a real path.
_ROOT = "/\0repo"

_MAX_DEPTH = 8  # how many assignments a name is followed through
_MAX_ITEMS = 256  # list elements read from one expression
_MAX_WORLDS = 32  # parametrize/loop combinations enumerated for shapes and dtypes

# Imports from these are never the repository's own extension.
_WELL_KNOWN = frozenset({
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
# Calls into these count as a pure reference computation.
_REFERENCE_LIBS = frozenset({"torch", "numpy", "math", "einops", "scipy"})
# torch.ops namespaces that belong to PyTorch itself, not to an extension.
_TORCH_NAMESPACES = frozenset({"aten", "prims", "prim", "quantized", "_quantized"})
_BUILTINS = frozenset({
    "abs", "all", "any", "bool", "dict", "enumerate", "float", "getattr", "hasattr", "int",
    "isinstance", "len", "list", "map", "max", "min", "pow", "print", "range", "reversed",
    "round", "set", "sorted", "str", "sum", "tuple", "type", "zip",
})
# Imported functions named like this are the reference, not the op under test.
_REFERENCE_NAME = re.compile(
    r"(?:^|_)(?:ref|reference|naive|baseline|golden|expected|eager|torch|python|py)(?:_|$)")

_DTYPES = {
    "float16": "float16", "half": "float16", "float32": "float32", "float": "float32",
    "float64": "float64", "double": "float64", "bfloat16": "bfloat16", "int8": "int8",
    "uint8": "uint8", "int16": "int16", "short": "int16", "int32": "int32", "int": "int32",
    "int64": "int64", "long": "int64", "bool": "bool", "complex64": "complex64",
    "cfloat": "complex64", "complex128": "complex128", "cdouble": "complex128",
    "float8_e4m3fn": "float8_e4m3fn", "float8_e5m2": "float8_e5m2",
}
_DTYPE_METHODS = {"half": "float16", "float": "float32", "double": "float64",
                  "bfloat16": "bfloat16", "int": "int32", "long": "int64", "bool": "bool"}
# Methods that change dtype, device or copy a tensor but not its values or shape.
_TENSOR_WRAPPERS = frozenset({"cuda", "to", "contiguous", "half", "float", "double",
                              "bfloat16", "requires_grad_", "detach", "clone", "cpu"})
_RESULT_WRAPPERS = _TENSOR_WRAPPERS | {"numpy", "item", "tolist"}

_CREATION = frozenset({"torch.randn", "torch.rand", "torch.zeros", "torch.ones", "torch.empty",
                       "torch.full", "torch.randint", "torch.empty_strided"})
_LIKE = frozenset({"torch.randn_like", "torch.rand_like", "torch.zeros_like", "torch.ones_like",
                   "torch.empty_like", "torch.full_like", "torch.randint_like"})
_ALLOC = frozenset({"torch.empty", "torch.empty_like", "torch.zeros", "torch.zeros_like",
                    "torch.empty_strided", "torch.full", "torch.full_like", "torch.ones",
                    "torch.ones_like"})
_ALLOC_METHODS = frozenset({"new_empty", "new_zeros", "new_full", "new_ones"})

_COMPARE_FUNCS = frozenset({
    "torch.testing.assert_close", "torch.testing.assert_allclose", "torch.allclose",
    "torch.equal", "numpy.testing.assert_allclose", "numpy.testing.assert_array_almost_equal",
    "numpy.testing.assert_almost_equal", "numpy.testing.assert_array_equal", "numpy.allclose",
    "numpy.array_equal",
})
_ACTUAL_KEYWORDS = ("actual", "input", "a", "x")
_EXPECTED_KEYWORDS = ("expected", "desired", "other", "b", "y")

BuildKind = Literal["setup_py", "load", "load_inline"]
_INLINE_KEYS: tuple[tuple[Literal["cpp", "cuda"], str], ...] = (
    ("cpp", "cpp_sources"), ("cuda", "cuda_sources"))
_BUILD_PARAMS: dict[BuildKind, tuple[str, ...]] = {
    "setup_py": ("name", "sources"),
    "load": ("name", "sources", "extra_cflags", "extra_cuda_cflags"),
    "load_inline": ("name", "cpp_sources", "cuda_sources", "functions", "extra_cflags",
                    "extra_cuda_cflags"),
}


def extract_python_facts(rel_path: str, source: bytes,
                         exists: Callable[[str], bool] | None = None) -> PyFileFacts:
    """Builds, inline sources and reference tests of one Python file; never raises.

    `rel_path` is the file's '/'-separated path under the repository root; `exists(rel)`
    says whether a repo-relative path exists (None: assume source paths exist).
    """
    if not _RELEVANT.search(source):
        return PyFileFacts(file=rel_path)
    tree = _parse(rel_path, source)
    if isinstance(tree, Problem):
        return PyFileFacts(file=rel_path, problems=(tree,))
    analysis: _File | None = None
    try:
        analysis = _File(rel_path, tree, exists)
        return analysis.facts()
    except Exception as exc:  # one odd file must not stop a scan of thousands
        message = f"Python file could not be analysed ({type(exc).__name__}: {exc})"
        return PyFileFacts(file=rel_path, problems=(Problem(rel_path, None, message),))
    finally:
        if analysis is not None:
            analysis.release()


def _parse(rel_path: str, source: bytes) -> ast.Module | Problem:
    """`ast.parse` on the bytes, so a PEP 263 coding line is honoured."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # invalid escapes in strings are not our concern
            return ast.parse(source, filename=rel_path)
    except SyntaxError as exc:
        if "codec can't decode" in str(exc.msg):
            return Problem(rel_path, None, f"Python file cannot be decoded: {exc.msg}")
        return Problem(rel_path, exc.lineno, f"Python syntax error: {exc.msg}")
    except ValueError as exc:  # UnicodeDecodeError and NUL bytes on older Pythons
        return Problem(rel_path, None, f"Python file cannot be decoded: {exc}")
    except (RecursionError, MemoryError):
        return Problem(rel_path, None, "Python file is too deeply nested to parse")


# --- small records ------------------------------------------------------------------


@dataclass(frozen=True)
class _Dtype:
    name: str


@dataclass(frozen=True)
class _Glob:
    pattern: str


@dataclass(frozen=True)
class _Piece:
    """A string literal's text and the 0-based file line its first text line is on."""

    text: str
    offset: int


@dataclass(frozen=True)
class _FileRead:
    path: str


@dataclass(frozen=True)
class _Unresolved:
    text: str


_SourceItem = _Piece | _FileRead | _Unresolved
_World = dict[int, int]  # parametrize/loop group -> chosen alternative


@dataclass(eq=False)
class _Bind:
    """A name's value from one assignment; `alts` when it takes each of several values."""

    line: int
    value: ast.expr | None
    scope: _Scope
    alts: tuple[tuple[ast.expr, _Scope], ...] = ()
    group: int = 0


@dataclass(eq=False)
class _Scope:
    name: str
    kind: Literal["module", "class", "function"]
    parent: _Scope | None = None  # where free names are looked up (classes are skipped)
    cls: _Scope | None = None  # the class whose `self.x` attributes a method sees
    node: ast.AST | None = None
    report: _Scope | None = None  # the top-level function or method it reports as
    is_test: bool = False
    binds: dict[str, list[_Bind]] = field(default_factory=dict)
    funcs: dict[str, _Scope] = field(default_factory=dict)
    calls: list[ast.Call] = field(default_factory=list)
    compares: list[ast.Compare] = field(default_factory=list)
    returns: list[ast.expr] = field(default_factory=list)
    globals_: set[str] = field(default_factory=set)
    builds: list[str] = field(default_factory=list)

    def bind(self, key: str, b: _Bind) -> None:
        self.binds.setdefault(key, []).append(b)


@dataclass(frozen=True)
class _Pending:
    """Names bound to the elements of a list, resolved once every assignment is known."""

    scope: _Scope
    names: tuple[str, ...]
    source: ast.expr
    source_scope: _Scope
    line: int
    mode: Literal["rows", "product", "zip"]


@dataclass(frozen=True)
class _Op:
    text: str  # as written, e.g. "ext.softmax"
    name: str
    hint: str | None
    confidence: float
    call: ast.Call  # the call in the analysed scope (the wrapper call for wrapped ops)
    scope: _Scope


@dataclass(frozen=True)
class _Cmp:
    kind: str
    a: ast.expr
    b: ast.expr
    scope: _Scope  # where `a` and `b` are evaluated
    line: int


@dataclass
class _Side:
    """What one operand of a comparison computes."""

    ops: list[tuple[_Op, bool]] = field(default_factory=list)  # (op, reached directly)
    evidence: bool = False  # some torch computation seen
    unknown: bool = False  # a call into something that is neither torch nor local

    @property
    def pure(self) -> bool:
        return self.evidence and not self.unknown and not any(d for _, d in self.ops)


@dataclass(frozen=True)
class _Pairing:
    op: _Op
    reference: str | None
    confidence: float


# --- helpers on syntax --------------------------------------------------------------


def _dotted(expr: ast.AST) -> str | None:
    parts: list[str] = []
    while isinstance(expr, ast.Attribute):
        parts.append(expr.attr)
        expr = expr.value
    if not isinstance(expr, ast.Name):
        return None
    parts.append(expr.id)
    return ".".join(reversed(parts))


def _head(expr: ast.AST) -> str | None:
    while isinstance(expr, ast.Attribute):
        expr = expr.value
    return expr.id if isinstance(expr, ast.Name) else None


def _text(node: ast.AST, limit: int = 200) -> str:
    return _clip(ast.unparse(node), limit)


def _clip(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _known(value: ast.expr | None) -> ast.expr | None:
    """None for a missing value and for a literal `None` (a placeholder, not a value)."""
    if value is None or (isinstance(value, ast.Constant) and value.value is None):
        return None
    return value


def _last_known(binds: list[_Bind]) -> _Bind | None:
    for b in reversed(binds):
        if b.value is not None or b.alts:
            return b
    return binds[-1] if binds else None


def _is_test_file(rel_path: str) -> bool:
    parts = rel_path.split("/")
    base = parts[-1]
    return (base.startswith("test_") or base.endswith("_test.py")
            or any(p in ("tests", "test") for p in parts[:-1]))


def _target_names(target: ast.expr) -> tuple[str, ...] | None:
    if isinstance(target, ast.Name):
        return (target.id,)
    if isinstance(target, (ast.Tuple, ast.List)) and all(
            isinstance(e, ast.Name) for e in target.elts):
        return tuple(e.id for e in target.elts if isinstance(e, ast.Name))
    return None


def _row(element: ast.expr, width: int) -> list[ast.expr] | None:
    """One parametrize row: a tuple, a list or `pytest.param(...)`."""
    if isinstance(element, ast.Call) and (_dotted(element.func) or "").endswith("param"):
        values = list(element.args)
    elif isinstance(element, (ast.Tuple, ast.List)):
        values = list(element.elts)
    else:
        return None
    return values if len(values) == width else None


def _unwrap_param(element: ast.expr) -> ast.expr:
    if (isinstance(element, ast.Call) and (_dotted(element.func) or "").endswith("param")
            and element.args):
        return element.args[0]
    return element


def _parametrize(dec: ast.expr) -> tuple[tuple[str, ...], ast.expr] | None:
    if not isinstance(dec, ast.Call) or not (_dotted(dec.func) or "").endswith("parametrize"):
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


def _is_fixture(node: ast.AST | None) -> bool:
    if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
        return False
    for dec in node.decorator_list:
        target = dec.func if isinstance(dec, ast.Call) else dec
        if (_dotted(target) or "").endswith("fixture"):
            return True
    return False


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


def _unique(items: Iterable[str]) -> tuple[str, ...]:
    return tuple(dict.fromkeys(items))


def _fmt_shape(dims: list[str]) -> str:
    return "(" + ", ".join(dims) + ("," if len(dims) == 1 else "") + ")"


def _literal_offset(node: ast.Constant, text: str) -> int:
    """The 0-based line of the literal's first text line.

    A triple-quoted literal whose opening quotes end with a backslash-newline starts its
    text on the next line; it spans one line more than its text has newlines.
    """
    span = (node.end_lineno or node.lineno) - node.lineno
    return node.lineno - 1 + (1 if span and text.count("\n") == span - 1 else 0)


def _added(expr: ast.BinOp) -> list[ast.expr]:
    """The operands of a left-nested `a + b + c` chain, in order."""
    operands: list[ast.expr] = []
    node: ast.expr = expr
    while isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
        operands.append(node.right)
        node = node.left
    operands.append(node)
    return operands[::-1]


def _merge(pieces: list[_Piece]) -> list[_Piece]:
    """Join literals only where the joined text keeps its line mapping to the file."""
    out: list[_Piece] = []
    for p in pieces:
        if out and p.offset == out[-1].offset + out[-1].text.count("\n"):
            out[-1] = _Piece(out[-1].text + p.text, out[-1].offset)
        else:
            out.append(p)
    return out


def _strip_pieces(pieces: list[_Piece], how: str, chars: str | None) -> list[_Piece]:
    pieces = list(pieces)
    if how in ("strip", "lstrip"):
        first = pieces[0]
        kept = first.text.lstrip(chars)
        removed = first.text[: len(first.text) - len(kept)]
        pieces[0] = _Piece(kept, first.offset + removed.count("\n"))
    if how in ("strip", "rstrip"):
        pieces[-1] = _Piece(pieces[-1].text.rstrip(chars), pieces[-1].offset)
    return pieces


def _binop(op: ast.operator, left: object, right: object) -> object:
    if left is None or right is None or isinstance(left, bool) or isinstance(right, bool):
        return None
    if isinstance(op, ast.Add) and type(left) is type(right) and isinstance(
            left, (str, tuple, int, float)):
        return left + right  # type: ignore[operator]
    if isinstance(op, ast.Div) and isinstance(left, str) and isinstance(right, str):
        return posixpath.join(left, right)  # pathlib's `/`
    if isinstance(left, int) and isinstance(right, int):
        return _int_op(op, left, right)
    if isinstance(op, ast.Mult) and isinstance(left, (str, tuple)) and isinstance(right, int):
        return left * right if len(left) * right <= 10_000 else None
    return None


def _int_op(op: ast.operator, a: int, b: int) -> int | float | None:
    if isinstance(op, ast.Sub):
        return a - b
    if isinstance(op, ast.Mult):
        return a * b
    if isinstance(op, ast.FloorDiv) and b:
        return a // b
    if isinstance(op, ast.Mod) and b:
        return a % b
    if isinstance(op, ast.Div) and b:
        return a / b
    if isinstance(op, ast.Pow) and 0 <= b <= 64 and abs(a) <= 1 << 16:
        return int(a**b)
    if isinstance(op, ast.LShift) and 0 <= b <= 64:
        return a << b
    return None


def _operands(call: ast.Call) -> tuple[ast.expr, ast.expr] | None:
    keywords = {k.arg: k.value for k in call.keywords if k.arg}
    positional = [a for a in call.args if not isinstance(a, ast.Starred)]
    actual = positional[0] if positional else next(
        (keywords[k] for k in _ACTUAL_KEYWORDS if k in keywords), None)
    expected = positional[1] if len(positional) > 1 else next(
        (keywords[k] for k in _EXPECTED_KEYWORDS if k in keywords), None)
    return (actual, expected) if actual is not None and expected is not None else None


# --- the file: index, name lookup and static evaluation ------------------------------


class _File:
    def __init__(self, rel_path: str, tree: ast.Module,
                 exists: Callable[[str], bool] | None) -> None:
        self.rel_path = rel_path
        self.pydir = posixpath.dirname(rel_path)
        self.exists = exists
        self.test_file = _is_test_file(rel_path)
        self.module = _Scope("<module>", "module", node=tree)
        self.module.report = self.module
        self.scopes: list[_Scope] = [self.module]
        self.imports: dict[str, str] = {}  # local name -> dotted name it refers to
        self.star_imports: list[str] = []
        self.classes: dict[str, _Scope] = {}
        self.targets: dict[int, str] = {}  # id(call) -> the name its result is assigned to
        self.build_names: dict[int, str] = {}  # id(build call) -> build name
        self.problems: list[Problem] = []
        self._pending: list[_Pending] = []
        self._params: list[tuple[_Scope, str, int]] = []  # parameters that may be fixtures
        self._groups = itertools.count(1)
        self._op_cache: dict[int, _Op | None] = {}
        self._first_op_cache: dict[int, _Op | None] = {}
        self._local_module_cache: dict[str, bool] = {}
        self._index(tree)

    def facts(self) -> PyFileFacts:
        builds, inline = self._builds()
        references = self._references()
        problems = tuple(dict.fromkeys(self.problems))
        return PyFileFacts(file=self.rel_path, builds=tuple(builds),
                           inline_sources=tuple(inline), references=tuple(references),
                           problems=problems)

    def release(self) -> None:
        """Break the scope <-> binding cycles so the tree is freed as soon as the file is
        done; left to the cyclic collector, freeing costs more than the analysis."""
        for scope in self.scopes:
            scope.binds, scope.funcs = {}, {}
            scope.parent = scope.cls = scope.report = None
        self.scopes = []
        self._op_cache.clear()
        self._first_op_cache.clear()

    def note(self, line: int | None, message: str) -> None:
        self.problems.append(Problem(self.rel_path, line, message, "info"))

    # --- indexing: one walk records scopes, names, calls and comparisons --------------

    def _index(self, tree: ast.Module) -> None:
        bodies: list[tuple[list[ast.AST], _Scope]] = [(list(tree.body), self.module)]
        while bodies:
            stack, scope = bodies.pop()
            while stack:
                node = stack.pop()
                if isinstance(node, ast.Call):
                    scope.calls.append(node)
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
                _push_children(node, stack)
        self._finish()

    @staticmethod
    def _outer(scope: _Scope) -> _Scope:
        return (scope.parent or scope) if scope.kind == "class" else scope

    @staticmethod
    def _evaluated_outside(node: ast.FunctionDef | ast.AsyncFunctionDef) -> list[ast.expr]:
        defaults = [d for d in node.args.kw_defaults if d is not None]
        return [*node.decorator_list, *node.args.defaults, *defaults]

    def _enter_class(self, node: ast.ClassDef, scope: _Scope) -> _Scope:
        cls = _Scope(node.name, "class", parent=scope, node=node, report=scope.report)
        cls.is_test = node.name.startswith("Test") or any(
            (_dotted(b) or "").endswith("TestCase") for b in node.bases)
        if scope.kind == "module":
            self.classes[node.name] = cls
        self.scopes.append(cls)
        return cls

    def _enter_function(self, node: ast.FunctionDef | ast.AsyncFunctionDef,
                        scope: _Scope) -> _Scope:
        in_class = scope.kind == "class"
        name = node.name if scope.kind == "module" else f"{scope.name}.{node.name}"
        fn = _Scope(name, "function", parent=self._outer(scope),
                    cls=scope if in_class else scope.cls, node=node)
        fn.report = scope.report if scope.kind == "function" else fn
        fn.is_test = self.test_file and node.name.startswith("test") and (
            scope.kind == "module" or (in_class and scope.is_test))
        scope.funcs[node.name] = fn
        self.scopes.append(fn)
        self._bind_params(node, fn, scope)
        return fn

    def _bind_params(self, node: ast.FunctionDef | ast.AsyncFunctionDef, fn: _Scope,
                     scope: _Scope) -> None:
        args = node.args
        positional = [*args.posonlyargs, *args.args]
        defaults = {p.arg: d for p, d in zip(
            positional[len(positional) - len(args.defaults):], args.defaults, strict=True)}
        defaults.update({p.arg: d for p, d in zip(args.kwonlyargs, args.kw_defaults,
                                                  strict=True) if d is not None})
        decorators = list(node.decorator_list)
        if scope.kind == "class" and isinstance(scope.node, ast.ClassDef):
            decorators += scope.node.decorator_list  # class-level parametrize applies too
        outer = self._outer(scope)
        parametrized: set[str] = set()
        for dec in decorators:
            spec = _parametrize(dec)
            if spec is not None:
                self._pending.append(_Pending(fn, spec[0], spec[1], outer, node.lineno, "rows"))
                parametrized.update(spec[0])
        names = [p.arg for p in [*positional, *args.kwonlyargs, args.vararg, args.kwarg] if p]
        for n in names:
            if n in parametrized:
                continue
            if n in defaults:
                fn.bind(n, _Bind(node.lineno, _known(defaults[n]), outer))
            else:
                self._params.append((fn, n, node.lineno))

    def _record(self, node: ast.AST, scope: _Scope) -> None:
        if isinstance(node, ast.Compare):
            scope.compares.append(node)
        elif isinstance(node, ast.Assign):
            self._assign(node.targets, node.value, scope, node)
        elif isinstance(node, ast.AnnAssign) and node.value is not None:
            self._assign([node.target], node.value, scope, node)
        elif isinstance(node, ast.AugAssign):
            self._aug_assign(node, scope)
        elif isinstance(node, ast.NamedExpr):
            self._bind_target(node.target, node.value, scope, node.end_lineno or node.lineno)
        elif isinstance(node, (ast.For, ast.AsyncFor)):
            self._loop(node, scope)
        elif isinstance(node, (ast.With, ast.AsyncWith)):
            for item in node.items:
                if item.optional_vars is not None:
                    self._bind_target(item.optional_vars, item.context_expr, scope, node.lineno)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            self._import(node)
        elif isinstance(node, ast.Global):
            scope.globals_.update(node.names)
        elif isinstance(node, (ast.Return, ast.Yield)) and node.value is not None:
            scope.returns.append(node.value)

    def _assign(self, targets: list[ast.expr], value: ast.expr, scope: _Scope,
                stmt: ast.stmt) -> None:
        # The end line: a use inside a multi-line assignment still sees the old value.
        line = stmt.end_lineno or stmt.lineno
        for target in targets:
            self._bind_target(target, value, scope, line)
        if isinstance(value, ast.Call) and (name := _dotted(targets[0])):
            self.targets[id(value)] = name

    def _aug_assign(self, node: ast.AugAssign, scope: _Scope) -> None:
        if not isinstance(node.target, ast.Name):
            return
        previous = ast.copy_location(ast.Name(id=node.target.id, ctx=ast.Load()), node)
        combined = ast.copy_location(ast.BinOp(left=previous, op=node.op, right=node.value), node)
        self._bind_target(node.target, combined, scope, node.end_lineno or node.lineno)

    def _bind_target(self, target: ast.expr, value: ast.expr | None, scope: _Scope,
                     line: int) -> None:
        if isinstance(target, ast.Name):
            key = target.id if scope.kind != "class" else f"self.{target.id}"
            scope.bind(key, _Bind(line, _known(value), scope))
        elif isinstance(target, ast.Attribute):
            if isinstance(target.value, ast.Name) and target.value.id in ("self", "cls") \
                    and scope.cls is not None:
                scope.cls.bind(f"self.{target.attr}", _Bind(line, _known(value), scope))
        elif isinstance(target, (ast.Tuple, ast.List)):
            values: list[ast.expr | None] = [None] * len(target.elts)
            if isinstance(value, (ast.Tuple, ast.List)) and len(value.elts) == len(values) \
                    and not any(isinstance(e, ast.Starred) for e in value.elts):
                values = list(value.elts)
            for t, v in zip(target.elts, values, strict=True):
                self._bind_target(t, v, scope, line)
        elif isinstance(target, ast.Starred):
            self._bind_target(target.value, None, scope, line)

    def _loop(self, node: ast.For | ast.AsyncFor, scope: _Scope) -> None:
        names = _target_names(node.target)
        if names is None:
            self._bind_target(node.target, None, scope, node.lineno)
            return
        mode: Literal["rows", "product", "zip"] = "rows"
        it = node.iter
        if isinstance(it, ast.Call) and len(names) > 1 and len(it.args) == len(names):
            last = (_dotted(it.func) or "").rsplit(".", 1)[-1]
            mode = "product" if last == "product" else "zip" if last == "zip" else "rows"
        self._pending.append(_Pending(scope, names, it, scope, node.lineno, mode))

    def _import(self, node: ast.Import | ast.ImportFrom) -> None:
        if isinstance(node, ast.Import):
            for alias in node.names:
                top = alias.name.split(".")[0]
                self.imports[alias.asname or top] = alias.name if alias.asname else top
            return
        base = "." * node.level + (node.module or "")
        for alias in node.names:
            if alias.name == "*":
                self.star_imports.append(base)
                continue
            full = f"{base}.{alias.name}" if node.module else f"{base}{alias.name}"
            self.imports[alias.asname or alias.name] = full

    def _finish(self) -> None:
        for scope in self.scopes:
            for name in scope.globals_:
                for b in scope.binds.pop(name, []):
                    self.module.bind(name, b)
        for fn, name, line in self._params:
            fn.bind(name, self._fixture_bind(name, line) or _Bind(line, None, fn))
        self._sort_binds()
        for p in self._pending:
            self._bind_pending(p)
        self._sort_binds()
        for scope in self.scopes:
            scope.calls.sort(key=lambda c: (c.lineno, c.col_offset))

    def _sort_binds(self) -> None:
        for scope in self.scopes:
            for binds in scope.binds.values():
                binds.sort(key=lambda b: b.line)

    def _fixture_bind(self, name: str, line: int) -> _Bind | None:
        """A test parameter named after a fixture of this file takes its returned value."""
        fixture = self.module.funcs.get(name)
        if fixture is None or not _is_fixture(fixture.node) or not fixture.returns:
            return None
        return _Bind(line, fixture.returns[0], fixture)

    def _bind_pending(self, p: _Pending) -> None:
        if p.mode != "rows" and isinstance(p.source, ast.Call):
            group = next(self._groups)
            for name, arg in zip(p.names, p.source.args, strict=True):
                elements = self._elements(arg, p.source_scope) or []
                g = group if p.mode == "zip" else next(self._groups)
                p.scope.bind(name, _Bind(p.line, None, p.source_scope, tuple(elements), g))
            return
        elements = self._elements(p.source, p.source_scope) or []
        group = next(self._groups)
        if len(p.names) == 1:
            alts = tuple((_unwrap_param(e), s) for e, s in elements)
            p.scope.bind(p.names[0], _Bind(p.line, None, p.source_scope, alts, group))
            return
        rows = [(_row(e, len(p.names)), s) for e, s in elements]
        for i, name in enumerate(p.names):
            alts = tuple((r[i] if r else ast.Constant(value=None), s) for r, s in rows)
            p.scope.bind(name, _Bind(p.line, None, p.source_scope, alts, group))

    def _elements(self, expr: ast.expr, scope: _Scope,
                  depth: int = 0) -> list[tuple[ast.expr, _Scope]] | None:
        """The elements of a list written in the file, following names to it."""
        if depth > _MAX_DEPTH:
            return None
        if isinstance(expr, (ast.List, ast.Tuple, ast.Set)):
            out: list[tuple[ast.expr, _Scope]] = []
            for e in expr.elts:
                if isinstance(e, ast.Starred):
                    out += self._elements(e.value, scope, depth + 1) or []
                else:
                    out.append((e, scope))
            return out[:_MAX_ITEMS]
        if isinstance(expr, ast.Name):
            b = self.lookup(expr.id, scope, expr.lineno)
            if b is not None and b.value is not None:
                return self._elements(b.value, b.scope, depth + 1)
        if isinstance(expr, ast.BinOp) and isinstance(expr.op, ast.Add):
            left = self._elements(expr.left, scope, depth + 1)
            right = self._elements(expr.right, scope, depth + 1)
            return left + right if left is not None and right is not None else None
        if isinstance(expr, ast.Call) and _dotted(expr.func) in ("list", "tuple", "sorted") \
                and expr.args:
            return self._elements(expr.args[0], scope, depth + 1)
        return None

    # --- names ------------------------------------------------------------------

    def lookup(self, key: str, scope: _Scope, line: int) -> _Bind | None:
        """The assignment a use of `key` at `line` sees: locals before the line first."""
        if key.startswith(("self.", "cls.")):
            holder = scope.cls
            binds = holder.binds.get("self." + key.split(".", 1)[1]) if holder else None
            return _last_known(binds) if binds else None
        s: _Scope | None = scope
        while s is not None:
            binds = s.binds.get(key)
            if binds:
                if s is not scope:
                    return _last_known(binds)
                before = [b for b in binds if b.line < line]
                return before[-1] if before else binds[-1]
            s = s.parent
        return None

    def qualname(self, expr: ast.AST) -> str | None:
        """The dotted name with its first part replaced by what it was imported as."""
        dotted = _dotted(expr)
        if dotted is None:
            return None
        head, _, rest = dotted.partition(".")
        full = self.imports.get(head)
        if full is None:
            return dotted
        return f"{full}.{rest}" if rest else full

    def local_function(self, func: ast.expr, scope: _Scope) -> _Scope | None:
        if isinstance(func, ast.Name):
            s: _Scope | None = scope
            while s is not None:
                if s.kind != "class" and func.id in s.funcs:
                    return s.funcs[func.id]
                s = s.parent
        elif isinstance(func, ast.Attribute) and isinstance(func.value, ast.Name) \
                and func.value.id in ("self", "cls") and scope.cls is not None:
            return scope.cls.funcs.get(func.attr)
        return None

    def local_class(self, func: ast.expr) -> _Scope | None:
        return self.classes.get(func.id) if isinstance(func, ast.Name) else None

    # --- static evaluation --------------------------------------------------------

    def eval(self, expr: ast.expr, scope: _Scope, world: _World | None = None,
             depth: int = 0) -> object:
        """A literal value (str, int, float, tuple, _Dtype, _Glob) or None when unknown.

        Paths come out as strings; `__file__` is rooted at `_ROOT`.
        """
        if depth > _MAX_DEPTH:
            return None
        w = world or {}
        if isinstance(expr, ast.Constant):
            return expr.value if isinstance(expr.value, (str, int, float)) else None
        if isinstance(expr, ast.Name):
            return self._eval_name(expr, scope, w, depth)
        if isinstance(expr, (ast.Tuple, ast.List)):
            return tuple(self.eval(e, scope, w, depth + 1) for e in expr.elts[:_MAX_ITEMS])
        if isinstance(expr, ast.BinOp):
            return _binop(expr.op, self.eval(expr.left, scope, w, depth + 1),
                          self.eval(expr.right, scope, w, depth + 1))
        if isinstance(expr, ast.UnaryOp) and isinstance(expr.op, ast.USub):
            v = self.eval(expr.operand, scope, w, depth + 1)
            return -v if isinstance(v, (int, float)) and not isinstance(v, bool) else None
        if isinstance(expr, ast.JoinedStr):
            return self._eval_fstring(expr, scope, w, depth)
        if isinstance(expr, ast.Attribute):
            return self._eval_attribute(expr, scope, w, depth)
        if isinstance(expr, ast.Subscript):
            return self._eval_subscript(expr, scope, w, depth)
        if isinstance(expr, ast.Call):
            return self._eval_call(expr, scope, w, depth)
        return None

    def _eval_name(self, expr: ast.Name, scope: _Scope, world: _World, depth: int) -> object:
        b = self.lookup(expr.id, scope, expr.lineno)
        if b is None:
            return f"{_ROOT}/{self.rel_path}" if expr.id == "__file__" else None
        if b.alts:
            i = world.get(b.group)
            if i is None:
                return None
            value, where = b.alts[i]
            return self.eval(value, where, world, depth + 1)
        return self.eval(b.value, b.scope, world, depth + 1) if b.value is not None else None

    def _eval_fstring(self, expr: ast.JoinedStr, scope: _Scope, world: _World,
                      depth: int) -> str | None:
        parts: list[str] = []
        for v in expr.values:
            if isinstance(v, ast.Constant) and isinstance(v.value, str):
                parts.append(v.value)
                continue
            text = self._formatted(v, scope, world, depth) if isinstance(
                v, ast.FormattedValue) else None
            if text is None:
                return None
            parts.append(text)
        return "".join(parts)

    def _formatted(self, v: ast.FormattedValue, scope: _Scope, world: _World,
                   depth: int) -> str | None:
        if v.format_spec is not None:
            return None
        value = self.eval(v.value, scope, world, depth + 1)
        if not isinstance(value, (str, int, float)) or isinstance(value, bool):
            return None
        return repr(value) if v.conversion == ord("r") else str(value)

    def _eval_attribute(self, expr: ast.Attribute, scope: _Scope, world: _World,
                        depth: int) -> object:
        q = self.qualname(expr)
        if q is not None and q.startswith("torch."):
            name = _DTYPES.get(q[len("torch."):])
            return _Dtype(name) if name else None
        if expr.attr in ("parent", "name"):
            v = self.eval(expr.value, scope, world, depth + 1)
            if isinstance(v, str):
                return posixpath.dirname(v) if expr.attr == "parent" else posixpath.basename(v)
        return None

    def _eval_subscript(self, expr: ast.Subscript, scope: _Scope, world: _World,
                        depth: int) -> object:
        index = self.eval(expr.slice, scope, world, depth + 1)
        if not isinstance(index, int) or isinstance(index, bool):
            return None
        base = expr.value
        if isinstance(base, ast.Attribute) and base.attr == "parents":  # Path(...).parents[k]
            path = self.eval(base.value, scope, world, depth + 1)
            if not isinstance(path, str) or not 0 <= index < 32:
                return None
            for _ in range(index + 1):
                path = posixpath.dirname(path)
            return path
        seq = self.eval(base, scope, world, depth + 1)
        if isinstance(seq, tuple) and -len(seq) <= index < len(seq):
            return seq[index]
        return None

    def _eval_call(self, expr: ast.Call, scope: _Scope, world: _World, depth: int) -> object:
        q = self.qualname(expr.func) or ""
        args = [self.eval(a, scope, world, depth + 1) for a in expr.args[:16]]
        strings = [a for a in args if isinstance(a, str)]
        complete = len(strings) == len(args) and bool(args)
        if q in ("os.path.join", "posixpath.join", "pathlib.Path", "Path", "pathlib.PurePath",
                 "pathlib.PosixPath", "os.path.abspath", "os.path.realpath", "os.path.normpath",
                 "os.path.expanduser", "os.fspath", "str"):
            return posixpath.join(*strings) if complete else None
        if q in ("os.path.dirname", "os.path.basename") and complete:
            return posixpath.dirname(strings[0]) if q.endswith("dirname") \
                else posixpath.basename(strings[0])
        if q in ("glob.glob", "glob.iglob") and strings:
            return _Glob(strings[0])
        if q in ("tuple", "list", "torch.Size") and len(args) == 1 and isinstance(args[0], tuple):
            return args[0]
        if q == "int" and len(args) == 1 and isinstance(args[0], (int, float)):
            return int(args[0])
        if q == "getattr" and len(args) == 2 and self.qualname(expr.args[0]) == "torch" \
                and isinstance(args[1], str) and args[1] in _DTYPES:
            return _Dtype(_DTYPES[args[1]])
        if isinstance(expr.func, ast.Attribute):
            return self._eval_path_method(expr.func, strings, complete or not args,
                                          scope, world, depth)
        return None

    def _eval_path_method(self, func: ast.Attribute, args: list[str], complete: bool,
                          scope: _Scope, world: _World, depth: int) -> object:
        if not complete:
            return None
        base = self.eval(func.value, scope, world, depth + 1)
        if not isinstance(base, str):
            return None
        if func.attr in ("resolve", "absolute", "expanduser") and not args:
            return base
        if func.attr == "joinpath" and args:
            return posixpath.join(base, *args)
        if func.attr == "with_name" and len(args) == 1:
            return posixpath.join(posixpath.dirname(base), args[0])
        if func.attr in ("glob", "rglob") and len(args) == 1:
            middle = ("**",) if func.attr == "rglob" else ()
            return _Glob(posixpath.join(base, *middle, args[0]))
        return None

    # --- paths --------------------------------------------------------------------

    def resolve_path(self, value: str | _Glob, expr: ast.expr) -> str:
        """A repo-relative path for a source file named in the build."""
        is_glob = isinstance(value, _Glob)
        path = value.pattern if isinstance(value, _Glob) else value
        shown = path.replace(_ROOT, "<repo>")
        if is_glob:
            self.note(expr.lineno, f"source pattern {shown!r} is a glob; not expanded")
        if path.startswith(_ROOT):
            norm = posixpath.normpath(path)
            if norm.startswith(_ROOT + "/"):
                return self._checked(norm[len(_ROOT) + 1:], is_glob, expr)
            self.note(expr.lineno, f"source path `{_text(expr)}` leaves the repository")
            return _text(expr)
        if posixpath.isabs(path):
            self.note(expr.lineno, f"source path {path!r} is absolute; kept as written")
            return path
        local = posixpath.normpath(posixpath.join(self.pydir, path))
        if local == ".." or local.startswith("../"):
            self.note(expr.lineno, f"source path {path!r} leaves the repository")
            return path
        if is_glob or self.exists is None or self.exists(local):
            return local
        at_root = posixpath.normpath(path)
        if self.exists(at_root):
            return at_root
        self.note(expr.lineno, f"source {path!r} not found next to {self.rel_path} "
                               "or at the repository root")
        return local

    def _checked(self, rel: str, is_glob: bool, expr: ast.expr) -> str:
        if not is_glob and self.exists is not None and not self.exists(rel):
            self.note(expr.lineno, f"source {rel!r} does not exist")
        return rel

    # --- builds -------------------------------------------------------------------

    def build_kind(self, call: ast.Call) -> BuildKind | None:
        func = call.func
        last = func.attr if isinstance(func, ast.Attribute) else \
            func.id if isinstance(func, ast.Name) else None
        if isinstance(func, ast.Name) and func.id in self.imports:  # `load as jit_load`
            last = self.imports[func.id].rsplit(".", 1)[-1]
        if last in ("CUDAExtension", "CppExtension"):
            return "setup_py"
        if last == "load_inline":
            return "load_inline"
        if last != "load":
            return None
        q = self.qualname(func) or ""
        if q.endswith("cpp_extension.load"):
            return "load"
        if q == "load" and any(s.endswith("cpp_extension") for s in self.star_imports):
            return "load"
        # An unqualified `load(name=..., sources=[...])` is the JIT loader in practice.
        has_sources = any(k.arg == "sources" for k in call.keywords)
        return "load" if has_sources and not q.startswith(("torch.load", "json.")) else None

    def _builds(self) -> tuple[list[BuildRecipe], list[InlineSource]]:
        found: list[tuple[BuildRecipe, _Scope]] = []
        inline: list[InlineSource] = []
        for scope in self.scopes:
            for call in scope.calls:
                kind = self.build_kind(call)
                if kind is None:
                    continue
                recipe, sources = self._build(call, kind, scope)
                self.build_names[id(call)] = recipe.name
                scope.builds.append(recipe.name)
                found.append((recipe, scope))
                inline += sources
        builds = self._factory_variables(found)
        builds.sort(key=lambda b: b.line)
        return builds, inline

    def _build(self, call: ast.Call, kind: BuildKind,
               scope: _Scope) -> tuple[BuildRecipe, list[InlineSource]]:
        args = _call_args(call, _BUILD_PARAMS[kind])
        name = self._build_name(args.get("name"), scope, call.lineno)
        cflags, cuda_cflags = self._flags(kind, args, scope)
        defines = self._macros(args.get("define_macros"), scope) + _defines(cflags + cuda_cflags)
        inline: list[InlineSource] = []
        if kind == "load_inline":
            for language, key in _INLINE_KEYS:
                inline += self._inline(args.get(key), scope, language, name, call.lineno)
            sources = [s.path for s in inline if s.path is not None]
        else:
            sources = self._sources(args.get("sources"), scope)
        functions = self._functions(args.get("functions"), scope)
        recipe = BuildRecipe(
            kind=kind, name=name, file=self.rel_path, line=call.lineno,
            sources=_unique(sources), inline=kind == "load_inline",
            defines=tuple(dict.fromkeys(defines)), extra_cflags=tuple(cflags),
            extra_cuda_cflags=tuple(cuda_cflags), functions=functions,
            variable=self.targets.get(id(call)))
        return recipe, inline

    def _factory_variables(self, found: list[tuple[BuildRecipe, _Scope]]) -> list[BuildRecipe]:
        """`ext = _load()` at module level names what `def _load(): return load(...)` built."""
        assigned: dict[str, str] = {}
        for key, binds in self.module.binds.items():
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

    def _build_name(self, expr: ast.expr | None, scope: _Scope, line: int) -> str:
        value = self.eval(expr, scope) if expr is not None else None
        if isinstance(value, str):
            return value
        text = _text(expr) if expr is not None else "<unnamed>"
        self.note(line, f"build name `{text}` is not a static string; kept as written")
        return text

    def _items(self, expr: ast.expr, scope: _Scope,
               depth: int = 0) -> list[tuple[ast.expr, _Scope]]:
        """The elements of a list-valued expression, each with the scope it is read in."""
        if depth > _MAX_DEPTH:
            return [(expr, scope)]
        if isinstance(expr, (ast.List, ast.Tuple, ast.Set)):
            out: list[tuple[ast.expr, _Scope]] = []
            for e in expr.elts:
                if isinstance(e, ast.Starred):
                    out += self._items(e.value, scope, depth + 1)
                else:
                    out.append((e, scope))
            return out[:_MAX_ITEMS]
        if isinstance(expr, ast.Name):
            b = self.lookup(expr.id, scope, expr.lineno)
            if b is not None and b.value is not None:
                return self._items(b.value, b.scope, depth + 1)
        elif isinstance(expr, ast.BinOp) and isinstance(expr.op, ast.Add) \
                and not isinstance(self.eval(expr, scope), str):
            return self._items(expr.left, scope, depth + 1) + \
                self._items(expr.right, scope, depth + 1)
        elif isinstance(expr, ast.ListComp):
            return self._comprehension(expr, scope, depth)
        elif isinstance(expr, ast.Call) and _dotted(expr.func) in (
                "list", "tuple", "sorted", "set") and expr.args:
            return self._items(expr.args[0], scope, depth + 1)
        return [(expr, scope)]

    def _comprehension(self, comp: ast.ListComp, scope: _Scope,
                       depth: int) -> list[tuple[ast.expr, _Scope]]:
        gen = comp.generators[0]
        if len(comp.generators) != 1 or gen.ifs or not isinstance(gen.target, ast.Name):
            return [(comp, scope)]
        out: list[tuple[ast.expr, _Scope]] = []
        for element, where in self._items(gen.iter, scope, depth + 1):
            # A scope of its own binds the loop variable to this one element.
            inner = _Scope("<comprehension>", "function", parent=scope, cls=scope.cls)
            inner.bind(gen.target.id, _Bind(0, element, where))
            out.append((comp.elt, inner))
        return out

    def _strings(self, expr: ast.expr | None, scope: _Scope, what: str) -> list[str]:
        if _known(expr) is None or expr is None:
            return []
        out: list[str] = []
        for e, where in self._items(expr, scope):
            value = self.eval(e, where)
            if isinstance(value, str):
                out.append(value)
            else:
                self.note(e.lineno, f"{what} entry `{_text(e)}` is not a static string; "
                                    "left out")
        return out

    def _sources(self, expr: ast.expr | None, scope: _Scope) -> list[str]:
        if expr is None:
            return []
        out: list[str] = []
        for e, where in self._items(expr, scope):
            value = self.eval(e, where)
            if isinstance(value, (str, _Glob)):
                out.append(self.resolve_path(value, e))
            else:
                out.append(_text(e))
                self.note(e.lineno, f"source `{_text(e)}` is not a static path; "
                                    "kept as written")
        return out

    def _flags(self, kind: BuildKind, args: dict[str, ast.expr],
               scope: _Scope) -> tuple[list[str], list[str]]:
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

    def _dict(self, expr: ast.expr, scope: _Scope,
              depth: int) -> tuple[dict[str, ast.expr], _Scope] | None:
        if depth > _MAX_DEPTH:
            return None
        if isinstance(expr, ast.Dict):
            return {k.value: v for k, v in zip(expr.keys, expr.values, strict=True)
                    if isinstance(k, ast.Constant) and isinstance(k.value, str)}, scope
        if isinstance(expr, ast.Call) and _dotted(expr.func) == "dict":
            return {k.arg: k.value for k in expr.keywords if k.arg}, scope
        if isinstance(expr, ast.Name):
            b = self.lookup(expr.id, scope, expr.lineno)
            if b is not None and b.value is not None:
                return self._dict(b.value, b.scope, depth + 1)
        return None

    def _macros(self, expr: ast.expr | None, scope: _Scope) -> list[tuple[str, str]]:
        if expr is None:
            return []
        out: list[tuple[str, str]] = []
        for e, where in self._items(expr, scope):
            value = self.eval(e, where)
            if isinstance(value, tuple) and len(value) == 2 and isinstance(value[0], str):
                out.append((value[0], "" if value[1] is None else str(value[1])))
            else:
                self.note(e.lineno, f"define_macros entry `{_text(e)}` is not static; left out")
        return out

    def _functions(self, expr: ast.expr | None, scope: _Scope) -> tuple[str, ...]:
        if expr is None:
            return ()
        found = self._dict(expr, scope, 0)
        if found is not None:
            return tuple(found[0])
        return tuple(self._strings(expr, scope, "functions"))

    # --- inline sources -----------------------------------------------------------

    def _inline(self, expr: ast.expr | None, scope: _Scope, language: Literal["cpp", "cuda"],
                build: str, line: int) -> list[InlineSource]:
        if _known(expr) is None or expr is None:
            return []
        out: list[InlineSource] = []
        for item in self._source_items(expr, scope, 0):
            if isinstance(item, _Piece):
                if item.text.strip():  # `cpp_sources=""` holds no code
                    out.append(InlineSource(build, language, item.text, item.offset))
            elif isinstance(item, _FileRead):
                out.append(InlineSource(build, language, None, 0, item.path))
            else:
                self.note(line, f"load_inline {build!r}: {language} source `{item.text}` "
                                "is neither a string literal nor a file read; left out")
        return out

    def _source_items(self, expr: ast.expr, scope: _Scope, depth: int) -> list[_SourceItem]:
        if depth > _MAX_DEPTH:
            return [_Unresolved(_text(expr))]
        if isinstance(expr, (ast.List, ast.Tuple)):
            return [i for e in expr.elts for i in self._source_items(e, scope, depth + 1)]
        if isinstance(expr, ast.Name):
            b = self.lookup(expr.id, scope, expr.lineno)
            if b is not None and b.value is not None:
                return self._source_items(b.value, b.scope, depth + 1)
            return [_Unresolved(expr.id)]
        pieces = self._pieces(expr, scope, depth)
        if pieces is not None:
            return list(pieces)
        read = self._file_read(expr, scope)
        return [read if read is not None else _Unresolved(_text(expr))]

    def _pieces(self, expr: ast.expr, scope: _Scope, depth: int) -> list[_Piece] | None:
        """A string expression as literal pieces, each mapped to its line in the file."""
        if depth > _MAX_DEPTH:
            return None
        if isinstance(expr, ast.Constant) and isinstance(expr.value, str):
            return [_Piece(expr.value, _literal_offset(expr, expr.value))]
        if isinstance(expr, ast.JoinedStr):
            return [_Piece(self._fstring_source(expr, scope), expr.lineno - 1)]
        if isinstance(expr, ast.Name):
            b = self.lookup(expr.id, scope, expr.lineno)
            if b is None or b.value is None:
                return None
            return self._pieces(b.value, b.scope, depth + 1)
        if isinstance(expr, ast.BinOp) and isinstance(expr.op, ast.Add):
            pieces: list[_Piece] = []
            for operand in _added(expr):  # a long `"..." + "..."` chain is one level
                found = self._pieces(operand, scope, depth + 1)
                if found is None:
                    return None
                pieces += found
            return _merge(pieces)
        if isinstance(expr, ast.Call):
            return self._transformed(expr, scope, depth)
        return None

    def _transformed(self, call: ast.Call, scope: _Scope, depth: int) -> list[_Piece] | None:
        """`textwrap.dedent(s)` and `s.strip()` keep (or shift) the line mapping."""
        func = call.func
        if isinstance(func, ast.Attribute) and func.attr in ("strip", "lstrip", "rstrip"):
            chars = self.eval(call.args[0], scope) if call.args else None
            if call.args and not (isinstance(chars, str) and chars.isspace()):
                return None
            inner = self._pieces(func.value, scope, depth + 1)
            return _strip_pieces(inner, func.attr, chars if isinstance(chars, str) else None) \
                if inner else None
        if self.qualname(func) in ("textwrap.dedent", "dedent") and len(call.args) == 1:
            inner = self._pieces(call.args[0], scope, depth + 1)
            return [_Piece(textwrap.dedent(p.text), p.offset) for p in inner] if inner else None
        return None

    def _fstring_source(self, expr: ast.JoinedStr, scope: _Scope) -> str:
        parts: list[str] = []
        for v in expr.values:
            if isinstance(v, ast.Constant) and isinstance(v.value, str):
                parts.append(v.value)
            elif isinstance(v, ast.FormattedValue):
                text = self._formatted(v, scope, {}, 0)
                if text is None:
                    text = "{" + _text(v.value) + "}"
                    self.note(expr.lineno, f"placeholder {text} in an inline source is not a "
                                           "static value; kept as written")
                parts.append(text)
        return "".join(parts)

    def _file_read(self, expr: ast.expr, scope: _Scope) -> _FileRead | _Unresolved | None:
        """`open(p).read()`, `Path(p).read_text()` and `f.read()` of `with open(p) as f`."""
        if not isinstance(expr, ast.Call) or not isinstance(expr.func, ast.Attribute):
            return None
        target = expr.func.value
        path: tuple[ast.expr, _Scope] | None = None
        if expr.func.attr == "read_text":
            path = (target, scope)
        elif expr.func.attr == "read":
            path = self._opened(target, scope)
        if path is None:
            return None
        value = self.eval(path[0], path[1])
        if isinstance(value, str):
            return _FileRead(self.resolve_path(value, path[0]))
        return _Unresolved(_text(expr))

    def _opened(self, target: ast.expr, scope: _Scope) -> tuple[ast.expr, _Scope] | None:
        if isinstance(target, ast.Name):
            b = self.lookup(target.id, scope, target.lineno)
            if b is None or b.value is None:
                return None
            target, scope = b.value, b.scope
        if isinstance(target, ast.Call) and target.args and self.qualname(target.func) in (
                "open", "io.open", "codecs.open"):
            return target.args[0], scope
        return None

    # --- ops: calls that reach an extension ------------------------------------------

    def op_of_call(self, call: ast.Call, scope: _Scope, depth: int = 0) -> _Op | None:
        if depth:
            return self._op(call, scope, depth)
        key = id(call)
        if key not in self._op_cache:
            self._op_cache[key] = self._op(call, scope, 0)
        return self._op_cache[key]

    def _op(self, call: ast.Call, scope: _Scope, depth: int) -> _Op | None:
        func = call.func
        if isinstance(func, ast.Attribute):
            return self._attr_op(call, func, scope, scope, depth)
        if isinstance(func, ast.Name):
            return self._name_op(call, func, scope, depth)
        if isinstance(func, ast.Call):  # MyModule(...)(x)
            cls = self.local_class(func.func)
            return self._wrapped(cls.funcs.get("forward") if cls else None, call, scope, depth)
        return None

    def _attr_op(self, call: ast.Call, func: ast.Attribute, scope: _Scope, site: _Scope,
                 depth: int) -> _Op | None:
        q = self.qualname(func)
        if q is not None and q.startswith("torch.ops."):
            parts = q.split(".")
            if len(parts) < 4 or parts[2] in _TORCH_NAMESPACES:
                return None
            return _Op(_text(func), parts[3], parts[2], 0.9, call, site)
        base = func.value
        cls = self.local_class(base)
        if cls is not None and func.attr == "apply":  # autograd.Function subclass
            return self._wrapped(cls.funcs.get("forward"), call, site, depth)
        method = self.local_function(func, scope)
        if method is not None:
            return self._wrapped(method, call, site, depth)
        ext = self._extension(base, scope, depth)
        if ext is None or (ext[1] < 0.9 and _REFERENCE_NAME.search(func.attr)):
            return None
        return _Op(_text(func), func.attr, ext[0], ext[1], call, site)

    def _name_op(self, call: ast.Call, func: ast.Name, scope: _Scope, depth: int) -> _Op | None:
        b = self.lookup(func.id, scope, func.lineno)
        if b is not None:
            return self._bound_op(call, b, scope, depth)
        fn = self.local_function(func, scope)
        if fn is not None:
            return self._wrapped(fn, call, scope, depth)
        full = self.imports.get(func.id)
        if full is None or full.split(".")[0] in _WELL_KNOWN:
            return None
        op_name = full.rsplit(".", 1)[-1]
        if _REFERENCE_NAME.search(op_name):
            return None
        module = full[: full.rfind(".")] if "." in full.lstrip(".") else ""
        hint = module.rsplit(".", 1)[-1] or None
        confidence = 0.7 if module and self._is_local_python(module) else 0.8
        return _Op(func.id, op_name, hint, confidence, call, scope)

    def _bound_op(self, call: ast.Call, b: _Bind, site: _Scope, depth: int) -> _Op | None:
        """`f = ext.softmax; f(x)`, `m = MyModule(); m(x)` and `f = lambda x: ext.f(x)`."""
        value = b.value
        if isinstance(value, ast.Attribute) and depth < 2:
            return self._attr_op(call, value, b.scope, site, depth + 1)
        if isinstance(value, ast.Call) and depth == 0:
            cls = self.local_class(value.func)
            return self._wrapped(cls.funcs.get("forward") if cls else None, call, site, depth)
        if isinstance(value, ast.Lambda) and depth == 0:
            for node in ast.walk(value.body):
                if isinstance(node, ast.Call) and (op := self.op_of_call(node, b.scope, 1)):
                    return replace(op, call=call, scope=site)
        return None

    def _wrapped(self, fn: _Scope | None, call: ast.Call, site: _Scope,
                 depth: int) -> _Op | None:
        """A local function (one level deep) that calls an op stands for that op."""
        if fn is None or depth > 0:
            return None
        inner = self._first_op(fn)
        return replace(inner, call=call, scope=site) if inner is not None else None

    def _first_op(self, fn: _Scope) -> _Op | None:
        key = id(fn)
        if key not in self._first_op_cache:
            self._first_op_cache[key] = next(
                (op for c in fn.calls if (op := self.op_of_call(c, fn, 1))), None)
        return self._first_op_cache[key]

    def _extension(self, base: ast.expr, scope: _Scope,
                   depth: int) -> tuple[str | None, float] | None:
        """(module hint, confidence) when `base` denotes a loaded extension module."""
        if depth > 4:
            return None
        if isinstance(base, ast.Call):
            return self._extension_value(base, scope, depth + 1)
        dotted = _dotted(base)
        if dotted is None:
            return None
        if "." not in dotted or dotted.startswith(("self.", "cls.")):
            b = self.lookup(dotted, scope, base.lineno)
            if b is not None:
                return self._extension_value(b.value, b.scope, depth + 1) if b.value else None
        q = self.qualname(base)
        if q is None or dotted.split(".")[0] not in self.imports:
            return None
        return self._extension_module(q)

    def _extension_module(self, q: str) -> tuple[str | None, float] | None:
        parts = q.split(".")
        if q.startswith("torch.ops.") and len(parts) == 3:
            return None if parts[2] in _TORCH_NAMESPACES else (parts[2], 0.9)
        if not q.startswith(".") and parts[0] in _WELL_KNOWN:
            return None
        # A local .py module (or a name defined in one) is a helper around the extension.
        return parts[-1] or None, 0.7 if self._is_local_python(q) else 0.9

    def _extension_value(self, value: ast.expr, scope: _Scope,
                         depth: int) -> tuple[str | None, float] | None:
        if isinstance(value, (ast.Name, ast.Attribute)):
            return self._extension(value, scope, depth + 1)
        if not isinstance(value, ast.Call) or depth > 6:
            return None
        if self.build_kind(value) in ("load", "load_inline"):
            return self.build_names.get(id(value)), 0.9
        fn = self.local_function(value.func, scope)
        if fn is not None:
            return self._factory(fn, depth)
        q = self.qualname(value.func) or ""
        if q in ("importlib.import_module", "pytest.importorskip") and value.args:
            name = self.eval(value.args[0], scope)
            return (name.rsplit(".", 1)[-1], 0.9) if isinstance(name, str) else None
        head = _head(value.func)
        if head in self.imports and "." in q.lstrip(".") and q.split(".")[0] not in _WELL_KNOWN:
            module = q[: q.rfind(".")]  # `helper.get_ext()`: an extension from a helper module
            return module.rsplit(".", 1)[-1] or None, 0.7
        return None

    def _factory(self, fn: _Scope, depth: int) -> tuple[str | None, float] | None:
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
            base = self.pydir
            for _ in range(level - 1):
                base = posixpath.dirname(base)
            candidates = [posixpath.join(base, rel)]
        else:
            candidates = [posixpath.join(self.pydir, rel), rel]
        exists = self.exists
        return exists is not None and any(
            exists(c + ".py") or exists(c + "/__init__.py") for c in candidates)

    # --- reference tests --------------------------------------------------------------

    def _references(self) -> list[ReferenceTest]:
        callers = self._test_callers() if self.test_file else {}
        best: dict[tuple[str, str], ReferenceTest] = {}
        for scope in self.scopes:
            if scope.kind == "class" or not (scope.calls or scope.compares):
                continue
            for cmp in self._comparisons(scope):
                pairing = self._pair(cmp, scope)
                if pairing is None:
                    continue
                for kind, test, where in self._attribution(scope, callers):
                    ref = self._reference(pairing, cmp, kind, test, where)
                    old = best.get((test, ref.op))
                    if old is None or ref.confidence > old.confidence:
                        best[(test, ref.op)] = ref
        return sorted(best.values(), key=lambda r: (r.line, r.test, r.op))

    def _test_callers(self) -> dict[str, list[_Scope]]:
        """Helper function name -> the test scopes that call it."""
        callers: dict[str, list[_Scope]] = {}
        for scope in self.scopes:
            top = scope.report
            if scope.kind != "function" or top is None or not top.is_test:
                continue
            for call in scope.calls:
                fn = self.local_function(call.func, scope)
                if fn is not None and fn.report is fn and not fn.is_test:
                    tests = callers.setdefault(fn.name, [])
                    if top not in tests:
                        tests.append(top)
        return callers

    def _attribution(self, scope: _Scope, callers: dict[str, list[_Scope]]
                     ) -> list[tuple[Literal["pytest", "script"], str, _Scope]]:
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

    def _reference(self, pairing: _Pairing, cmp: _Cmp, kind: Literal["pytest", "script"],
                   test: str, scope: _Scope) -> ReferenceTest:
        op = pairing.op
        shapes, dtypes = self._inputs(op.call, op.scope, scope)
        shown = _clip(pairing.reference, 60) if pairing.reference else "an unclear reference"
        why = f"{test} compares {op.text} with {shown} via {cmp.kind}"
        return ReferenceTest(
            file=self.rel_path, line=cmp.line, test=test, kind=kind, op=op.text,
            op_name=op.name, module_hint=op.hint, reference=pairing.reference,
            comparison=cmp.kind, shapes=shapes, dtypes=dtypes, why=why,
            confidence=round(min(max(pairing.confidence, 0.0), 1.0), 2))

    # --- comparisons ------------------------------------------------------------------

    def _comparisons(self, scope: _Scope) -> list[_Cmp]:
        found = [c for call in scope.calls if (c := self._compare_call(call, scope))]
        found += [c for node in scope.compares if (c := self._abs_max_compare(node, scope))]
        return sorted(found, key=lambda c: c.line)

    def _compare_call(self, call: ast.Call, scope: _Scope) -> _Cmp | None:
        func = call.func
        q = self.qualname(func) or ""
        if q == "assert_close":  # a bare name from a star import
            q = "torch.testing.assert_close"
        elif q.startswith("np."):  # `np` used without an import seen here
            q = "numpy." + q[3:]
        if q in _COMPARE_FUNCS:
            operands = _operands(call)
            return _Cmp(q, *operands, scope, call.lineno) if operands else None
        if isinstance(func, ast.Attribute) and func.attr in ("allclose", "equal") \
                and call.args and _head(func) not in self.imports:
            return _Cmp(f"torch.{func.attr}", func.value, call.args[0], scope, call.lineno)
        return None

    def _abs_max_compare(self, node: ast.Compare, scope: _Scope) -> _Cmp | None:
        """`(a - b).abs().max() < tol`, either way round, in an assert, an if or anywhere."""
        if len(node.ops) != 1 or not isinstance(node.ops[0], (ast.Lt, ast.LtE, ast.Gt, ast.GtE)):
            return None
        for side in (node.left, node.comparators[0]):
            found = self._abs_max_diff(side, scope)
            if found is not None:
                return _Cmp("abs-max-diff", found[0], found[1], found[2], node.lineno)
        return None

    def _follow(self, expr: ast.expr, scope: _Scope) -> tuple[ast.expr, _Scope]:
        for _ in range(3):
            if not isinstance(expr, ast.Name):
                break
            b = self.lookup(expr.id, scope, expr.lineno)
            if b is None or b.value is None:
                break
            expr, scope = b.value, b.scope
        return expr, scope

    def _abs_max_diff(self, expr: ast.expr,
                      scope: _Scope) -> tuple[ast.expr, ast.expr, _Scope] | None:
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
        """x for `x.max()` / `x.amax()` / `torch.max(x)`."""
        if not isinstance(expr, ast.Call):
            return None
        func = expr.func
        if isinstance(func, ast.Attribute) and func.attr in ("max", "amax") and not expr.args \
                and self.qualname(func) not in ("torch.max", "torch.amax"):
            return func.value
        if self.qualname(func) in ("torch.max", "torch.amax") and len(expr.args) == 1:
            return expr.args[0]
        return None

    def _abs_of(self, expr: ast.expr) -> ast.expr | None:
        if not isinstance(expr, ast.Call):
            return None
        func = expr.func
        if isinstance(func, ast.Attribute) and func.attr == "abs" and not expr.args \
                and self.qualname(func) != "torch.abs":
            return func.value
        if self.qualname(func) in ("torch.abs", "abs") and len(expr.args) == 1:
            return expr.args[0]
        return None

    # --- pairing an op with its reference ----------------------------------------------

    def _pair(self, cmp: _Cmp, scope: _Scope) -> _Pairing | None:
        a, b = self._side(cmp.a, cmp.scope), self._side(cmp.b, cmp.scope)
        best_a, best_b = _best(a), _best(b)
        if best_a is not None or best_b is not None:
            return self._pair_ops(cmp, (a, best_a), (b, best_b))
        for out, other, other_expr in ((cmp.a, b, cmp.b), (cmp.b, a, cmp.a)):
            op = self._out_param(out, cmp.scope)
            if op is not None:  # `ext.f(x, out)` writes `out`, which is then compared
                confidence = op.confidence - 0.1 if other.pure else 0.5
                return _Pairing(op, self._ref_text(other_expr, cmp.scope), confidence)
        ops = self._scope_ops(scope)
        if not ops:
            return None
        # An op is called here, but neither operand is seen to come from it.
        ref_expr = cmp.b if b.pure else cmp.a if a.pure else None
        ref = self._ref_text(ref_expr, cmp.scope) if ref_expr is not None else None
        return _Pairing(ops[0], ref, 0.5)

    def _pair_ops(self, cmp: _Cmp, a: tuple[_Side, tuple[int, _Op] | None],
                  b: tuple[_Side, tuple[int, _Op] | None]) -> _Pairing:
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

    def _side(self, expr: ast.expr, scope: _Scope) -> _Side:
        """Ops and torch calls an operand is computed from, following assignments.

        A name passed as an argument is followed too, but what is found behind it is
        marked indirect: `torch.softmax(x)` is a reference even if `x` came from a helper.
        """
        side = _Side()
        stack: list[tuple[ast.AST, _Scope, bool, bool, int]] = [(expr, scope, True, False, 0)]
        seen: set[int] = set()
        while stack:
            node, sc, direct, in_arg, depth = stack.pop()
            if isinstance(node, ast.Call):
                self._side_call(node, sc, direct, in_arg, depth, side, stack)
            elif isinstance(node, ast.Name):
                b = self.lookup(node.id, sc, node.lineno)
                if depth < 4 and b is not None and b.value is not None and id(b) not in seen:
                    seen.add(id(b))
                    stack.append((b.value, b.scope, direct and not in_arg, False, depth + 1))
            elif isinstance(node, ast.BinOp):
                side.evidence = True
                stack += [(node.right, sc, direct, in_arg, depth),
                          (node.left, sc, direct, in_arg, depth)]
            else:
                stack += [(c, sc, direct, in_arg, depth) for c in _operand_children(node)]
        return side

    def _side_call(self, call: ast.Call, scope: _Scope, direct: bool, in_arg: bool,
                   depth: int, side: _Side,
                   stack: list[tuple[ast.AST, _Scope, bool, bool, int]]) -> None:
        op = self.op_of_call(call, scope)
        if op is not None:
            side.ops.append((op, direct))
            return
        kind = self._call_kind(call, scope)
        if kind in ("torch", "ref"):
            side.evidence = True
        elif kind == "unknown" and direct and not in_arg:
            side.unknown = True
        args = [*call.args, *(k.value for k in call.keywords)]
        stack += [(a, scope, direct, True, depth) for a in reversed(args)]
        if isinstance(call.func, ast.Attribute):
            stack.append((call.func.value, scope, direct, in_arg, depth))

    def _call_kind(self, call: ast.Call, scope: _Scope) -> str:
        """torch (a torch/numpy computation or tensor method), ref (a local pure function
        or an imported reference), neutral (a builtin or utility library) or unknown."""
        func = call.func
        fn = self.local_function(func, scope)
        if fn is not None:
            return "ref" if self._first_op(fn) is None else "unknown"
        if isinstance(func, ast.Name):
            if func.id in self.classes:
                return "ref"
            b = self.lookup(func.id, scope, func.lineno)
            if b is not None:
                return "torch" if b.value is not None and self._torchy(b.value, b.scope) \
                    else "unknown"
            full = self.imports.get(func.id)
            if full is None:
                return "neutral" if func.id in _BUILTINS else "unknown"
            return _import_kind(full)
        if isinstance(func, ast.Attribute):
            head = _head(func)
            if head is not None and head in self.imports \
                    and self.lookup(head, scope, func.lineno) is None:
                return _import_kind(self.qualname(func) or "")
            return "torch"  # a method on a value: a tensor method in practice
        return "unknown"

    def _torchy(self, value: ast.expr, scope: _Scope) -> bool:
        """A name bound to a torch module (`torch.nn.LayerNorm(8).cuda()`) or a lambda."""
        if isinstance(value, ast.Lambda):
            return not any(isinstance(n, ast.Call) and self.op_of_call(n, scope, 1)
                           for n in ast.walk(value.body))
        while isinstance(value, ast.Call) and isinstance(value.func, ast.Attribute) \
                and isinstance(value.func.value, ast.Call):
            value = value.func.value
        if not isinstance(value, ast.Call):
            return False
        if self.local_class(value.func) is not None:
            return True
        return (self.qualname(value.func) or "").split(".")[0] in _REFERENCE_LIBS

    def _ref_text(self, expr: ast.expr, scope: _Scope) -> str:
        """The reference as written, after the assignments and dtype/device moves."""
        for _ in range(_MAX_DEPTH):
            if isinstance(expr, ast.Call) and isinstance(expr.func, ast.Attribute) \
                    and expr.func.attr in _RESULT_WRAPPERS:
                expr = expr.func.value
                continue
            if isinstance(expr, ast.Name):
                b = self.lookup(expr.id, scope, expr.lineno)
                if b is not None and b.value is not None:
                    expr, scope = b.value, b.scope
                    continue
            break
        if isinstance(expr, ast.Call) and self._call_kind(expr, scope) == "ref":
            name = _dotted(expr.func)
            if name is not None:
                return name
        return _text(expr)

    def _out_param(self, expr: ast.expr, scope: _Scope) -> _Op | None:
        while isinstance(expr, ast.Call) and isinstance(expr.func, ast.Attribute) \
                and expr.func.attr in _RESULT_WRAPPERS:
            expr = expr.func.value
        if not isinstance(expr, ast.Name):
            return None
        b = self.lookup(expr.id, scope, expr.lineno)
        if b is None or not isinstance(b.value, ast.Call) or not self._is_alloc(b.value):
            return None
        for op in self._scope_ops(scope):
            args = [*op.call.args, *(k.value for k in op.call.keywords)]
            if any(isinstance(a, ast.Name) and a.id == expr.id for a in args):
                return op
        return None

    def _is_alloc(self, call: ast.Call) -> bool:
        if self.qualname(call.func) in _ALLOC:
            return True
        return isinstance(call.func, ast.Attribute) and call.func.attr in _ALLOC_METHODS

    def _scope_ops(self, scope: _Scope) -> list[_Op]:
        return [op for c in scope.calls if (op := self.op_of_call(c, scope))]

    # --- inputs: shapes and dtypes ------------------------------------------------------

    def _inputs(self, call: ast.Call, scope: _Scope,
                fallback: _Scope) -> tuple[tuple[str, ...], tuple[str, ...]]:
        dtypes: list[str] = []
        creations = self._creations(call, scope, dtypes)
        if not creations:  # inputs passed in another way: any tensor created in the test
            creations = [(c, fallback) for c in fallback.calls
                         if self.qualname(c.func) in _CREATION]
        shapes: list[str] = []
        for c, where in creations:
            shapes += self._shapes(c, where)
            dtype = next((k.value for k in c.keywords if k.arg == "dtype"), None)
            if dtype is not None:
                dtypes += self._dtypes(dtype, where)
        return _unique(shapes), _unique(dtypes)

    def _creations(self, call: ast.Call, scope: _Scope,
                   dtypes: list[str]) -> list[tuple[ast.Call, _Scope]]:
        """The torch.randn(...)-like calls that the op's arguments come from."""
        out: list[tuple[ast.Call, _Scope]] = []
        args = [*call.args, *(k.value for k in call.keywords)]
        stack: list[tuple[ast.expr, _Scope, int]] = [(a, scope, 0) for a in reversed(args)]
        seen: set[int] = set()
        while stack:
            expr, sc, depth = stack.pop()
            if isinstance(expr, ast.Name) and depth < 4:
                b = self.lookup(expr.id, sc, expr.lineno)
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

    def _trace_call(self, call: ast.Call, scope: _Scope, depth: int,
                    out: list[tuple[ast.Call, _Scope]], dtypes: list[str],
                    stack: list[tuple[ast.expr, _Scope, int]]) -> None:
        q = self.qualname(call.func) or ""
        if q in _CREATION:
            out.append((call, scope))
            return
        func = call.func
        if q in _LIKE and call.args:
            dtypes += [d for k in call.keywords if k.arg == "dtype"
                       for d in self._dtypes(k.value, scope)]
            stack.append((call.args[0], scope, depth))
        elif isinstance(func, ast.Attribute) and func.attr in _TENSOR_WRAPPERS:
            if func.attr in _DTYPE_METHODS and not call.args:
                dtypes.append(_DTYPE_METHODS[func.attr])
            elif func.attr == "to":
                dtypes += [d for a in [*call.args, *(k.value for k in call.keywords)]
                           for d in self._dtypes(a, scope)]
            stack.append((func.value, scope, depth))

    def _dtypes(self, expr: ast.expr, scope: _Scope) -> list[str]:
        out: list[str] = []
        for world in self._worlds([expr], scope):
            value = self.eval(expr, scope, world)
            if isinstance(value, _Dtype) and value.name not in out:
                out.append(value.name)
        return out

    def _shapes(self, call: ast.Call, scope: _Scope) -> list[str]:
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
        q = self.qualname(call.func)
        if q in ("torch.full", "torch.empty_strided"):
            return positional[:1]
        if q == "torch.randint":
            return positional[-1:] if len(positional) >= 2 else []
        return positional

    def _shape_text(self, dims: list[ast.expr], scope: _Scope, world: _World) -> str | None:
        if len(dims) > 1:
            return _fmt_shape([self._dim(d, scope, world) for d in dims])
        seq = self._literal_seq(dims[0], scope, world, 0)
        if seq is not None:
            return _fmt_shape([self._dim(d, seq[1], world) for d in seq[0]])
        value = self.eval(dims[0], scope, world)
        if isinstance(value, int) and not isinstance(value, bool):
            return _fmt_shape([str(value)])
        if isinstance(value, tuple) and value and all(
                isinstance(v, int) and not isinstance(v, bool) for v in value):
            return _fmt_shape([str(v) for v in value])
        return None

    def _dim(self, expr: ast.expr, scope: _Scope, world: _World) -> str:
        value = self.eval(expr, scope, world)
        if isinstance(value, int) and not isinstance(value, bool):
            return str(value)
        return _text(expr, 40)

    def _literal_seq(self, expr: ast.expr, scope: _Scope, world: _World,
                     depth: int) -> tuple[list[ast.expr], _Scope] | None:
        """The tuple/list literal a shape argument is written as, following names."""
        if depth > _MAX_DEPTH:
            return None
        if isinstance(expr, (ast.Tuple, ast.List)):
            return list(expr.elts), scope
        if isinstance(expr, ast.Call) and self.qualname(expr.func) in (
                "torch.Size", "tuple", "list") and len(expr.args) == 1:
            return self._literal_seq(expr.args[0], scope, world, depth + 1)
        if not isinstance(expr, ast.Name):
            return None
        b = self.lookup(expr.id, scope, expr.lineno)
        if b is None:
            return None
        if b.alts:
            i = world.get(b.group)
            return None if i is None else self._literal_seq(*b.alts[i], world, depth + 1)
        return self._literal_seq(b.value, b.scope, world, depth + 1) if b.value else None

    def _worlds(self, exprs: list[ast.expr], scope: _Scope) -> list[_World]:
        """Every combination of the parametrize/loop alternatives the expressions use."""
        groups: dict[int, int] = {}
        stack = [(e, scope, 0) for e in exprs]
        while stack:
            expr, sc, depth = stack.pop()
            for node in ast.walk(expr):
                if not isinstance(node, ast.Name):
                    continue
                b = self.lookup(node.id, sc, node.lineno)
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


# Nodes that hold nothing the index records; the walk does not visit them.
_LEAVES = frozenset({ast.Name, ast.Constant, ast.alias} | {
    cls for base in (ast.expr_context, ast.operator, ast.unaryop, ast.cmpop, ast.boolop)
    for cls in base.__subclasses__()})
_RECORDED = frozenset({ast.Compare, ast.Assign, ast.AnnAssign, ast.AugAssign, ast.NamedExpr,
                       ast.For, ast.AsyncFor, ast.With, ast.AsyncWith, ast.Import,
                       ast.ImportFrom, ast.Global, ast.Return, ast.Yield})


# Fields that hold names, operators or annotations: nothing the index records.
_SKIPPED_FIELDS = frozenset({"ctx", "op", "ops", "id", "attr", "arg", "name", "names", "module",
                             "level", "asname", "conversion", "kind", "type_comment",
                             "is_async", "annotation", "returns", "type_ignores", "tag"})
_CHILD_FIELDS: dict[type, tuple[str, ...]] = {}


def _push_children(node: ast.AST, stack: list[ast.AST]) -> None:
    """`ast.iter_child_nodes` without the leaves: the index walk is most of a file's cost."""
    fields = _CHILD_FIELDS.get(type(node))
    if fields is None:
        fields = tuple(f for f in node._fields if f not in _SKIPPED_FIELDS)
        _CHILD_FIELDS[type(node)] = fields
    for name in fields:
        value = getattr(node, name, None)
        if type(value) is list:
            stack.extend([v for v in value if type(v) not in _LEAVES and isinstance(v, ast.AST)])
        elif type(value) not in _LEAVES and isinstance(value, ast.AST):
            stack.append(value)


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


def _import_kind(full: str) -> str:
    top = full.lstrip(".").split(".")[0]
    if top in _REFERENCE_LIBS:
        return "torch"
    if _REFERENCE_NAME.search(full.rsplit(".", 1)[-1]):
        return "ref"
    return "neutral" if top in _WELL_KNOWN else "unknown"


def _best(side: _Side) -> tuple[int, _Op] | None:
    """The side's most convincing op: reached directly first, then resolved firmly."""
    best: tuple[int, _Op] | None = None
    for op, direct in side.ops:
        score = 2 * direct + (op.confidence >= 0.9)
        if best is None or score > best[0]:
            best = (score, op)
    return best
