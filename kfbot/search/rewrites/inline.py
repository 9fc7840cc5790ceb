"""Seeing a kernel through its helper device functions: the calls of helpers in the
kernel's body replaced by the helpers' statements, so the shape a rewrite recognises
(a loop over a row, an accumulator, a write at `j`) is in the kernel itself.

Real kernels read their rows through helpers (`float mean = row_mean(in, cols);`). A
call is inlined when it stands in a statement directly in the kernel's body (or in the
block of its final `if (row < rows) { ... }`), the helper is a `__device__` function of
the same file with a body whose only `return` is its last statement, and it calls no
helper that is being inlined (no recursion). Each helper's locals get a suffix of
their own, parameters bound to plain names or literals are replaced by them and others
are declared once (`const auto v_kfbot1 = x + row * cols;`), so nothing is evaluated
twice and no name clashes. The helpers stay defined: another
kernel may call them, and an unused device function costs nothing.
"""

from __future__ import annotations

from dataclasses import dataclass

from kfbot.search.rewrites import syntax as sx

MAX_ROUNDS = 4  # helpers that call helpers: inlined outside in, this deep at most
_LITERALS = ("number_literal", "true", "false", "identifier")


@dataclass(frozen=True)
class Inlined:
    source: str  # the file with the kernel's helper calls inlined
    helpers: tuple[str, ...]  # the helpers inlined, in order


@dataclass(frozen=True)
class _Helper:
    name: str
    params: tuple[tuple[str, str], ...]  # (name, declared type) in order
    statements: tuple[sx.Node, ...]  # the body less its final return
    result: sx.Node | None  # the returned expression, None for a void helper
    templated: bool


def inline_helpers(source: str, kernel: str) -> Inlined | None:
    """The source with the kernel's helper calls inlined, or None when it calls none
    that can be (or the name is not one kernel here)."""
    done: list[str] = []
    current = source
    for _ in range(MAX_ROUNDS):
        step = _one_round(current, kernel)
        if step is None:
            break
        current, names = step
        done += names
    return Inlined(current, tuple(dict.fromkeys(done))) if done else None


def _one_round(source: str, kernel: str) -> tuple[str, list[str]] | None:
    root = sx.parse(source)
    kernels = sx.kernels_named(root, kernel)
    if len(kernels) != 1:
        return None
    helpers = _helpers(root)
    fn = kernels[0]
    src = source.encode()
    edits: list[sx.Edit] = []
    names: list[str] = []
    counter = [0]
    for stmt in _statements(fn):
        found = _calls_in(stmt, helpers)
        if not found:
            continue
        call, helper = found[-1]  # the innermost call first: its value feeds the outer
        text = _inline(src, stmt, call, helper, counter)
        if text is None:
            continue
        edits.append((stmt.start_byte, stmt.end_byte, text.encode()))
        names.append(helper.name)
    if not edits:
        return None
    return sx.splice(src, edits).decode(), names


def _statements(fn: sx.Node) -> list[sx.Node]:
    """The statements a helper call may be inlined in: the body's, and those of a final
    `if (...) { ... }` without an else."""
    body = sx.field(fn, "body")
    if body is None:
        return []
    stmts = sx.named(body)
    out = list(stmts)
    if stmts and stmts[-1].type == "if_statement" and sx.field(stmts[-1], "alternative") is None:
        then = sx.field(stmts[-1], "consequence")
        if then is not None and then.type == "compound_statement":
            out = out[:-1] + sx.named(then)
    return [s for s in out if s.type in ("declaration", "expression_statement")]


def _helpers(root: sx.Node) -> dict[str, _Helper]:
    found: dict[str, list[_Helper]] = {}
    for fn in sx.functions(root, sx.DEVICE_FN):
        if "__global__" in _specifiers(fn):
            continue
        helper = _helper(fn)
        if helper is not None:
            found.setdefault(helper.name, []).append(helper)
    return {name: hs[0] for name, hs in found.items() if len(hs) == 1}  # no overloads


def _specifiers(fn: sx.Node) -> set[str]:
    return {sx.text(c) for c in fn.children if c.type != "compound_statement"}


def _helper(fn: sx.Node) -> _Helper | None:
    body = sx.field(fn, "body")
    if body is None:
        return None
    stmts = sx.named(body)
    returns = [n for n in sx.walk(body) if n.type == "return_statement"]
    result: sx.Node | None = None
    if stmts and stmts[-1].type == "return_statement":
        if len(returns) != 1:
            return None
        value = sx.named(stmts[-1])
        result = value[0] if value else None
        stmts = stmts[:-1]
    elif returns:
        return None
    params = []
    for p in sx.params(fn):
        name = sx.param_name(p)
        if not name:
            return None
        declarator = sx.field(p, "declarator")
        declared = sx.text(p)
        if declarator is not None:  # the type: the parameter's text less its name
            declared = declared[: declarator.start_byte - p.start_byte] + \
                sx.text(declarator).replace(name, "")
        params.append((name, " ".join(declared.split())))
    templated = sx.definition(fn) is not fn
    return _Helper(sx.fn_name(fn), tuple(params), tuple(stmts), result, templated)


