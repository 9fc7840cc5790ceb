"""What a candidate may change: the task's kernel, the device functions only it calls, and
the host code that launches it; never another kernel, nor code another kernel uses.

Only the task's op is verified, so a change that reaches another kernel (its body, a
device function it calls, a constant or macro its code or its launch reads, the
launch itself) would ship unverified. `scope_findings` compares the candidate's units
with the original's and rejects such a change, naming what changed and which kernel
it reaches. Code is compared as tokens (comments and spacing ignored), so a candidate
that only re-indents a neighbour is not rejected.

The call graph is read with tree-sitter: a function reaches every function it calls
by name (overloads and templates are one name), transitively.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from kfbot.anticheat.findings import Finding
from kfbot.anticheat.sources import units
from kfbot.evaluate.candidate import Candidate
from kfbot.evaluate.task import KernelTask
from kfbot.scan import treesitter as tsx

Node = tsx.Node
CHECK = "edit-scope"
_CALL = "(call_expression function: (_) @callee)"
_LAUNCH = "(call_expression function: (_) @f (kernel_call_syntax)) @call"


@dataclass
class Definitions:
    """The functions, kernels, macros and top-level constants of a set of sources."""

    # name -> (path, node) of each definition; launches are by kernel name
    functions: dict[str, list[tuple[str, Node]]] = field(default_factory=dict)
    kernels: set[str] = field(default_factory=set)
    globals: dict[str, list[tuple[str, Node]]] = field(default_factory=dict)  # macros, constants
    launches: dict[str, list[tuple[str, Node]]] = field(default_factory=dict)

    def add(self, path: str, root: Node) -> None:
        for node in _top_level(root):
            if node.type == "function_definition":
                name = function_name(node)
                self.functions.setdefault(name, []).append((path, node))
                if any(tsx.text(c) == "__global__" for c in node.children):
                    self.kernels.add(name)
            elif node.type in ("preproc_def", "preproc_function_def"):
                self.globals.setdefault(tsx.text(node.child_by_field_name("name")), []).append(
                    (path, node))
            elif node.type == "declaration":
                for name in _declared(node):
                    self.globals.setdefault(name, []).append((path, node))
        for m in tsx.matches(_LAUNCH, root):
            callee = m["f"].child_by_field_name("name") if m["f"].type == "template_function" \
                else m["f"]
            self.launches.setdefault(_last(tsx.text(callee)), []).append((path, m["call"]))

    def calls(self, name: str) -> set[str]:
        out: set[str] = set()
        for _, fn in self.functions.get(name, []):
            for m in tsx.matches(_CALL, fn):
                callee = m["callee"]
                if callee.type == "template_function":
                    callee = callee.child_by_field_name("name") or callee
                out.add(_last(tsx.text(callee)))
        return out & set(self.functions)

    def reachable(self, start: str) -> set[str]:
        """`start` and every function it calls, transitively."""
        seen, todo = set(), [start]
        while todo:
            name = todo.pop()
            if name in seen or name not in self.functions:
                continue
            seen.add(name)
            todo.extend(self.calls(name))
        return seen


def definitions(sources: Iterable[tuple[str, str]]) -> Definitions:
    """The definitions of (path, C++/CUDA text) sources."""
    defs = Definitions()
    for path, text in sources:
        defs.add(path, tsx.parse_cuda(text.encode()).root_node)
    return defs


def function_name(fn: Node) -> str:
    decl = fn.child_by_field_name("declarator")
    while decl is not None and decl.type != "function_declarator":
        decl = decl.child_by_field_name("declarator")
    return _last(tsx.text(decl.child_by_field_name("declarator") if decl else None))


def in_scope(defs: Definitions, kernel: str) -> set[str]:
    """The functions a change for `kernel` may touch: it, and what it alone reaches."""
    others = set().union(*(defs.reachable(k) for k in defs.kernels if k != kernel))
    return defs.reachable(kernel) - others


def shared_names(task: KernelTask) -> set[str]:
    """The functions, macros and file-level constants that a kernel other than the task's
    uses: a `-D` value or a literal changed there reaches that kernel too."""
    defs = definitions((s.path, s.text) for s in units(task, {}))
    kernel = _last(task.kernel_name)
    out: set[str] = set()
    for other in defs.kernels - {kernel}:
        out |= defs.reachable(other) | _used_globals(defs, other)
    return out


def scope_findings(task: KernelTask, candidate: Candidate) -> list[Finding]:
    """A strict finding for each change that reaches a kernel other than the task's."""
    if not candidate.files:
        return []
    before = definitions((s.path, s.text) for s in units(task, {}))
    after = definitions((s.path, s.text) for s in units(task, candidate.files))
    return out_of_scope(before, after, _last(task.kernel_name))


