"""Built-in static checks: the structural comparisons a tree-sitter query cannot express.

Each check takes the rule entry (for its id, severity and wording), the static input and
the parsed original and candidate units, and returns its findings.
"""

from __future__ import annotations

import ast
from collections.abc import Callable, Iterable, Sequence
from itertools import zip_longest
from pathlib import PurePosixPath

from kfbot.anticheat.findings import Finding
from kfbot.anticheat.rules import Rule
from kfbot.anticheat.sizes import SizeComparison, new_size_comparisons
from kfbot.anticheat.units import StaticInput, Unit
from kfbot.scan import treesitter as tsx
from kfbot.scan.treesitter import Node

Check = Callable[[Rule, StaticInput, Sequence[Unit], Sequence[Unit]], list[Finding]]

# Tokens (leading dashes dropped) that turn on fast math in nvcc or the host compiler.
FAST_MATH = frozenset({"use_fast_math", "ftz=true", "prec-div=false", "prec-sqrt=false",
                       "ffast-math", "ofast"})
# Calls that take a kernel's address without launching it.
NOT_A_LAUNCH = ("cudaFuncSetAttribute", "cudaFuncGetAttributes", "cudaFuncSetCacheConfig",
                "cudaOccupancy")
EVIDENCE_CHARS = 120
IDENTIFIER_Q = "(identifier) @id"


def run(rule: Rule, inp: StaticInput, original: Sequence[Unit],
        candidate: Sequence[Unit]) -> list[Finding]:
    return CHECKS[str(rule.check)](rule, inp, original, candidate)


def finding(rule: Rule, reason: str, where: str = "") -> Finding:
    return Finding(check=rule.id, layer="static", severity=rule.severity,
                   reason=f"{reason}: {rule.why}", evidence=where)


def evidence(path: str, line: int, source_line: str) -> str:
    """`path:line: the line`, stripped and cut to a readable length."""
    return f"{path}:{line}: {cut(source_line.strip(), EVIDENCE_CHARS)}"


def evidence_line(path: str, line: int, text: str) -> str:
    lines = text.split("\n")  # tree-sitter and ast count "\n" only
    return evidence(path, line, lines[line - 1] if 0 < line <= len(lines) else "")


def cut(text: str, limit: int) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 1] + "…"


# --- kernels and launches ----------------------------------------------------------------


def last_name(node: Node) -> str:
    """`ns::k<float>` -> `k`: the name a launch or a definition refers to."""
    while node.type in ("template_function", "qualified_identifier", "parenthesized_expression"):
        inner = node.child_by_field_name("name") or node.named_child(0)
        if inner is None:
            break
        node = inner
    return "".join(tsx.text(node).split())


def _launched(units: Sequence[Unit]) -> set[str]:
    """Names a `<<<...>>>` call or a cudaLaunchKernel call names directly."""
    names = {last_name(m["callee"]) for u in units for m in u.launches}
    for unit in units:
        for m in unit.api_launches:
            names.update(tsx.text(n) for n in _identifiers(m["args"]))
    return names


def _identifiers(node: Node) -> Iterable[Node]:
    stack = [node]
    while stack:
        current = stack.pop()
        if current.type == "identifier":
            yield current
        stack.extend(current.named_children)


def _defined(units: Sequence[Unit]) -> dict[str, tuple[Unit, Node]]:
    """`__global__` kernels by name, with their first definition."""
    out: dict[str, tuple[Unit, Node]] = {}
    for unit in units:
        for m in unit.kernels:
            out.setdefault(last_name(m["name"]), (unit, m["fn"]))
    return out


def _has_launch(units: Sequence[Unit]) -> bool:
    return any(u.launches or u.api_launches for u in units)