def _calls_in(stmt: sx.Node, helpers: dict[str, _Helper]) -> list[tuple[sx.Node, _Helper]]:
    """The helper calls in a statement, outermost first."""
    out = []
    for node in sx.walk(stmt):
        if node.type != "call_expression":
            continue
        function = sx.field(node, "function")
        callee = sx.field(function, "name") if function is not None \
            and function.type == "template_function" else function
        helper = helpers.get(sx.text(callee)) if callee is not None else None
        if helper is not None:
            out.append((node, helper))
    return out


def _inline(src: bytes, stmt: sx.Node, call: sx.Node, helper: _Helper, counter: list[int]
            ) -> str | None:
    args = sx.named(sx.field(call, "arguments") or call)
    if len(args) != len(helper.params) or any(_calls_helper(s, helper.name)
                                               for s in helper.statements):
        return None
    counter[0] += 1
    suffix = f"_kfbot{_uid(stmt, counter[0])}"
    indent = sx.indent_at(src, stmt) or "    "
    bound: dict[str, str] = {}
    lines: list[str] = []
    for (name, declared), arg in zip(helper.params, args, strict=True):
        changed = any(sx.assigned(s, name) for s in helper.statements)
        if sx.strip(arg).type in _LITERALS and arg.type != "cast_expression" and not changed:
            bound[name] = sx.text(arg)
        else:
            local = f"{name}{suffix}"
            kind = "auto" if helper.templated or not declared else declared
            const = "" if changed or "const" in kind else "const "
            lines.append(f"{const}{kind} {local} = {sx.text(arg)};")
            bound[name] = local
    locals_ = _declared(helper)
    renamed = {**{n: f"{n}{suffix}" for n in locals_}, **bound}
    for s in helper.statements:
        lines.append(_renamed(s, renamed, indent))
    value = f"({_renamed(helper.result, renamed, indent)})" if helper.result is not None \
        else None
    if value is None and stmt.type == "expression_statement" \
            and sx.norm(stmt) == f"{sx.norm(call)};":
        rest = ""
    elif value is None:
        return None  # a void helper used as a value
    else:
        base = stmt.start_byte
        rest = sx.splice(sx.text(stmt).encode(), [(call.start_byte - base,
                                                   call.end_byte - base,
                                                   value.encode())]).decode()
    comment = f"// inlined from {helper.name}()"
    return f"\n{indent}".join([comment, *lines, *([rest] if rest else [])])


def _uid(stmt: sx.Node, n: int) -> str:
    return f"{stmt.start_point[0] + 1}_{n}"


def _calls_helper(node: sx.Node, name: str) -> bool:
    return any(n.type == "call_expression" and sx.text(sx.field(n, "function")) == name
               for n in sx.walk(node))


def _declared(helper: _Helper) -> set[str]:
    names: set[str] = set()
    for s in helper.statements:
        for node in sx.walk(s):
            if node.type == "init_declarator":
                target = sx.field(node, "declarator")
                while target is not None and target.type in ("pointer_declarator",
                                                              "reference_declarator"):
                    target = sx.field(target, "declarator")
                if target is not None and target.type == "identifier":
                    names.add(sx.text(target))
            elif node.type == "declaration":
                for d in node.children_by_field_name("declarator"):
                    if d.type == "identifier":
                        names.add(sx.text(d))
    return names


def _renamed(node: sx.Node | None, names: dict[str, str], indent: str) -> str:
    """The node's text with identifiers renamed; continuation lines re-indented."""
    if node is None:
        return ""
    base = node.start_byte
    edits: list[sx.Edit] = []
    for n in sx.walk(node):
        if n.type != "identifier" or sx.text(n) not in names:
            continue
        parent = n.parent
        if parent is not None and parent.type == "field_expression" \
                and sx.field(parent, "field") == n:
            continue  # `.x` of a member, not a variable
        new = names[sx.text(n)]
        edits.append((n.start_byte - base, n.end_byte - base, new.encode()))
    text = sx.splice(sx.text(node).encode(), edits).decode()
    lines = text.split("\n")
    first_indent = node.start_point[1]
    fixed = [lines[0]] + [indent + line[first_indent:] if line[:first_indent].strip() == ""
                          else line for line in lines[1:]]
    return "\n".join(fixed)
