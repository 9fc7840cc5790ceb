"""The nvcc flag list of a Python build call, as text kfbot can change and check.

A compiler setting the search found faster is committed where the repository keeps its
flags: the `extra_cuda_cflags` list of a `load()`/`load_inline()` call, or the `"nvcc"`
list of a `CUDAExtension`'s `extra_compile_args`. `flag_list` finds that list in the
call the scan reported (by its line) and `with_values` writes it with other values,
adding the keyword (or the dictionary entry) when the call has none; every other byte
of the file stays as it was. A list built by code (a variable, a helper's return
value, a list for both compilers) is not a literal kfbot can rewrite: `flag_list` says
so instead.

`flags_only_change` is the other side: whether an edited build file differs from the
original in its nvcc flag list only, and by flags that change speed and nothing else
(`SPEED_FLAGS`), so a candidate may carry such an edit outside its kernel files.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass
from typing import Literal

_BUILDS = {"kernel_builder": "a kernel-builder build.toml",
           "repository": "the repository's own build (CMake, a script)"}
# Flags that change how fast the code runs, never what it means (no -D, -I, -include, -U).
SPEED_FLAGS = ("-O0", "-O1", "-O2", "-O3", "--ptxas-options=-O", "--extra-device-vectorization",
               "-maxrregcount=", "--use_fast_math")


@dataclass(frozen=True)
class FlagList:
    """The nvcc flags of one build call and where they are written."""

    path: str
    values: tuple[str, ...]
    start: int  # byte span of the list literal; where to insert when `missing`
    end: int
    # What has to be added to hold flags: the load() keyword, setup.py's whole
    # extra_compile_args, or its "nvcc" entry.
    missing: Literal["", "keyword", "dict", "entry"] = ""
    quote: str = '"'


def flag_list(path: str, text: str, kind: str, line: int) -> FlagList | str:
    """The call's nvcc flag list, or why kfbot cannot rewrite it."""
    if kind not in ("setup_py", "load", "load_inline"):
        return (f"the build is {_BUILDS.get(kind, kind)}: kfbot edits the nvcc flags of "
                "setup.py's extensions and of load() calls only")
    try:
        tree = ast.parse(text)
    except SyntaxError as e:
        return f"{path} does not parse ({e.msg})"
    call = _build_call(tree, kind, line)
    if call is None:
        return f"no build call at {path}:{line}"
    offsets = _line_offsets(text)
    if kind == "setup_py":
        return _setup_list(path, text, call, offsets)
    keyword = next((k for k in call.keywords if k.arg == "extra_cuda_cflags"), None)
    if keyword is None:
        return _insertion(path, text, call, offsets, "keyword")
    return _literal(path, text, keyword.value, offsets, "extra_cuda_cflags")


def with_values(text: str, found: FlagList, values: tuple[str, ...]) -> str:
    """The build file with the flag list holding `values`."""
    data = text.encode()
    listed = "[" + ", ".join(f"{found.quote}{v}{found.quote}" for v in values) + "]"
    q = found.quote
    if found.missing == "keyword":
        new = f", extra_cuda_cflags={listed}"
    elif found.missing == "dict":
        new = f", extra_compile_args={{{q}nvcc{q}: {listed}}}"
    elif found.missing == "entry":
        new = f", {q}nvcc{q}: {listed}"
    else:
        new = listed
    if found.missing and not values:
        return text
    return (data[:found.start] + new.encode() + data[found.end:]).decode()


def flags_only_change(path: str, old: str, new: str, kind: str, line: int
                      ) -> tuple[str, ...] | None:
    """The new flag list when `new` differs from `old` only there (the two parse to the
    same program once the call's nvcc flags are taken out), by speed flags; None when
    anything else changed or a flag that is not a speed flag was added."""
    before, after = flag_list(path, old, kind, line), flag_list(path, new, kind, line)
    if isinstance(before, str) or isinstance(after, str):
        return None
    if _without_flags(old, kind, line) != _without_flags(new, kind, line):
        return None
    added = [v for v in after.values if v not in before.values]
    if not all(v.startswith(SPEED_FLAGS) for v in added):
        return None
    return after.values


