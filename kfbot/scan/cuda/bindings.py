"""Bindings: how Python reaches a host function, read from C++ registration blocks.

`PYBIND11_MODULE(name, m) { m.def("py_name", &fn); }` and the torch library blocks,
`TORCH_LIBRARY`, `TORCH_LIBRARY_FRAGMENT`, `TORCH_LIBRARY_IMPL`, in their `_EXPAND`
forms (kernel-builder and vLLM expand the namespace macro first) and the `STABLE_`
ones. `m.impl("op", torch::kCUDA, &fn)` names the dispatch key in its middle argument
and the function last; the name may be wrapped in `TORCH_SELECTIVE_NAME("ns::op")` (or
a schema in `TORCH_SELECTIVE_SCHEMA`), as torchvision-style libraries write it. The
older registry, `torch::RegisterOperators().op("ns::op", &fn).op(...)` at file scope,
registers ops of namespace `ns` too. The namespace may itself be a macro
(`TORCH_EXTENSION_NAME`, `KFOPS_NAMESPACE`); it is kept as written and resolved when
the files are linked.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

from kfbot.scan import treesitter as tsx
from kfbot.scan.cuda.context import FileContext
from kfbot.scan.cuda.syntax import (
    NAME_TYPES,
    compact,
    param_decls,
    string_value,
    strip,
    template_arg_names,
    template_name,
)
from kfbot.scan.model import Binding
from kfbot.scan.treesitter import Node

BLOCK_MACROS = re.compile(
    r"^(?:STABLE_)?(?:PYBIND11_MODULE|TORCH_LIBRARY(?:_FRAGMENT|_IMPL)?(?:_EXPAND)?)$")
MEMBER_CALL_Q = """(call_expression function: (field_expression argument: (identifier) @obj
  field: (field_identifier) @method) arguments: (argument_list) @args) @call"""
# `.op("ns::name", &fn)` on a `torch::RegisterOperators()` chain.
REGISTRY_Q = """(call_expression function: (field_expression argument: (call_expression) @obj
  field: (field_identifier) @method (#eq? @method "op")) arguments: (argument_list) @args)
  @call"""
PATTERNS = (MEMBER_CALL_Q, REGISTRY_Q)
_SELECTIVE = frozenset({"TORCH_SELECTIVE_NAME", "TORCH_SELECTIVE_SCHEMA"})
_KEY = re.compile(r"(?:^|::)k?([A-Z][A-Za-z0-9]*)$")


def bindings(ctx: FileContext) -> Iterable[Binding]:
    for m in _blocks(ctx):
        macro = tsx.text(m["macro"])
        names = [compact(tsx.text(p)) for p in param_decls(m["params"])]
        if len(names) < 2:
            continue
        module, handle = names[0], names[-1]
        impl_block = "_IMPL" in macro
        key = names[1] if impl_block and len(names) >= 3 else None
        kind = "pybind11" if "PYBIND11" in macro else \
            "torch_library_impl" if impl_block else "torch_library"
        for call in ctx.found_in(MEMBER_CALL_Q, "call", m["body"]):
            if tsx.text(call["obj"]) != handle:
                continue
            binding = _binding(ctx, kind, module, key, tsx.text(call["method"]), call)
            if binding is not None:
                yield binding
    yield from _registry(ctx)


def _blocks(ctx: FileContext) -> Iterable[dict[str, Node]]:
    """The registration blocks, which the grammar reads as functions: the macro as the
    name, its arguments as parameters (`PYBIND11_MODULE(name, m) { ... }`)."""
    if b"PYBIND11_MODULE" not in ctx.source and b"TORCH_LIBRARY" not in ctx.source:
        return  # nearly every file: no block macro is written in it
    for _, _, fn in ctx.functions:
        declarator = fn.child_by_field_name("declarator")
        if declarator is None or declarator.type != "function_declarator":
            continue
        macro = declarator.child_by_field_name("declarator")
        params = declarator.child_by_field_name("parameters")
        body = fn.child_by_field_name("body")
        if macro is not None and macro.type == "identifier" and params is not None \
                and params.type == "parameter_list" and body is not None \
                and body.type == "compound_statement" and BLOCK_MACROS.match(tsx.text(macro)):
            yield {"macro": macro, "params": params, "body": body}


def _registry(ctx: FileContext) -> Iterable[Binding]:
    """`torch::RegisterOperators().op("ns::name", &fn)`: one op of namespace `ns` per
    `.op` of the chain."""
    for call in ctx.found(REGISTRY_Q):
        if "RegisterOperators" not in tsx.text(call["obj"]):
            continue
        args = call["args"].named_children
        if len(args) < 2 or _name_node(args[0]) is None:
            continue
        module, sep, name = _op_name(args[0]).partition("::")
        if not sep or not name:
            continue
        fn, reaches = _bound_function(ctx, args[-1])
        yield Binding(kind="torch_library", name=name.split("(")[0].strip(), cpp_function=fn,
                      module=module, file=ctx.file, line=ctx.line(call["call"]),
                      reaches=reaches)


def _name_node(arg: Node) -> Node | None:
    """The string literal naming an op: as written, or inside TORCH_SELECTIVE_NAME(...)."""
    if arg.type == "string_literal":
        return arg
    if arg.type == "call_expression":
        fn = arg.child_by_field_name("function")
        inner = arg.child_by_field_name("arguments")
        if fn is not None and inner is not None and tsx.text(fn) in _SELECTIVE and \
                len(inner.named_children) == 1 and \
                inner.named_children[0].type == "string_literal":
            return inner.named_children[0]
    return None


def _op_name(arg: Node) -> str:
    node = _name_node(arg)
    return string_value(node) if node is not None else ""


def _binding(ctx: FileContext, kind: str, module: str, key: str | None, method: str,
             m: dict[str, Node]) -> Binding | None:
    args = m["args"].named_children
    if method not in ("def", "impl") or not args or _name_node(args[0]) is None:
        return None
    name = _op_name(args[0]).split("(")[0].strip()
    if "::" in name:
        name = name.split("::")[-1]
    target = None
    if len(args) > 1:
        # impl's function is its last argument (a dispatch key may come between);
        # def's is its second (a docstring and py::args may follow).
        target = args[-1] if method == "impl" else args[1]
        if method == "impl" and len(args) > 2:
            key = _dispatch_key(args[1]) or key
    fn, reaches = _bound_function(ctx, target) if target is not None else (None, ())
    return Binding(kind=kind, name=name, cpp_function=fn,  # type: ignore[arg-type]
                   module=module, file=ctx.file, line=ctx.line(m["call"]),
                   dispatch_key=key, reaches=reaches)


def _dispatch_key(arg: Node) -> str | None:
    """`torch::kCUDA`, `c10::DispatchKey::CUDA` or `"CUDA"` -> "CUDA"."""
    if arg.type == "string_literal":
        return string_value(arg) or None
    found = _KEY.search(compact(tsx.text(arg)))
    return found.group(1) if found else None


def _bound_function(ctx: FileContext, arg: Node) -> tuple[str | None, tuple[str, ...]]:
    """`&ns::f<float>` -> "ns::f"; a lambda -> the first function it calls; a wrapper
    such as `torch::dispatch(key, f)` -> its last argument. The second item names the
    functions passed as template arguments (`&adapter<ns::launch>` -> ("ns::launch",))."""
    arg = strip(arg)
    if arg.type == "lambda_expression":
        calls = [c["callee"] for c in ctx.found_in(ctx.call_pattern, "call", arg)]
        return (template_name(calls[0]) if calls else None), ()
    if arg.type in NAME_TYPES:
        return template_name(arg), tuple(template_arg_names(arg))
    if arg.type == "call_expression":
        args = arg.child_by_field_name("arguments")
        if args is not None and args.named_children:
            return _bound_function(ctx, args.named_children[-1])
    return None, ()