def _referenced(units: Sequence[Unit], names: set[str]) -> set[str]:
    """Kernel names used as values (a function pointer) outside their own definitions.

    Only consulted when the candidate launches something that is not a kernel name:
    `auto k = big ? tiled_kernel : simple_kernel; k<<<g, b>>>(...)`.
    """
    found: set[str] = set()
    for unit in units:
        for m in tsx.matches(IDENTIFIER_Q, unit.root):
            name = tsx.text(m["id"])
            if name in names and not _declares(m["id"]) and not _in_non_launch_call(m["id"]):
                found.add(name)
    return found


def _declares(node: Node) -> bool:
    """The name in a definition, prototype or explicit instantiation of the kernel."""
    parent = node.parent
    if parent is not None and parent.type == "template_function":
        parent = parent.parent
    return parent is not None and parent.type == "function_declarator"


def _in_non_launch_call(node: Node) -> bool:
    """Inside `cudaFuncSetAttribute(kernel, ...)` and the like, which launch nothing."""
    current: Node | None = node.parent
    while current is not None and current.type in ("argument_list", "cast_expression",
                                                   "pointer_expression", "call_expression"):
        if current.type == "call_expression":
            callee = tsx.text(current.child_by_field_name("function"))
            return callee.startswith(NOT_A_LAUNCH)
        current = current.parent
    return False


def unlaunched_kernel(rule: Rule, inp: StaticInput, original: Sequence[Unit],
                      candidate: Sequence[Unit]) -> list[Finding]:
    before = set(_defined(original)) & _launched(original)
    defined = _defined(candidate)
    direct = _launched(candidate)
    missing = {k for k in before & set(defined) if k not in direct}
    if missing and _indirect_launch(candidate, defined):
        missing -= _referenced(candidate, missing)
    out = []
    for name in sorted(missing):
        unit, fn = defined[name]
        line = tsx.line(fn)
        out.append(finding(
            rule, f"kernel `{name}` is still defined but no longer launched",
            _evidence(unit, line)))
    return out


def _indirect_launch(units: Sequence[Unit], kernels: dict[str, tuple[Unit, Node]]) -> bool:
    """A launch through something other than a kernel's name (a pointer, a macro argument)."""
    callees = {last_name(m["callee"]) for u in units for m in u.launches}
    return bool(callees - set(kernels)) or any(u.api_launches for u in units)


def no_kernel_launch(rule: Rule, inp: StaticInput, original: Sequence[Unit],
                     candidate: Sequence[Unit]) -> list[Finding]:
    if not _has_launch(original) or _has_launch(candidate):
        return []
    files = ", ".join(dict.fromkeys(u.source.path for u in candidate)) or "no C++/CUDA units"
    return [finding(rule, "the original launches a kernel and the candidate launches none",
                    files)]


def _evidence(unit: Unit, row: int) -> str:
    text = unit.lines[row - 1] if row <= len(unit.lines) else ""
    return evidence(unit.source.path, row + unit.source.line_offset, text)


# --- build flags and files -----------------------------------------------------------------


def _fast_math_flags(flags: Iterable[str]) -> list[str]:
    """The fast-math flags in `flags`, as written; `-Xcompiler -ffast-math,-O3` included."""
    out: list[str] = []
    for flag in flags:
        for word in flag.replace(",", " ").replace("-Xcompiler=", " ").split():
            if word.lstrip("-").lower() in FAST_MATH:
                out.append(word)
    return out


def fast_math(rule: Rule, inp: StaticInput, original: Sequence[Unit],
              candidate: Sequence[Unit]) -> list[Finding]:
    before = {f.lstrip("-").lower() for f in _fast_math_flags(inp.original_flags)}
    new = [f for f in _fast_math_flags(inp.candidate_flags) if f.lstrip("-").lower() not in before]
    if not new:
        return []
    shown = " ".join(dict.fromkeys(new))
    return [finding(rule, f"builds with `{shown}`, which the original did not",
                    f"flags: {' '.join(inp.candidate_flags)}"[:200])]


def _norm_path(path: str) -> str:
    return PurePosixPath(path.replace("\\", "/")).as_posix().removeprefix("./")


def _really_changed(inp: StaticInput) -> list[str]:
    return sorted(p for p, (old, new) in inp.changed.items() if old != new)


