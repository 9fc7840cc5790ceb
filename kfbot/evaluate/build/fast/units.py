"""The namespace-level items of a C++/CUDA source, read with tree-sitter: what each
defines, which names it mentions, and where its parts sit.

The split build (`split`) decides from these which items a kernel needs and which the
host part needs; every item is a byte range of the file, so a unit can be made from a
file by blanking whole items, which keeps every line where it was.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass, replace
from typing import Literal

from kfbot.evaluate.build.registrations import parse
from kfbot.scan import treesitter as tsx
from kfbot.scan.cuda.syntax import declarator_name

Node = tsx.Node
Kind = Literal["function", "prototype", "type", "variable", "macro", "include", "other"]
# Where a function's code runs: __global__ and __device__ functions on the GPU only,
# __host__ __device__ and constexpr ones on both, the rest on the host.
Side = Literal["kernel", "device", "both", "host"]
VariableKind = Literal["device", "constant", "mutable", "none"]

_CONTAINERS = frozenset({"translation_unit", "declaration_list", "preproc_ifdef", "preproc_if",
                         "preproc_else", "preproc_elif", "preproc_elifdef"})
_NAMES = frozenset({"identifier", "type_identifier", "namespace_identifier",
                    "field_identifier"})
_WORD = re.compile(r"[A-Za-z_]\w*")
# Items every unit keeps as they are: they hold no code of their own.
_SHARED = frozenset({"preproc_include", "using_declaration", "namespace_alias_definition",
                     "comment", "preproc_call"})


@dataclass(frozen=True)
class Item:
    """One namespace-level item of one file, as byte offsets into that file."""

    file: str
    start: int  # the item, with the `;` that ends a type definition
    end: int
    kind: Kind
    names: frozenset[str]  # the names it defines (last components)
    mentions: frozenset[str]  # every name written in it
    side: Side = "host"  # functions and prototypes: where their code runs
    variable: VariableKind = "none"
    body: tuple[int, int] | None = None  # a function's body
    signature: frozenset[str] = frozenset()  # names written outside a function's body
    anonymous: bool = False  # inside an anonymous namespace: no other unit can link to it
    linkage: tuple[tuple[int, int], ...] = ()  # `static` / `inline` specifiers
    launch_bounds: tuple[int, int] | None = None
    # `__restrict__` on the parameters: not part of the function's type, so the host
    # part's declaration leaves it out and a candidate may add it.
    restricts: tuple[tuple[int, int], ...] = ()
    template: bool = False
    # A function whose definition another unit may repeat without a clash: static,
    # inline, constexpr or a template (or with no host symbol: __device__ only).
    repeatable: bool = True
    include: str | None = None  # an #include's path as written
    shared: bool = False  # kept as it is by every unit: includes, usings, pragmas, comments
    condition: bool = False  # a preprocessor conditional's test (`#if X`)


def items(path: str, text: str) -> list[Item]:
    """Every namespace-level item of `text`, in order, and the names written in its
    preprocessor conditions (as items of kind "other" with `condition` set)."""
    tree = parse(text)
    return list(_walk(path, tree.root_node, anonymous=False))


def _walk(path: str, node: Node, anonymous: bool) -> Iterator[Item]:
    condition = node.child_by_field_name("condition") or (
        node.child_by_field_name("name") if node.type.startswith("preproc_") else None)
    if condition is not None:
        yield Item(path, condition.start_byte, condition.end_byte, "other", frozenset(),
                   _mentions(condition), shared=True, condition=True)
    children = node.children
    for index, child in enumerate(children):
        if condition is not None and child.id == condition.id:
            continue
        if child.type in _CONTAINERS:
            yield from _walk(path, child, anonymous)
        elif child.type == "namespace_definition":
            body = child.child_by_field_name("body")
            named = child.child_by_field_name("name") is not None
            if body is not None:
                yield from _walk(path, body, anonymous or not named)
        elif child.type == "linkage_specification":
            body = child.child_by_field_name("body")
            if body is not None and body.type == "declaration_list":
                yield from _walk(path, body, anonymous)
            elif body is not None:
                yield _item(path, child, child.end_byte, anonymous, body)
        elif child.is_named:
            yield _item(path, child, _semicolon_end(children, index, child), anonymous, child)


def _semicolon_end(siblings: list[Node], index: int, node: Node) -> int:
    nxt = siblings[index + 1] if index + 1 < len(siblings) else None
    return nxt.end_byte if nxt is not None and nxt.type == ";" else node.end_byte


def _item(path: str, node: Node, end: int, anonymous: bool, inner: Node) -> Item:
    template = False
    while inner.type == "template_declaration":
        template = True
        found = next((c for c in inner.named_children if c.type != "template_parameter_list"),
                     None)
        if found is None:
            break
        inner = found
    base = Item(path, node.start_byte, end, "other", frozenset(), _mentions(node),
                anonymous=anonymous, template=template, shared=inner.type in _SHARED)
    if inner.type == "function_definition":
        return _function(base, inner)
    if inner.type == "declaration":
        return _declaration(base, inner)
    if inner.type in ("preproc_def", "preproc_function_def"):
        name = inner.child_by_field_name("name")
        return replace(base, kind="macro", names=frozenset({tsx.text(name)}))
    if inner.type == "preproc_include":
        spec = inner.child_by_field_name("path")
        return replace(base, kind="include", include=tsx.text(spec))
    if inner.type in ("struct_specifier", "class_specifier", "union_specifier",
                      "enum_specifier", "type_definition", "alias_declaration"):
        return replace(base, kind="type", names=_type_names(inner))
    return base


def _function(base: Item, node: Node) -> Item:
    body = node.child_by_field_name("body")
    if body is None:
        return base
    side = _side(node)
    words = {tsx.text(c) for c in node.children}
    repeatable = bool(_linkage(node)) or base.template or base.anonymous or side == "device" \
        or bool(words & {"constexpr", "__forceinline__", "inline"})
    return replace(base, kind="function", names=_declared_names(node), side=side,
                   body=(body.start_byte, body.end_byte), repeatable=repeatable,
                   signature=_mentions_between(node, body), linkage=_linkage(node),
                   launch_bounds=_bounds(node), restricts=_restricts(node))


def _mentions_between(node: Node, body: Node) -> frozenset[str]:
    found: set[str] = set()
    for child in node.children:
        # A declaration needs no launch bounds: the host part is given none.
        if child.start_byte < body.start_byte and child.type != "launch_bounds":
            found |= _mentions(child)
    parent = node.parent
    if parent is not None and parent.type == "template_declaration":
        for child in parent.named_children:
            if child.type == "template_parameter_list":
                found |= _mentions(child)
    return frozenset(found)


def _declaration(base: Item, node: Node) -> Item:
    names = _declared_names(node)
    if any(d.type == "function_declarator" for d in _declarators(node)):
        return replace(base, kind="prototype", names=names, side=_side(node),
                       linkage=_linkage(node))
    words = {tsx.text(c) for c in node.children if not c.is_named or c.type in (
        "type_qualifier", "storage_class_specifier")}
    inner_types = [c for c in node.named_children if c.type in (
        "struct_specifier", "class_specifier", "union_specifier", "enum_specifier")]
    for spec in inner_types:
        names |= _type_names(spec)
    if words & {"__device__", "__constant__", "__managed__", "__shared__"}:
        kind: VariableKind = "device"
    elif words & {"const", "constexpr"} or (words & {"extern"} and not names):
        kind = "constant"
    elif not _declarators(node) and inner_types:
        return replace(base, kind="type", names=names)
    else:
        kind = "constant" if "extern" in words else "mutable"
    return replace(base, kind="variable", names=names, variable=kind)


def _declarators(node: Node) -> list[Node]:
    return [c for c in node.children_by_field_name("declarator")]


def _declared_names(node: Node) -> frozenset[str]:
    found: set[str] = set()
    for declarator in _declarators(node):
        name = declarator_name(declarator)
        if name is not None:
            found.add(tsx.text(name).rsplit("::", 1)[-1].split("<", 1)[0].strip())
    return frozenset(n for n in found if n)


def _type_names(node: Node) -> frozenset[str]:
    found: set[str] = set()
    name = node.child_by_field_name("name")
    if name is not None:
        found.add(tsx.text(name))
    if node.type == "type_definition":
        found |= {tsx.text(declarator_name(d) or d) for d in _declarators(node)}
        for spec in node.named_children:
            if spec.type.endswith("_specifier"):
                found |= _type_names(spec)
    if node.type == "enum_specifier":
        body = node.child_by_field_name("body")
        for entry in body.named_children if body is not None else ():
            entry_name = entry.child_by_field_name("name")
            if entry_name is not None:
                found.add(tsx.text(entry_name))
    return frozenset(found)


def _side(node: Node) -> Side:
    words = {c.type for c in node.children} | {tsx.text(c) for c in node.children
                                               if c.type == "type_qualifier"}
    if "__global__" in words:
        return "kernel"
    if "__device__" in words:
        return "both" if "__host__" in words else "device"
    return "both" if "constexpr" in words else "host"


def _linkage(node: Node) -> tuple[tuple[int, int], ...]:
    return tuple((c.start_byte, c.end_byte) for c in node.children
                 if c.type == "storage_class_specifier" and tsx.text(c) in ("static", "inline"))


def _restricts(node: Node) -> tuple[tuple[int, int], ...]:
    params = node.child_by_field_name("declarator")
    found: list[tuple[int, int]] = []
    stack = [params] if params is not None else []
    while stack:
        current = stack.pop()
        if current.type == "compound_statement":
            continue
        if current.type == "type_qualifier" and tsx.text(current) in (
                "__restrict__", "__restrict", "restrict"):
            found.append((current.start_byte, current.end_byte))
        stack.extend(current.children)
    return tuple(sorted(found))


def _bounds(node: Node) -> tuple[int, int] | None:
    found = next((c for c in node.children if c.type == "launch_bounds"), None)
    return (found.start_byte, found.end_byte) if found is not None else None


def _mentions(node: Node) -> frozenset[str]:
    """Every name written in `node`, macro bodies included (read as words)."""
    found: set[str] = set()
    stack = [node]
    while stack:
        current = stack.pop()
        kind = current.type
        if kind in _NAMES:
            found.add(tsx.text(current))
        elif kind == "preproc_arg":
            found.update(_WORD.findall(tsx.text(current)))
        elif kind not in ("string_literal", "comment", "char_literal", "raw_string_literal"):
            stack.extend(current.children)
    return frozenset(found)
