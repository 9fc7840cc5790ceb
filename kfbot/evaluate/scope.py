"""What a candidate may change: the task's kernel, the device functions only it calls, and
the host code that launches it; never another kernel, nor code another kernel uses
unless that kernel's op is verified too.

Only the task's op is verified, so a change that reaches another kernel (its body, a
device function it calls, a constant or macro its code or its launch reads, the
launch itself) would ship unverified. `reaches` compares the candidate's units with
the original's and names each such change and the kernel it reaches; `scope_findings`
rejects them. A change to code the task's kernel shares with another (`Reached.shared`)
may stand when the other kernel's op is verified with it (`evaluate/neighbours.py`).
Code is compared as tokens (comments and spacing ignored), so a candidate that only
re-indents a neighbour is not rejected.

The call graph is read with tree-sitter: a function reaches every function it calls
by name (overloads and templates are one name), transitively.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from kfbot.anticheat.findings import Finding
from kfbot.evaluate.candidate import Candidate
from kfbot.evaluate.sources import units
from kfbot.evaluate.task import KernelTask
from kfbot.scan import treesitter as tsx

Node = tsx.Node
CHECK = "edit-scope"
_CALL = "(call_expression function: (_) @callee)"
_LAUNCH = "(call_expression function: (_) @f (kernel_call_syntax)) @call"
# Files compiled on their own; anything else (a header) is included where it is used.
_TRANSLATION_UNITS = (".cu", ".cpp", ".cc", ".cxx", ".c")


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
        out |= defs.reachable(other) | {name for _, name in _used_globals(defs, other)}
    return out


@dataclass(frozen=True)
class Reached:
    """One change of a candidate that reaches a kernel other than the task's."""

    what: str  # "kernel", "device function", "the launch of" or "definition"
    name: str  # what changed
    other: str  # the other kernel it reaches
    kernel: str  # the task's kernel
    shared: bool  # the task's kernel uses it too: a change to shared code
    evidence: str  # file:line of the change, or "removed"

    def finding(self, verified: bool = False) -> Finding:
        """A strict finding; with `verified`, a warning saying the other op is verified."""
        if verified:
            reason = (f"changes {self.what} {self.name}, which {self.other} uses too: "
                      f"{self.other}'s op is verified against its reference as well")
            return Finding(CHECK, "static", "warn", reason, self.evidence)
        if self.shared:
            reason = (f"changes {self.what} {self.name}, which {self.other} uses too: only "
                      f"{self.kernel} is verified, so code it shares with another kernel "
                      "must stay as it is")
        else:
            reason = (f"changes {self.what} {self.name}, which only {self.other} uses; this "
                      f"task verifies {self.kernel}")
        return Finding(CHECK, "static", "strict", reason, self.evidence)


def scope_findings(task: KernelTask, candidate: Candidate) -> list[Finding]:
    """A strict finding for each change that reaches a kernel other than the task's."""
    return _unique([r.finding() for r in reaches(task, candidate)])


def reaches(task: KernelTask, candidate: Candidate) -> list[Reached]:
    """Each change of the candidate that reaches a kernel other than the task's."""
    if not candidate.files:
        return []
    before = definitions((s.path, s.text) for s in units(task, {}))
    after = definitions((s.path, s.text) for s in units(task, candidate.files))
    return reached(before, after, _last(task.kernel_name))


def out_of_scope(before: Definitions, after: Definitions, kernel: str) -> list[Finding]:
    return _unique([r.finding() for r in reached(before, after, kernel)])


def reached(before: Definitions, after: Definitions, kernel: str) -> list[Reached]:
    if kernel not in before.kernels:
        return []
    mine_functions = before.reachable(kernel)
    mine_globals = _used_globals(before, kernel)
    found: list[Reached] = []
    for other in sorted(before.kernels - {kernel}):
        for name in sorted(before.reachable(other)):
            if _tokens(before.functions.get(name, [])) != _tokens(after.functions.get(name, [])):
                what = "kernel" if name == other else "device function"
                found.append(Reached(what, name, other, kernel, name in mine_functions,
                                     _where(after.functions.get(name, []))))
        if _tokens(before.launches.get(other, [])) != _tokens(after.launches.get(other, [])):
            found.append(Reached("the launch of", other, other, kernel, False,
                                 _where(after.launches.get(other, []))))
        for path, name in sorted(_used_globals(before, other)):
            if _tokens(_in(before.globals[name], path)) != \
                    _tokens(_in(after.globals.get(name, []), path)):
                found.append(Reached("definition", name, other, kernel,
                                     (path, name) in mine_globals,
                                     _where(_in(after.globals.get(name, []), path))))
    return found


def _used_globals(defs: Definitions, kernel: str) -> set[tuple[str, str]]:
    """(file, name) of the macros and top-level constants read by `kernel`, what it
    calls, or its launches. A use reads a definition in its own file or in a header: two
    `.cu` files that each define `kBlock` define two constants."""
    nodes = [(path, fn) for name in defs.reachable(kernel) for path, fn in defs.functions[name]]
    nodes += defs.launches.get(kernel, [])
    used: set[tuple[str, str]] = set()
    for path, node in nodes:
        for n in _walk(node):
            if n.type not in ("identifier", "type_identifier"):
                continue
            name = tsx.text(n)
            used |= {(where, name) for where, _ in defs.globals.get(name, ())
                     if where == path or not where.endswith(_TRANSLATION_UNITS)}
    return used


def _in(items: Sequence[tuple[str, Node]], path: str) -> list[tuple[str, Node]]:
    return [(where, node) for where, node in items if where == path]


def _where(items: Sequence[tuple[str, Node]]) -> str:
    return f"{items[0][0]}:{tsx.line(items[0][1])}" if items else "removed"


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
