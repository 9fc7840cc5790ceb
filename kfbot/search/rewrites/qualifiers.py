"""Qualifier and pragma rewrites: small changes that tell nvcc what it cannot prove.

restrict-pointers, launch-bounds and unroll-constant-loops (rules/rewrites.yaml says
when each applies). Each touches only the target kernel and, for unrolling, the
device functions that only it calls.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

from kfbot.evaluate.scope import definitions, in_scope
from kfbot.search.rewrites import syntax as sx
from kfbot.search.rewrites.syntax import Target

SourceRewriteFn = Callable[[str, Target], "str | None"]


def restrict_pointers(source: str, target: Target) -> str | None:
    src = source.encode()
    root = sx.parse(source)
    declared = {sx.fn_name(d.parent) for d in sx.walk(root)
                if d.type == "function_declarator" and d.parent is not None
                and d.parent.type != "function_definition"}
    edits: list[sx.Edit] = []
    for fn in sx.kernels_named(root, target.kernel):
        body = sx.field(fn, "body")
        for param in sx.params(fn):
            ptr = sx.field(param, "declarator")
            if ptr is None or ptr.type != "pointer_declarator":
                continue
            inner = sx.field(ptr, "declarator")
            if inner is None or inner.type != "identifier":
                continue  # pointer to pointer, function pointer, ...
            quals = {sx.text(c) for c in ptr.children if c.type == "type_qualifier"}
            if "__restrict__" not in quals and "restrict" not in quals:
                edits.append((inner.start_byte, inner.start_byte, b"__restrict__ "))
            consts = {sx.text(c) for c in param.children if c.type == "type_qualifier"}
            type_node = sx.field(param, "type")
            if "const" not in consts and type_node is not None and body is not None \
                    and sx.fn_name(fn) not in declared and _only_read(body, sx.text(inner)):
                edits.append((type_node.start_byte, type_node.start_byte, b"const "))
    return sx.spliced(src, edits)


def _only_read(body: sx.Node, name: str) -> bool:
    """Every use of `name` in `body` is a read `name[...]` (never a write, never escaping)."""
    for node in sx.walk(body):
        if node.type != "identifier" or sx.text(node) != name:
            continue
        parent = node.parent
        if parent is None or parent.type != "subscript_expression" \
                or sx.field(parent, "argument") != node:
            return False
        user = parent.parent
        if user is None:
            return False
        if user.type == "assignment_expression" and sx.field(user, "left") == parent:
            return False
        if user.type == "update_expression" or (
                user.type == "pointer_expression" and sx.text(sx.field(user, "operator")) == "&"):
            return False
    return True


# --- 2. launch-bounds ------------------------------------------------------------------------


def launch_bounds(source: str, target: Target) -> str | None:
    src = source.encode()
    root = sx.parse(source)
    edits: list[sx.Edit] = []
    for fn in sx.kernels_named(root, target.kernel):
        if any(c.type == "launch_bounds" for c in fn.children):
            continue
        sizes = sx.block_values(root, sx.fn_name(fn))
        decl = sx.field(fn, "declarator")
        if not sizes or max(sizes) > 1024 or decl is None:
            continue
        edits.append((decl.start_byte, decl.start_byte,
                      f"__launch_bounds__({max(sizes)}) ".encode()))
    return sx.spliced(src, edits)


def occupancy(min_blocks: int) -> SourceRewriteFn:
    """`__launch_bounds__(B, min_blocks)`: B the largest block the launches use (or the
    kernel's own bound), asking nvcc to fit `min_blocks` blocks on a multiprocessor by
    capping registers. One candidate per step of the sweep (rules/rewrites.yaml)."""
    def rewrite(source: str, target: Target) -> str | None:
        src = source.encode()
        root = sx.parse(source)
        edits: list[sx.Edit] = []
        for fn in sx.kernels_named(root, target.kernel):
            bounds = next((c for c in fn.children if c.type == "launch_bounds"), None)
            sizes = sx.block_values(root, sx.fn_name(fn))
            args = sx.named(sx.field(bounds, "arguments") or bounds) if bounds else []
            if bounds is not None and len(args) == 1:
                edits.append((bounds.start_byte, bounds.end_byte,
                              f"__launch_bounds__({sx.text(args[0])}, {min_blocks})".encode()))
            elif bounds is None and sizes and max(sizes) * min_blocks <= 2048:
                decl = sx.field(fn, "declarator")
                if decl is not None:
                    edits.append((decl.start_byte, decl.start_byte,
                                  f"__launch_bounds__({max(sizes)}, {min_blocks}) ".encode()))
        return sx.spliced(src, edits)

    rewrite.__name__ = f"occupancy_{min_blocks}"
    return rewrite


# --- 3. unroll-constant-loops ----------------------------------------------------------------

_MAX_UNROLL = 64


def unroll_constant_loops(source: str, target: Target) -> str | None:
    src = source.encode()
    root = sx.parse(source)
    constants = sx.constants(root)
    scope = in_scope(definitions([("", source)]), target.kernel)
    edits: list[sx.Edit] = []
    for fn in sx.functions(root, sx.DEVICE_FN):
        if sx.fn_name(fn) not in scope:
            continue
        templ = _template_ints(fn)
        for loop in sx.walk(fn):
            if loop.type != "for_statement" or not _constant_trip(loop, constants, templ):
                continue
            if loop.parent is None or loop.parent.type != "compound_statement":
                continue
            prev = loop.prev_named_sibling
            while prev is not None and prev.type == "comment":
                prev = prev.prev_named_sibling
            if prev is not None and prev.type == "preproc_call" \
                    and sx.text(sx.field(prev, "directive")) == "#pragma":
                continue
            line_start = src.rfind(b"\n", 0, loop.start_byte) + 1
            indent = src[line_start:loop.start_byte]
            if indent.strip():
                continue
            edits.append((loop.start_byte, loop.start_byte, b"#pragma unroll\n" + indent))
    return sx.spliced(src, edits)


def _template_ints(fn: sx.Node) -> set[str]:
    parent = fn.parent
    if parent is None or parent.type != "template_declaration":
        return set()
    plist = sx.field(parent, "parameters")
    names = set()
    for p in sx.named(plist) if plist is not None else []:
        if p.type in ("parameter_declaration", "optional_parameter_declaration") \
                and sx.text(sx.field(p, "type")) in ("int", "unsigned", "size_t", "int64_t"):
            names.add(sx.text(sx.field(p, "declarator")))
    return names


def _constant_trip(loop: sx.Node, constants: Mapping[str, int], templ: set[str]) -> bool:
    init, cond, update = (sx.field(loop, k) for k in ("initializer", "condition", "update"))
    if init is None or cond is None or update is None:
        return False
    if init.type == "declaration":
        sole = sx.sole_init(init)
        if sole is None:
            return False
        var, start = sole
    elif init.type == "assignment_expression" and sx.text(sx.field(init, "operator")) == "=":
        var, start = sx.field(init, "left"), sx.field(init, "right")
    else:
        return False
    name = sx.text(var)
    if var is None or var.type != "identifier" or cond.type != "binary_expression" \
            or sx.text(sx.field(cond, "left")) != name \
            or sx.text(sx.field(cond, "operator")) not in ("<", "<=", ">", ">=", "!="):
        return False
    bound = sx.field(cond, "right")

    def known(node: sx.Node | None) -> int | str | None:
        """The value, "template" for a template int, None when not a constant."""
        value = sx.value(node, constants)
        if value is not None:
            return value
        if node is not None and node.type == "identifier" and sx.text(node) in templ:
            return "template"
        return None

    lo, hi = known(start), known(bound)
    if lo is None or hi is None:
        return False
    if update.type == "update_expression":
        if sx.text(sx.field(update, "argument")) != name:
            return False
        step = 1
    elif update.type == "assignment_expression" and sx.text(sx.field(update, "left")) == name \
            and sx.text(sx.field(update, "operator")) in ("+=", "-="):
        value = sx.value(sx.field(update, "right"), constants)
        if value is None or value == 0:
            return False
        step = value
    else:
        return False
    body = sx.field(loop, "body")
    if body is not None and any(n.type == "identifier" and sx.text(n) == name
                                and n.parent is not None and (
                                    (n.parent.type == "assignment_expression"
                                     and sx.field(n.parent, "left") == n)
                                    or n.parent.type == "update_expression")
                                for n in sx.walk(body)):
        return False  # the body moves the counter: the trip count is not the loop header's
    if isinstance(lo, str) or isinstance(hi, str):
        return True  # a template int: constant per instantiation
    return abs(hi - lo) // step <= _MAX_UNROLL


