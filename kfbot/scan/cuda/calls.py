"""Host functions and the calls between them, kept with the scope they are written in.

Several ops often each have a `launch` of their own in a namespace of their own, so a
call is resolved the way C++ looks names up (see `cpp_graph`): the call keeps the
namespace it is written in and how many arguments it passes. A function that is only
named here, not called, still counts as called: passed as an argument
(`run(&launch, x)`), as a template argument (`adapter<launch>`) or stored in a
function-pointer variable (`Fn f = big ? &launch : &launch_naive`); it is called from
wherever it was handed to, with the conditions of the place that names it.
"""

from __future__ import annotations

from collections.abc import Iterable

from kfbot.scan import treesitter as tsx
from kfbot.scan.cuda.bindings import BLOCK_MACROS
from kfbot.scan.cuda.context import FileContext
from kfbot.scan.cuda.syntax import (
    NAME_TYPES,
    compact,
    declarator_name,
    param_decls,
    params_node,
    strip,
    template_arg_names,
    template_name,
)
from kfbot.scan.model import HostCall, HostFunction
from kfbot.scan.treesitter import Node

CALL_Q = """(call_expression function: [(identifier) (qualified_identifier) (template_function)]
  @callee arguments: (argument_list) @args) @call"""
# Names handed over as values: call arguments and initialized variables.
ARG_REF_Q = """(argument_list [(identifier) (qualified_identifier) (pointer_expression)
  (template_function)] @ref)"""
INIT_REF_Q = """(init_declarator value: [(identifier) (qualified_identifier) (pointer_expression)
  (conditional_expression)] @ref)"""
DECLARED_Q = "(declaration declarator: (function_declarator declarator: (_) @name))"
PATTERNS = (CALL_Q, ARG_REF_Q, INIT_REF_Q, DECLARED_Q)


def host_functions(ctx: FileContext) -> Iterable[HostFunction]:
    for _, _, fn in ctx.functions:
        if ctx.device_only(fn):
            continue
        name = ctx.function_name(fn)
        if name is None or BLOCK_MACROS.match(name):
            continue
        decls = param_decls(params_node(fn.child_by_field_name("declarator")))
        required = sum(1 for d in decls if d.type == "parameter_declaration")
        yield HostFunction(name=name, file=ctx.file, line=ctx.line(fn),
                           params=_param_names(ctx, fn), required=required)


def _param_names(ctx: FileContext, fn: Node) -> tuple[str, ...]:
    found = ctx.params.get(fn.start_byte)
    if found is None:
        decls = param_decls(params_node(fn.child_by_field_name("declarator")))
        found = ctx.params[fn.start_byte] = tuple(
            tsx.text(declarator_name(d.child_by_field_name("declarator"))) for d in decls)
    return found


def host_calls(ctx: FileContext) -> Iterable[HostCall]:
    seen: set[tuple[str, str, int]] = set()
    for call in _calls(ctx):
        key = (call.caller, call.callee, call.line)
        if key not in seen:
            seen.add(key)
            yield call


def _calls(ctx: FileContext) -> Iterable[HostCall]:
    for m in ctx.found(CALL_Q):
        site = m["call"]
        fn = ctx.enclosing_function(site)
        if fn is None or ctx.device_only(fn) or _is_launch(site):
            continue
        callee = m["callee"]
        yield _edge(ctx, fn, site, template_name(callee), m["args"].named_child_count)
        if callee.type != "identifier":  # a plain name has no template arguments
            for name in template_arg_names(callee):
                yield _edge(ctx, fn, site, name, -1)
    functions = _functions_named(ctx)
    for pattern in (ARG_REF_Q, INIT_REF_Q):
        for m in ctx.found(pattern):
            ref = m["ref"]
            if ref.type == "identifier" and tsx.text(ref) not in functions:
                continue  # a variable (see below), as most arguments are: the cheap test first
            fn = ctx.enclosing_function(ref)
            if fn is None or ctx.device_only(fn):
                continue
            for node, name in _named(ref):
                bare = node.type == "identifier"
                # A bare name is a variable far more often than a function: it counts
                # only where this file declares or defines a function of that name.
                if not bare or name in functions:
                    yield _edge(ctx, fn, node, name, -1, bare=bare)


def _functions_named(ctx: FileContext) -> set[str]:
    """The last names of the functions this file defines or declares."""
    names = {name.rsplit("::", 1)[-1] for _, _, fn in ctx.functions
             if (name := ctx.function_name(fn)) is not None}
    names.update(compact(tsx.text(m["name"])).rsplit("::", 1)[-1]
                 for m in ctx.found(DECLARED_Q))
    return names


def _edge(ctx: FileContext, fn: Node, site: Node, callee: str, arity: int,
          bare: bool = False) -> HostCall:
    caller = ctx.function_name(fn) or "?"
    scope = caller.rsplit("::", 1)[0] if "::" in caller else ""
    return HostCall(caller=caller, callee=callee, scope=scope, arity=arity,
                    line=ctx.line(site), reference=arity < 0,
                    conditions=ctx.conditions_at(site, fn), bare=bare)


def _named(ref: Node) -> list[tuple[Node, str]]:
    """The functions a value expression names, each with the node naming it: `f`,
    `ns::f`, `&f`, `c ? &f : &g` (each branch under its own condition)."""
    if ref.type == "conditional_expression":
        return [pair for field in ("consequence", "alternative")
                if (branch := ref.child_by_field_name(field)) is not None
                for pair in _named(branch)]
    if ref.type == "pointer_expression" and \
            (ref.children and tsx.text(ref.children[0]) != "&"):
        return []  # `*p`: a dereference, not a function's address
    node = strip(ref)
    if node.type == "identifier":
        return [(ref, compact(tsx.text(node)))]
    if node.type not in NAME_TYPES:
        return []
    return [(ref, name) for name in (template_name(node), *template_arg_names(node))]


def _is_launch(call: Node) -> bool:
    # A plain call has two children, the callee and its arguments (comments aside).
    return call.child_count > 2 and any(c.type == "kernel_call_syntax" for c in call.children)