def out_of_scope(before: Definitions, after: Definitions, kernel: str) -> list[Finding]:
    if kernel not in before.kernels:
        return []
    mine = before.reachable(kernel) | _used_globals(before, kernel)
    found: list[Finding] = []
    for other in sorted(before.kernels - {kernel}):
        for name in sorted(before.reachable(other)):
            if _tokens(before.functions.get(name, [])) != _tokens(after.functions.get(name, [])):
                what = "kernel" if name == other else "device function"
                found.append(_finding(what, name, other, kernel, name in mine,
                                      after.functions.get(name, [])))
        if _tokens(before.launches.get(other, [])) != _tokens(after.launches.get(other, [])):
            found.append(_finding("the launch of", other, other, kernel, False,
                                  after.launches.get(other, [])))
        for name in sorted(_used_globals(before, other)):
            if _tokens(before.globals[name]) != _tokens(after.globals.get(name, [])):
                found.append(_finding("definition", name, other, kernel, name in mine,
                                      after.globals.get(name, [])))
    return _unique(found)


def _used_globals(defs: Definitions, kernel: str) -> set[str]:
    """Macros and top-level constants read by `kernel`, what it calls, or its launches."""
    nodes = [fn for name in defs.reachable(kernel) for _, fn in defs.functions[name]]
    nodes += [call for _, call in defs.launches.get(kernel, [])]
    used = {tsx.text(n) for node in nodes for n in _walk(node)
            if n.type in ("identifier", "type_identifier")}
    return used & set(defs.globals)


def _finding(what: str, name: str, other: str, kernel: str, shared: bool,
             where: Sequence[tuple[str, Node]]) -> Finding:
    if shared:
        reason = (f"changes {what} {name}, which {other} uses too: only {kernel} is verified, "
                  "so code it shares with another kernel must stay as it is")
    else:
        reason = f"changes {what} {name}, which only {other} uses; this task verifies {kernel}"
    evidence = f"{where[0][0]}:{tsx.line(where[0][1])}" if where else "removed"
    return Finding(CHECK, "static", "strict", reason, evidence)


def _unique(found: list[Finding]) -> list[Finding]:
    seen: set[tuple[str, str]] = set()
    out = []
    for f in found:
        if (f.reason, f.evidence) not in seen:
            seen.add((f.reason, f.evidence))
            out.append(f)
    return out


def _tokens(items: Sequence[tuple[str, Node]]) -> Counter[str]:
    """The definitions as token strings, comments and spacing ignored; order ignored."""
    return Counter(" ".join(_leaf_texts(node)) for _, node in items)


def _leaf_texts(node: Node) -> list[str]:
    out = []
    for n in _walk(node):
        if n.type == "comment":
            continue
        if n.child_count == 0 or n.type in ("preproc_arg", "string_literal"):
            out.extend(tsx.text(n).split())
    return out


def _walk(node: Node) -> Iterable[Node]:
    stack = [node]
    while stack:
        current = stack.pop()
        yield current
        if current.type not in ("preproc_arg", "string_literal"):
            stack.extend(reversed(current.children))


def _top_level(root: Node) -> Iterable[Node]:
    """Definitions at file or namespace level, through templates, `extern "C"` and
    preprocessor conditionals."""
    for child in root.named_children:
        if child.type == "template_declaration":
            yield from (c for c in child.named_children
                        if c.type in ("function_definition", "declaration"))
        elif child.type in ("namespace_definition", "linkage_specification"):
            body = child.child_by_field_name("body")
            if body is not None:
                yield from _top_level(body)
            elif child.type == "linkage_specification":
                yield from _top_level(child)
        elif child.type in ("preproc_ifdef", "preproc_if", "preproc_else", "preproc_elif"):
            yield from _top_level(child)
        else:
            yield child


def _declared(node: Node) -> list[str]:
    names = []
    for d in node.children_by_field_name("declarator"):
        inner = d.child_by_field_name("declarator") if d.type == "init_declarator" else d
        if inner is not None and inner.type == "identifier":
            names.append(tsx.text(inner))
    return names


def _last(name: str) -> str:
    return name.rsplit("::", 1)[-1]
