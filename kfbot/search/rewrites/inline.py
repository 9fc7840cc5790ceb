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

A lambda declared in the kernel's body (`auto row_sum = [&](const float* v) {...};`)
is inlined the same way at its calls after it, and its declaration removed once
nothing calls it. Its captures are the kernel's own variables, visible by the same
names where it is called; one captured by value (`[=]`) must not change between the
lambda and its calls, or the inlined body would see the new value.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

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


@lru_cache(maxsize=64)  # every rewrite of a proposal round inlines the same file
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
    fn = kernels[0]
    lambdas = _lambdas(fn)
    helpers = {**_helpers(root), **{h.name: h for h, _ in lambdas.values()}}
    declarations = {decl.id for _, decl in lambdas.values()}
    src = source.encode()
    edits: list[sx.Edit] = []
    names: list[str] = []
    counter = [0]
    for stmt in _statements(fn):
        if stmt.id in declarations:
            continue
        found = [(call, h) for call, h in _calls_in(stmt, helpers)
                 if h.name not in lambdas or call.start_byte > lambdas[h.name][1].end_byte]
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
    return _without_unused_lambdas(sx.splice(src, edits).decode(), kernel), names


def _lambdas(fn: sx.Node) -> dict[str, tuple[_Helper, sx.Node]]:
    """The lambdas declared directly in the kernel's statements that can be inlined, by
    name, with their declaration."""
    out: dict[str, tuple[_Helper, sx.Node]] = {}
    statements = _statements(fn)
    for at, stmt in enumerate(statements):
        found = _lambda_of(stmt)
        if found is None:
            continue
        name, lam = found
        helper = _lambda_helper(name, lam)
        if helper is None or not _captures_hold(lam, statements[at + 1:], fn):
            continue
        out[name] = (helper, stmt)
    return out


def _lambda_of(stmt: sx.Node) -> tuple[str, sx.Node] | None:
    sole = sx.sole_init(stmt) if stmt.type == "declaration" else None
    if sole is None:
        return None
    name, value = sole
    if name is None or name.type != "identifier" or value is None \
            or value.type != "lambda_expression":
        return None
    return sx.text(name), value


def _lambda_helper(name: str, lam: sx.Node) -> _Helper | None:
    body = sx.field(lam, "body")
    declarator = sx.field(lam, "declarator")
    if body is None or (declarator is not None and "mutable" in sx.text(declarator)):
        return None
    plist = sx.field(declarator, "parameters") if declarator is not None else None
    params = [p for p in sx.named(plist) if p.type == "parameter_declaration"] \
        if plist is not None else []
    found = _body_parts(body)
    typed = _typed_params(params)
    if found is None or typed is None:
        return None
    stmts, result = found
    templated = any(kind.startswith("auto") or "auto" in kind.split() for _, kind in typed)
    return _Helper(name, tuple(typed), stmts, result, templated)


def _captures_hold(lam: sx.Node, after: list[sx.Node], fn: sx.Node) -> bool:
    """A by-value capture is not assigned after the lambda; no captured name is declared
    twice in the kernel (a call site could see another variable by that name)."""
    captures = sx.field(lam, "captures")
    text = "".join(sx.text(captures).split()) if captures is not None else "[]"
    body = sx.field(lam, "body")
    declarator = sx.field(lam, "declarator")
    own = set(_declared_in(body)) | {n for n, _ in _typed_params(
        [p for p in sx.named(sx.field(declarator, "parameters") or lam)
         if p.type == "parameter_declaration"] if declarator is not None else []) or []}
    free = sx.identifiers(body) - own if body is not None else set()
    counts: dict[str, int] = {}
    for name in _declared_in(fn):
        counts[name] = counts.get(name, 0) + 1
    if any(counts.get(name, 0) > 1 for name in free):
        return False
    by_value = text == "[=]" or (text not in ("[&]", "[]") and not text.startswith("[&"))
    return not by_value or not any(sx.assigned(s, name) for s in after for name in free)


def _declared_in(node: sx.Node | None) -> list[str]:
    out: list[str] = []
    for n in sx.walk(node) if node is not None else ():
        if n.type == "init_declarator":
            target = sx.field(n, "declarator")
            while target is not None and target.type in ("pointer_declarator",
                                                          "reference_declarator"):
                target = sx.field(target, "declarator")
            if target is not None and target.type == "identifier":
                out.append(sx.text(target))
        elif n.type == "declaration":
            out += [sx.text(d) for d in n.children_by_field_name("declarator")
                    if d.type == "identifier"]
    return out


def _without_unused_lambdas(source: str, kernel: str) -> str:
    """The kernel less the declarations of lambdas nothing calls any more."""
    root = sx.parse(source)
    kernels = sx.kernels_named(root, kernel)
    if len(kernels) != 1:
        return source
    fn = kernels[0]
    uses: dict[str, int] = {}
    for n in sx.walk(fn):
        if n.type == "identifier":
            uses[sx.text(n)] = uses.get(sx.text(n), 0) + 1
    edits: list[sx.Edit] = []
    src = source.encode()
    for stmt in _statements(fn):
        found = _lambda_of(stmt)
        if found is not None and uses.get(found[0], 0) == 1:
            line_start = src.rfind(b"\n", 0, stmt.start_byte) + 1
            edits.append((line_start if not src[line_start:stmt.start_byte].strip()
                          else stmt.start_byte, stmt.end_byte + 1 if src[stmt.end_byte:
                          stmt.end_byte + 1] == b"\n" else stmt.end_byte, b""))
    return sx.splice(src, edits).decode() if edits else source


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
    if body is None or sx.fn_name(fn).startswith("kfbot_") or _shared_or_typed(fn, body):
        return None
    found = _body_parts(body)
    params = _typed_params(sx.params(fn))
    if found is None or params is None:
        return None
    stmts, result = found
    templated = sx.definition(fn) is not fn
    return _Helper(sx.fn_name(fn), tuple(params), stmts, result, templated)


def _body_parts(body: sx.Node) -> tuple[tuple[sx.Node, ...], sx.Node | None] | None:
    """(the statements less a final return, the returned expression) of a body whose
    only return is its last statement; None for any other return."""
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
    return tuple(stmts), result


def _typed_params(params: list[sx.Node]) -> list[tuple[str, str]] | None:
    """(name, declared type) of each parameter; None when one has no name."""
    out = []
    for p in params:
        name = sx.param_name(p)
        if not name:
            return None
        declarator = sx.field(p, "declarator")
        declared = sx.text(p)
        if declarator is not None:  # the type: the parameter's text less its name
            declared = declared[: declarator.start_byte - p.start_byte] + \
                sx.text(declarator).replace(name, "")
        out.append((name, " ".join(declared.split())))
    return out


def _shared_or_typed(fn: sx.Node, body: sx.Node) -> bool:
    """A helper that declares shared memory (a second inlined copy would declare it
    again in the same scope) or names a parameter of its template in its body (which
    means nothing in the kernel)."""
    if any(n.type == "declaration" and "__shared__" in sx.qualifiers(n) for n in sx.walk(body)):
        return True
    top = sx.definition(fn)
    plist = sx.field(top, "parameters") if top is not fn else None
    types = {sx.text(c) for p in (sx.named(plist) if plist is not None else [])
             for c in sx.named(p) if c.type in ("type_identifier", "identifier")}
    words = {sx.text(n) for n in sx.walk(body) if n.type in ("type_identifier", "identifier")}
    return bool(types & words)


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
    return {name for s in helper.statements for name in _declared_in(s)}


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
