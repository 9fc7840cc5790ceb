"""Registration renames: each build's TORCH_LIBRARY namespaces get the build's own suffix.

Two builds loaded into one process (the original and a candidate) must not register
the same namespace; renaming is done on the staged text with tree-sitter's byte
offsets, so comments and strings that merely mention a namespace are left alone.

The namespace may be a macro: `TORCH_LIBRARY_EXPAND(KFOPS_NAMESPACE, m)` with
`#define KFOPS_NAMESPACE kfops` in a header, or `TORCH_EXTENSION_NAME`, which the build
defines (kernel-builder's `TORCH_LIBRARY_EXPAND(TORCH_EXTENSION_NAME, ops)`). Such an
argument is resolved through the `#define`s the build sees (`aliases`) and replaced by
the renamed namespace itself.
"""

from __future__ import annotations

import re
import threading
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from kfbot.scan import treesitter as tsx

MACRO_Q = """(function_definition declarator: (function_declarator
  declarator: (identifier) @macro parameters: (parameter_list . (_) @first))
  body: (compound_statement)
  (#match? @macro "^(PYBIND11_MODULE|TORCH_LIBRARY(_IMPL|_FRAGMENT)?(_EXPAND)?)$"))"""
STRING_Q = "(string_literal (string_content) @content)"
# Namespaces that belong to torch: an extension registers kernels into them
# (TORCH_LIBRARY_IMPL(aten, ...)) but never owns them, so they are never renamed.
TORCH_NAMESPACES = frozenset({"_", "aten", "prim", "prims", "quantized", "c10d", "profiler"})
DEFINING_MACROS = frozenset({"TORCH_LIBRARY", "TORCH_LIBRARY_FRAGMENT", "TORCH_LIBRARY_EXPAND",
                             "TORCH_LIBRARY_FRAGMENT_EXPAND"})
# `#define NAME value` where the value is one identifier: a namespace by another name.
_ALIAS = re.compile(r"^[ \t]*#[ \t]*define[ \t]+(\w+)[ \t]+([A-Za-z_]\w*)[ \t]*$", re.MULTILINE)
# kernel-builder's registration.h: exports PyInit_<NAME> for a TORCH_LIBRARY-only module.
_REGISTER_EXTENSION = re.compile(r"^[ \t]*REGISTER_EXTENSION[ \t]*\(", re.MULTILINE)
# One shared tree-sitter parser, and builds stage in parallel threads.
_PARSE_LOCK = threading.Lock()


def parse(text: str) -> tsx.Tree:
    with _PARSE_LOCK:
        return tsx.parse_cuda(text.encode("utf-8"))


@dataclass(frozen=True)
class _Macro:
    name: str
    argument: str  # the first macro argument as written
    start: int  # its byte offsets
    end: int


def macros(text: str) -> list[_Macro]:
    if "PYBIND11_MODULE" not in text and "TORCH_LIBRARY" not in text:
        return []  # most files: no parse needed
    tree = parse(text)
    return [
        _Macro(
            tsx.text(m["macro"]),
            tsx.text(m["first"]).strip(),
            m["first"].start_byte,
            m["first"].end_byte,
        )
        for m in tsx.matches(MACRO_Q, tree.root_node)
    ]


def aliases(texts: Iterable[str], defines: Mapping[str, str]) -> dict[str, str]:
    """Macro names that stand for an identifier, as the build sees them: `#define`s in
    its sources, overridden by its -D flags (`defines`, TORCH_EXTENSION_NAME too)."""
    found = {name: value for text in texts for name, value in _ALIAS.findall(text)}
    found.update({k: v for k, v in defines.items() if re.fullmatch(r"[A-Za-z_]\w*", v)})
    return found


def resolve(argument: str, alias: Mapping[str, str]) -> str:
    seen = {argument}
    while argument in alias and alias[argument] not in seen:
        argument = alias[argument]
        seen.add(argument)
    return argument


def registers_module(text: str) -> bool:
    """Whether `text` defines a Python module entry point (pybind11 or kernel-builder's)."""
    return _REGISTER_EXTENSION.search(text) is not None or any(
        m.name == "PYBIND11_MODULE" for m in macros(text))


def owned_namespaces(texts: Iterable[str], alias: Mapping[str, str]) -> set[str]:
    """Namespaces this build defines (and may rename); never torch's own."""
    return {
        resolve(macro.argument, alias)
        for text in texts
        for macro in macros(text)
        if macro.name in DEFINING_MACROS and resolve(macro.argument, alias) not in TORCH_NAMESPACES
    }


def _rename_edits(
    text: str, renames: Mapping[str, str], alias: Mapping[str, str], modules: bool = True
) -> list[tuple[int, int, bytes]]:
    edits: list[tuple[int, int, bytes]] = []
    for macro in macros(text):
        namespace = resolve(macro.argument, alias)
        if macro.name == "PYBIND11_MODULE" and macro.argument != "TORCH_EXTENSION_NAME" \
                and modules:
            edits.append((macro.start, macro.end, b"TORCH_EXTENSION_NAME"))
        elif macro.name != "PYBIND11_MODULE" and namespace in renames:
            edits.append((macro.start, macro.end, renames[namespace].encode()))
    if renames and any(f"{old}::" in text for old in renames):
        edits += _qualified_string_edits(text, renames)
    return edits


def _qualified_string_edits(text: str, renames: Mapping[str, str]) -> list[tuple[int, int, bytes]]:
    """C++ strings such as "kfln::layernorm" (schemas, dispatcher look-ups) follow too."""
    edits: list[tuple[int, int, bytes]] = []
    tree = parse(text)
    for match in tsx.matches(STRING_Q, tree.root_node):
        node = match["content"]
        old, sep, _ = tsx.text(node).partition("::")
        if sep and old in renames:
            edits.append(
                (node.start_byte, node.start_byte + len(old.encode()), renames[old].encode())
            )
    return edits


def rename_registrations(
    text: str, renames: Mapping[str, str], alias: Mapping[str, str] | None = None,
    modules: bool = True,
) -> str:
    """Rewrite TORCH_LIBRARY* namespaces and, with `modules`, PYBIND11_MODULE's literal
    name in place (a build of the repository's own keeps its module names: it may not
    define TORCH_EXTENSION_NAME).

    Byte offsets come from tree-sitter, so comments and strings that merely
    mention a namespace are left alone, and line numbers never move.
    """
    edits = _rename_edits(text, renames, alias or {}, modules)
    if not edits:
        return text
    data = text.encode("utf-8")
    for start, end, new in sorted(edits, reverse=True):
        data = data[:start] + new + data[end:]
    return data.decode("utf-8")

