"""Registration renames: each build's TORCH_LIBRARY namespaces get the build's own suffix.

Two builds loaded into one process (the original and a candidate) must not register
the same namespace; renaming is done on the staged text with tree-sitter's byte
offsets, so comments and strings that merely mention a namespace are left alone.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from kfbot.scan import treesitter as tsx

MACRO_Q = """(function_definition declarator: (function_declarator
  declarator: (identifier) @macro parameters: (parameter_list . (_) @first))
  body: (compound_statement)
  (#match? @macro "^(PYBIND11_MODULE|TORCH_LIBRARY|TORCH_LIBRARY_IMPL|TORCH_LIBRARY_FRAGMENT)$"))"""
STRING_Q = "(string_literal (string_content) @content)"
# Namespaces that belong to torch: an extension registers kernels into them
# (TORCH_LIBRARY_IMPL(aten, ...)) but never owns them, so they are never renamed.
TORCH_NAMESPACES = frozenset({"_", "aten", "prim", "prims", "quantized", "c10d", "profiler"})
DEFINING_MACROS = frozenset({"TORCH_LIBRARY", "TORCH_LIBRARY_FRAGMENT"})
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


def owned_namespaces(texts: Iterable[str]) -> set[str]:
    """Namespaces this build defines (and may rename); never torch's own."""
    return {
        macro.argument
        for text in texts
        for macro in macros(text)
        if macro.name in DEFINING_MACROS and macro.argument not in TORCH_NAMESPACES
    }


def _rename_edits(text: str, renames: Mapping[str, str]) -> list[tuple[int, int, bytes]]:
    edits: list[tuple[int, int, bytes]] = []
    for macro in macros(text):
        if macro.name == "PYBIND11_MODULE" and macro.argument != "TORCH_EXTENSION_NAME":
            edits.append((macro.start, macro.end, b"TORCH_EXTENSION_NAME"))
        elif macro.name != "PYBIND11_MODULE" and macro.argument in renames:
            edits.append((macro.start, macro.end, renames[macro.argument].encode()))
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


def rename_registrations(text: str, renames: Mapping[str, str]) -> str:
    """Rewrite TORCH_LIBRARY* namespaces and PYBIND11_MODULE's literal name in place.

    Byte offsets come from tree-sitter, so comments and strings that merely
    mention a namespace are left alone, and line numbers never move.
    """
    edits = _rename_edits(text, renames)
    if not edits:
        return text
    data = text.encode("utf-8")
    for start, end, new in sorted(edits, reverse=True):
        data = data[:start] + new + data[end:]
    return data.decode("utf-8")