def _without_flags(text: str, kind: str, line: int) -> str | None:
    """The program less the build call's nvcc flags, as `ast.dump` writes it."""
    tree = ast.parse(text)
    call = _build_call(tree, kind, line)
    if call is None:
        return None
    if kind != "setup_py":
        call.keywords = [k for k in call.keywords if k.arg != "extra_cuda_cflags"]
        return ast.dump(tree)
    for keyword in call.keywords:
        if keyword.arg == "extra_compile_args" and isinstance(keyword.value, ast.Dict):
            pairs = [(k, v) for k, v in zip(keyword.value.keys, keyword.value.values,
                                            strict=True)
                     if not (isinstance(k, ast.Constant) and k.value == "nvcc")]
            keyword.value.keys = [k for k, _ in pairs]
            keyword.value.values = [v for _, v in pairs]
    call.keywords = [k for k in call.keywords if not (
        k.arg == "extra_compile_args" and isinstance(k.value, ast.Dict) and not k.value.keys)]
    return ast.dump(tree)


# --- finding the list ---------------------------------------------------------------------

_NOT_BUILDS = frozenset({"setup", "find_packages", "glob", "join", "dict", "list", "str"})


def _build_call(tree: ast.Module, kind: str, line: int) -> ast.Call | None:
    """The call at `line` that builds: `load`/`load_inline`, or for setup.py the
    extension (under whatever name it was imported as), not `setup(` around it."""
    calls = [n for n in ast.walk(tree) if isinstance(n, ast.Call) and n.lineno == line]
    for call in calls:
        name = _name(call.func)
        if kind in ("load", "load_inline") and name in ("load", "load_inline"):
            return call
        if kind == "setup_py" and name not in _NOT_BUILDS and (call.args or call.keywords):
            return call
    return None


def _name(func: ast.expr) -> str:
    if isinstance(func, ast.Attribute):
        return func.attr
    return func.id if isinstance(func, ast.Name) else ""


def _line_offsets(text: str) -> list[int]:
    """Byte offset of the start of each line (ast columns count UTF-8 bytes)."""
    offsets, total = [0], 0
    for line in text.encode().split(b"\n"):
        total += len(line) + 1
        offsets.append(total)
    return offsets


def _span(node: ast.expr, offsets: list[int]) -> tuple[int, int]:
    assert node.end_lineno is not None and node.end_col_offset is not None
    return (offsets[node.lineno - 1] + node.col_offset,
            offsets[node.end_lineno - 1] + node.end_col_offset)


def _setup_list(path: str, text: str, call: ast.Call, offsets: list[int]) -> FlagList | str:
    keyword = next((k for k in call.keywords if k.arg == "extra_compile_args"), None)
    if keyword is None:  # a CUDAExtension without extra_compile_args gets the dictionary
        return _insertion(path, text, call, offsets, "dict")
    if not isinstance(keyword.value, ast.Dict):
        return (f"extra_compile_args at {path}:{keyword.value.lineno} is not a dictionary "
                "literal with an \"nvcc\" list")
    for key, value in zip(keyword.value.keys, keyword.value.values, strict=True):
        if isinstance(key, ast.Constant) and key.value == "nvcc":
            return _literal(path, text, value, offsets, "extra_compile_args[\"nvcc\"]")
    last = keyword.value.values[-1] if keyword.value.values else None
    if last is None:
        start, end = _span(keyword.value, offsets)
        return FlagList(path, (), start + 1, start + 1, "entry", _quote(text))
    end = _span(last, offsets)[1]
    return FlagList(path, (), end, end, "entry", _quote(text))


def _insertion(path: str, text: str, call: ast.Call, offsets: list[int],
               missing: Literal["keyword", "dict"]) -> FlagList | str:
    """Where a keyword goes: after the call's last argument."""
    args: list[ast.expr] = [*call.args, *(k.value for k in call.keywords)]
    if not args:
        return f"the build call at {path}:{call.lineno} has no arguments to add flags after"
    if any(k.arg is None for k in call.keywords):
        return f"the build call at {path}:{call.lineno} passes **kwargs: its flags may be there"
    end = max(_span(a, offsets)[1] for a in args)
    return FlagList(path, (), end, end, missing, _quote(text))


def _literal(path: str, text: str, node: ast.expr, offsets: list[int], what: str
             ) -> FlagList | str:
    if not isinstance(node, ast.List) or not all(
            isinstance(e, ast.Constant) and isinstance(e.value, str) for e in node.elts):
        return (f"{what} at {path}:{node.lineno} is not a list of strings written in the "
                "call: kfbot does not edit flags that code computes")
    start, end = _span(node, offsets)
    values = tuple(str(e.value) for e in node.elts if isinstance(e, ast.Constant))
    return FlagList(path, values, start, end, "", _quote(text[start:end] or text))


def _quote(text: str) -> str:
    """The file's string quote: the first one its text uses."""
    double, single = text.find('"'), text.find("'")
    if single >= 0 and (double < 0 or single < double):
        return "'"
    return '"'
