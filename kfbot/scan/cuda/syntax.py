"""Small readings of C++/CUDA syntax nodes shared by the CUDA extractor's modules:
names as written, declarators, template arguments and the wrappers around a callee."""

from __future__ import annotations

import re

from kfbot.scan import treesitter as tsx
from kfbot.scan.treesitter import Node

_SPACE = re.compile(r"\s")  # the characters str.split() splits on
# Calls that only re-type or wrap their argument: `&f` inside is the function being
# bound or launched.
CAST_FUNCTIONS = frozenset({"reinterpret_cast", "static_cast", "const_cast", "overload_cast",
                            "TORCH_FN", "TORCH_BOX"})
_WRAPPERS = frozenset({"cast_expression", "parenthesized_expression", "pointer_expression"})
NAME_TYPES = frozenset({"identifier", "qualified_identifier", "template_function"})


def expr(s: str) -> str:
    """An expression as written, with runs of whitespace made single spaces."""
    return " ".join(s.split())


def compact(s: str) -> str:
    """Drop whitespace inside a C++ name or type so equal names compare equal."""
    if _SPACE.search(s) is None:  # most names: nothing to drop
        return s
    return re.sub(r"\s+(?=[<>,:*&])|(?<=[<>,:*&(])\s+", "", " ".join(s.split()))


def declarator_name(node: Node | None) -> Node | None:
    """Descend declarator wrappers (pointer, reference, array, function) to the name."""
    while node is not None and node.type not in (
        "identifier", "field_identifier", "qualified_identifier", "destructor_name",
        "operator_name", "template_function",
    ):
        inner = node.child_by_field_name("declarator")
        if inner is None:
            inner = next((c for c in node.named_children if "declarator" in c.type
                          or c.type == "identifier"), None)
        node = inner
    return node


def params_node(declarator: Node | None) -> Node | None:
    node = declarator
    while node is not None and node.type != "function_declarator":
        node = node.child_by_field_name("declarator")
    return node.child_by_field_name("parameters") if node is not None else None


def param_decls(params: Node | None) -> list[Node]:
    if params is None:
        return []
    return [c for c in params.named_children if c.type.endswith("parameter_declaration")]


def split_template(node: Node) -> tuple[str, tuple[str, ...]]:
    """`ns::k<16, float>` -> ("ns::k", ("16", "float"))."""
    args_node = last_template_args(node)
    args = () if args_node is None else tuple(
        expr(tsx.text(a)) for a in args_node.named_children)
    return without_args(node, args_node), args


def template_name(node: Node) -> str:
    """`ns::k<16, float>` -> "ns::k"."""
    return without_args(node, last_template_args(node))


def without_args(node: Node, args_node: Node | None) -> str:
    if args_node is None:
        return compact(tsx.text(node))
    full = tsx.text(node)
    start = args_node.start_byte - node.start_byte
    end = args_node.end_byte - node.start_byte
    return compact(full[:start] + full[end:])


def last_template_args(node: Node) -> Node | None:
    if node.type == "template_function":
        return node.child_by_field_name("arguments")
    if node.type == "qualified_identifier":
        name = node.child_by_field_name("name")
        return last_template_args(name) if name is not None else None
    return None


def template_arg_names(node: Node) -> list[str]:
    """Names passed as template arguments of `node` (`adapter<ns::launch, 4>` ->
    ["ns::launch"]): where a function is handed to a template, it is called there."""
    args = last_template_args(node)
    if args is None:
        return []
    out = []
    for arg in args.named_children:
        inner = arg.named_children[0] if arg.type == "type_descriptor" and \
            len(arg.named_children) == 1 else arg
        inner = strip(inner)
        if inner.type in NAME_TYPES or inner.type in ("type_identifier", "template_type"):
            out.append(template_name(inner) if inner.type in NAME_TYPES
                       else compact(tsx.text(inner)))
    return out


def strip(node: Node) -> Node:
    """The callee inside casts, parentheses, `&` and wrapper calls such as TORCH_FN(f)."""
    while True:
        if node.type in _WRAPPERS:
            inner = node.child_by_field_name("value") or node.child_by_field_name("argument")
            inner = inner or (node.named_children[-1] if node.named_children else None)
        elif node.type == "call_expression" and is_cast_call(node):
            args = node.child_by_field_name("arguments")
            inner = args.named_children[0] if args is not None and args.named_children else None
        else:
            return node
        if inner is None:
            return node
        node = inner


def is_cast_call(call: Node) -> bool:
    fn = call.child_by_field_name("function")
    if fn is None:
        return False
    return template_name(fn).rsplit("::", 1)[-1] in CAST_FUNCTIONS


def string_value(node: Node) -> str:
    return "".join(tsx.text(c) for c in node.named_children if c.type == "string_content")
