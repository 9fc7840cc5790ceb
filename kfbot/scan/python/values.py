"""Static evaluation of Python expressions, and the repository paths they name.

Values are what can be read without running the file: strings, numbers, tuples, torch
dtypes and glob patterns, with names followed through their assignments and, for names
that take several values, one chosen alternative per group (a `World`). Paths come out
as strings and are resolved to repo-relative paths for builds.
"""

from __future__ import annotations

import ast
import posixpath
from collections.abc import Callable
from dataclasses import dataclass

from kfbot.scan.model import Problem
from kfbot.scan.python.scopes import MAX_DEPTH, MAX_ITEMS, Scope, ScopeIndex, World
from kfbot.scan.python.syntax import as_written

# `__file__` evaluates to a path under this marker so that paths built from it come out
# repo-relative; a NUL byte cannot occur in a real path.
_ROOT = "/\0repo"

_DTYPES = {
    "float16": "float16", "half": "float16", "float32": "float32", "float": "float32",
    "float64": "float64", "double": "float64", "bfloat16": "bfloat16", "int8": "int8",
    "uint8": "uint8", "int16": "int16", "short": "int16", "int32": "int32", "int": "int32",
    "int64": "int64", "long": "int64", "bool": "bool", "complex64": "complex64",
    "cfloat": "complex64", "complex128": "complex128", "cdouble": "complex128",
    "float8_e4m3fn": "float8_e4m3fn", "float8_e5m2": "float8_e5m2",
}


_OS_CONSTANTS = {"os.curdir": ".", "os.path.curdir": ".", "os.pardir": "..",
                 "os.path.pardir": "..", "os.sep": "/", "os.path.sep": "/"}
_PATH_FUNCTIONS = frozenset({
    "os.path.join", "posixpath.join", "pathlib.Path", "Path", "pathlib.PurePath",
    "pathlib.PosixPath", "os.path.abspath", "os.path.realpath", "os.path.normpath",
    "os.path.expanduser", "os.fspath", "str"})


@dataclass(frozen=True)
class Dtype:
    name: str


@dataclass(frozen=True)
class Glob:
    pattern: str


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