def edit_outside_task(rule: Rule, inp: StaticInput, original: Sequence[Unit],
                      candidate: Sequence[Unit]) -> list[Finding]:
    allowed = {_norm_path(p) for p in inp.allowed}
    outside = [p for p in _really_changed(inp) if _norm_path(p) not in allowed]
    if not outside:
        return []
    return [finding(rule, f"edits {', '.join(outside)}, outside the files the task allows",
                    ", ".join(outside))]


def python_edit(rule: Rule, inp: StaticInput, original: Sequence[Unit],
                candidate: Sequence[Unit]) -> list[Finding]:
    allowed = {_norm_path(p) for p in inp.allowed}
    out = []
    for path in _really_changed(inp):
        if path.endswith(".py") and _norm_path(path) in allowed:
            old, new = inp.changed[path]
            problem = python_difference(path, old or "", new)
            if problem is not None:
                out.append(finding(rule, problem[0], problem[1]))
    return out


def python_difference(path: str, old: str, new: str) -> tuple[str, str] | None:
    """(reason, evidence) when `new` differs from `old` in more than string contents."""
    try:
        after = ast.parse(new, filename=path)
    except SyntaxError as e:
        line = e.lineno or 0
        return (f"the candidate's {path} does not parse ({e.msg})",
                evidence_line(path, line, new))
    try:
        before = ast.parse(old, filename=path)
    except SyntaxError:
        before = ast.Module(body=[], type_ignores=[])  # compare with nothing: all is new
    node = _first_difference(_blank(before), _blank(after))
    if node is None:
        return None
    line = int(getattr(node, "lineno", 1))
    return (f"{path} changes Python code, not only string contents", evidence_line(path, line, new))


def _blank(tree: ast.AST) -> ast.AST:
    """Empty every str constant (f-string parts too), in place."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            node.value = ""
    return tree


def _first_difference(before: ast.AST, after: ast.AST,
                      located: ast.AST | None = None) -> ast.AST | None:
    """The innermost located node of `after` where the two trees part; None if equal."""
    if ast.dump(before) == ast.dump(after):
        return None
    if hasattr(after, "lineno"):
        located = after
    if type(before) is type(after):
        pairs = zip_longest(ast.iter_child_nodes(before), ast.iter_child_nodes(after))
        for old, new in pairs:
            if new is None:
                break  # something was deleted at the end: report the enclosing node
            if old is None or type(old) is not type(new):
                return new if hasattr(new, "lineno") else located or after
            if ast.dump(old) != ast.dump(new):
                return _first_difference(old, new, located)
    return located or after


# --- sizes compared with literals ----------------------------------------------------------


def size_special_case(rule: Rule, inp: StaticInput, original: Sequence[Unit],
                      candidate: Sequence[Unit]) -> list[Finding]:
    """A new comparison of a size with a number whose branch changes that size."""
    return [_size_finding(rule, c, f"`{cut(c.source_line, 80)}` changes {c.size} when it is "
                                   f"{c.op} {c.value}")
            for c in new_size_comparisons(original, candidate) if c.changes_size]


def size_literal(rule: Rule, inp: StaticInput, original: Sequence[Unit],
                 candidate: Sequence[Unit]) -> list[Finding]:
    """Every other new comparison of a size with a number: verified at that size."""
    return [_size_finding(rule, c, f"`{c.size} {c.op} {c.value}` is new in the candidate")
            for c in new_size_comparisons(original, candidate) if not c.changes_size]


def _size_finding(rule: Rule, comp: SizeComparison, what: str) -> Finding:
    return finding(rule, what, evidence(comp.path, comp.line, comp.source_line))


CHECKS: dict[str, Check] = {
    "unlaunched-kernel": unlaunched_kernel,
    "no-kernel-launch": no_kernel_launch,
    "fast-math": fast_math,
    "edit-outside-task": edit_outside_task,
    "python-edit": python_edit,
    "size-special-case": size_special_case,
    "size-literal": size_literal,
}