class Evaluator:
    """Values of the expressions of one file, and the repo-relative paths they name.

    `exists(rel)` says whether a repo-relative path exists (None: assume it does).
    `note` collects the file's info Problems: what its readers could not resolve.
    """

    def __init__(self, index: ScopeIndex, exists: Callable[[str], bool] | None) -> None:
        self.index = index
        self.exists = exists
        self.problems: list[Problem] = []

    def note(self, line: int | None, message: str) -> None:
        self.problems.append(Problem(self.index.rel_path, line, message, "info"))

    def eval(self, expr: ast.expr, scope: Scope, world: World | None = None,
             depth: int = 0) -> object:
        """A literal value (str, int, float, tuple, Dtype, Glob) or None when unknown.

        Paths come out as strings; `__file__` is rooted at `_ROOT`.
        """
        if depth > MAX_DEPTH:
            return None
        w = world or {}
        if isinstance(expr, ast.Constant):
            return expr.value if isinstance(expr.value, (str, int, float)) else None
        if isinstance(expr, ast.Name):
            return self._eval_name(expr, scope, w, depth)
        if isinstance(expr, (ast.Tuple, ast.List)):
            return tuple(self.eval(e, scope, w, depth + 1) for e in expr.elts[:MAX_ITEMS])
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

    def _eval_name(self, expr: ast.Name, scope: Scope, world: World, depth: int) -> object:
        b = self.index.lookup(expr.id, scope, expr.lineno)
        if b is None:
            return f"{_ROOT}/{self.index.rel_path}" if expr.id == "__file__" else None
        if b.alts:
            i = world.get(b.group)
            if i is None:
                return None
            value, where = b.alts[i]
            return self.eval(value, where, world, depth + 1)
        return self.eval(b.value, b.scope, world, depth + 1) if b.value is not None else None

    def _eval_fstring(self, expr: ast.JoinedStr, scope: Scope, world: World,
                      depth: int) -> str | None:
        parts: list[str] = []
        for v in expr.values:
            if isinstance(v, ast.Constant) and isinstance(v.value, str):
                parts.append(v.value)
                continue
            text = self.formatted(v, scope, world, depth) if isinstance(
                v, ast.FormattedValue) else None
            if text is None:
                return None
            parts.append(text)
        return "".join(parts)

    def formatted(self, v: ast.FormattedValue, scope: Scope, world: World,
                  depth: int) -> str | None:
        if v.format_spec is not None:
            return None
        value = self.eval(v.value, scope, world, depth + 1)
        if not isinstance(value, (str, int, float)) or isinstance(value, bool):
            return None
        return repr(value) if v.conversion == ord("r") else str(value)

    def _eval_attribute(self, expr: ast.Attribute, scope: Scope, world: World,
                        depth: int) -> object:
        q = self.index.qualname(expr)
        if q is not None and q.startswith("torch."):
            name = _DTYPES.get(q[len("torch."):])
            return Dtype(name) if name else None
        if q in _OS_CONSTANTS:
            return _OS_CONSTANTS[q]
        if expr.attr in ("parent", "name"):
            v = self.eval(expr.value, scope, world, depth + 1)
            if isinstance(v, str):
                return posixpath.dirname(v) if expr.attr == "parent" else posixpath.basename(v)
        return None

    def _eval_subscript(self, expr: ast.Subscript, scope: Scope, world: World,
                        depth: int) -> object:
        if isinstance(expr.slice, ast.Slice):
            return self._eval_slice(expr, expr.slice, scope, world, depth)
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

    def _eval_slice(self, expr: ast.Subscript, piece: ast.Slice, scope: Scope, world: World,
                    depth: int) -> object:
        """`parts[:-1]` of a tuple (the folders of `__file__.split("/")`)."""
        bounds = [self.eval(b, scope, world, depth + 1) if b is not None else None
                  for b in (piece.lower, piece.upper, piece.step)]
        if any(b is not None and (not isinstance(b, int) or isinstance(b, bool))
               for b in bounds):
            return None
        seq = self.eval(expr.value, scope, world, depth + 1)
        if not isinstance(seq, tuple):
            return None
        lower, upper, step = (b if isinstance(b, int) else None for b in bounds)
        return seq[lower:upper:step] if step != 0 else None

    def _eval_call(self, expr: ast.Call, scope: Scope, world: World, depth: int) -> object:
        q = self.index.qualname(expr.func) or ""
        args = [self.eval(a, scope, world, depth + 1) for a in expr.args[:16]]
        joined = self._eval_str_method(expr.func, args, scope, world, depth)
        if joined is not None:
            return joined
        strings = [a for a in args if isinstance(a, str)]
        complete = len(strings) == len(args) and bool(args)
        if q in _PATH_FUNCTIONS:
            if not complete and args and all(isinstance(a, (str, Glob)) for a in args):
                # A path built on a glob's match (`os.path.join(d, name)` for each name
                # `os.listdir(d)` gives) is a glob itself.
                return Glob(posixpath.join(*(a.pattern if isinstance(a, Glob) else a
                                             for a in args if isinstance(a, (str, Glob)))))
            return posixpath.join(*strings) if complete else None
        if q == "os.listdir" and complete:
            return Glob(posixpath.join(strings[0], "*"))
        if q in ("os.path.dirname", "os.path.basename") and complete:
            return posixpath.dirname(strings[0]) if q.endswith("dirname") \
                else posixpath.basename(strings[0])
        if q in ("glob.glob", "glob.iglob") and strings:
            return Glob(strings[0])
        if q in ("tuple", "list", "torch.Size") and len(args) == 1 and isinstance(args[0], tuple):
            return args[0]
        if q in ("sorted", "list", "tuple", "set") and len(args) == 1 \
                and isinstance(args[0], Glob):
            return args[0]  # the glob's matches, in whatever order
        if q == "int" and len(args) == 1 and isinstance(args[0], (int, float)):
            return int(args[0])
        if q == "getattr" and len(args) == 2 and self.index.qualname(expr.args[0]) == "torch" \
                and isinstance(args[1], str) and args[1] in _DTYPES:
            return Dtype(_DTYPES[args[1]])
        if isinstance(expr.func, ast.Attribute):
            return self._eval_path_method(expr.func, strings, complete or not args,
                                          scope, world, depth)
        return None

    def _eval_str_method(self, func: ast.expr, args: list[object], scope: Scope,
                         world: World, depth: int) -> object:
        """`"/".join(parts)` and `path.split("/")`: a path taken apart into folders and
        put back together (`"/".join(__file__.split("/")[:-1] + ["k.cu"])`)."""
        if not isinstance(func, ast.Attribute) or func.attr not in ("join", "split") or \
                len(args) != 1:
            return None
        base = self.eval(func.value, scope, world, depth + 1)
        if not isinstance(base, str):
            return None
        arg = args[0]
        if func.attr == "join" and isinstance(arg, tuple) and arg and \
                all(isinstance(a, str) for a in arg):
            return base.join(str(a) for a in arg)
        if func.attr == "split" and isinstance(arg, str) and arg:
            parts = tuple(base.split(arg))
            return parts if len(parts) <= MAX_ITEMS else None
        return None

    def _eval_path_method(self, func: ast.Attribute, args: list[str], complete: bool,
                          scope: Scope, world: World, depth: int) -> object:
        if not complete:
            return None
        base = self.eval(func.value, scope, world, depth + 1)
        if isinstance(base, Glob):  # a path of the glob's matches: `p.relative_to(ROOT)`
            if func.attr in ("resolve", "absolute", "as_posix", "expanduser") and not args:
                return base
            if func.attr == "relative_to" and len(args) == 1:
                return Glob(posixpath.relpath(base.pattern, args[0]))
            return None
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
            return Glob(posixpath.join(base, *middle, args[0]))
        return None

    # --- paths --------------------------------------------------------------------

    def resolve_path(self, value: str | Glob, expr: ast.expr) -> str:
        """A repo-relative path for a source file named in the build."""
        is_glob = isinstance(value, Glob)
        path = value.pattern if isinstance(value, Glob) else value
        if path.startswith(_ROOT):
            norm = posixpath.normpath(path)
            if norm == _ROOT:
                return "."
            if norm.startswith(_ROOT + "/"):
                return self._checked(norm[len(_ROOT) + 1:], is_glob, expr)
            self.note(expr.lineno, f"source path `{as_written(expr)}` leaves the repository")
            return as_written(expr)
        if posixpath.isabs(path):
            self.note(expr.lineno, f"source path {path!r} is absolute; kept as written")
            return path
        local = posixpath.normpath(posixpath.join(self.index.pydir, path))
        if local == ".." or local.startswith("../"):
            self.note(expr.lineno, f"source path {path!r} leaves the repository")
            return path
        if is_glob or self.exists is None or self.exists(local):
            return local
        at_root = posixpath.normpath(path)
        if self.exists(at_root):
            return at_root
        self.note(expr.lineno, f"source {path!r} not found next to {self.index.rel_path} "
                               "or at the repository root")
        return local

    def _checked(self, rel: str, is_glob: bool, expr: ast.expr) -> str:
        if not is_glob and self.exists is not None and not self.exists(rel):
            self.note(expr.lineno, f"source {rel!r} does not exist")
        return rel
