"""The C++/CUDA units the static checks read: each source parsed once, with what
the checks look up in it (device functions, kernels, launches, macro bodies, hits).

Both kinds of static check, the rules' queries (`static`) and the built-in structural
ones (`static_builtin`), read these records; neither imports the other's.
"""

from __future__ import annotations

import bisect
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from kfbot.anticheat.rules import Scope
from kfbot.scan import treesitter as tsx
from kfbot.scan.treesitter import Node

# Tokens no space is put after / before when a hit's text is normalised.
TIGHT_AFTER = frozenset({"::", ".", "->", "(", "[", "~", "!", "&", "*"})
TIGHT_BEFORE = frozenset({"::", ".", "->", "(", ")", "[", "]", ",", ";"})
TEMPLATE_LISTS = frozenset({"template_argument_list", "template_parameter_list"})
WHOLE_TOKENS = frozenset({"string_literal", "raw_string_literal", "char_literal",
                          "number_literal", "concatenated_string"})


@dataclass(frozen=True)
class Source:
    path: str  # repo-relative; an inline source is labelled "softmax_inline.py#cuda_sources"
    text: str
    line_offset: int = 0  # added to tree-sitter line numbers (inline strings start inside a .py)


@dataclass(frozen=True)
class StaticInput:
    original: tuple[Source, ...]  # every C++/CUDA unit of the op's build as it is now
    candidate: tuple[Source, ...]  # the same units with the candidate's edits applied
    # path -> (original text or None if new, candidate text) for every file the candidate edits
    changed: Mapping[str, tuple[str | None, str]]
    allowed: tuple[str, ...]  # files the task allows it to edit
    original_flags: tuple[str, ...] = ()  # nvcc/cxx flags of the original build
    candidate_flags: tuple[str, ...] = ()  # flags with the candidate's edits/params
    op_dtypes: tuple[str, ...] = ()  # dtypes the op is verified with, e.g. ("float32",)


@dataclass(frozen=True)
class Hit:
    """One match of a rule: its text (the key `new` mode counts) and where it is."""

    key: str
    path: str
    line: int  # 1-based line in the file, line_offset applied
    source_line: str


class Unit:
    """One parsed text: a source, or the bodies of its macros laid out on their own lines."""

    def __init__(self, source: Source, text: str, *, macros: bool = False) -> None:
        self.source = source
        self.macros = macros
        self.tree = tsx.parse_cuda(text.encode())
        self.root: Node = self.tree.root_node
        self.lines = source.text.split("\n")  # tree-sitter counts "\n" only
        self.hits: dict[str, list[Hit]] = {}
        self.kernels: list[dict[str, Node]] = []  # {"fn", "name"} per __global__ definition
        self.launches: list[dict[str, Node]] = []  # {"callee", "call"} per <<<...>>> call
        self.api_launches: list[dict[str, Node]] = []  # {"api", "args"} per cudaLaunchKernel
        self.macro_bodies: list[Node] = []
        self._device: list[tuple[int, int]] = []
        self._device_starts: list[int] = []

    def set_device_functions(self, functions: Iterable[Node]) -> None:
        self._device = sorted((f.start_byte, f.end_byte) for f in functions)
        self._device_starts = [start for start, _ in self._device]

    def in_scope(self, node: Node, scope: Scope) -> bool:
        """Macro bodies may be expanded anywhere, so they are in every scope."""
        if scope == "any" or self.macros:
            return True
        return (scope == "device") == self._in_device_function(node)

    def _in_device_function(self, node: Node) -> bool:
        i = bisect.bisect_right(self._device_starts, node.start_byte) - 1
        # Device functions do not nest, but a lambda or a local struct may sit in one.
        while i >= 0:
            start, end = self._device[i]
            if start <= node.start_byte and node.end_byte <= end:
                return True
            i -= 1
        return False

    def hit(self, node: Node) -> Hit:
        row = tsx.line(node)
        text = self.lines[row - 1] if row <= len(self.lines) else ""
        return Hit(normalized(node), self.source.path, row + self.source.line_offset,
                   text.strip())


def normalized(node: Node) -> str:
    """The node's tokens without comments, one space apart except around `::`, `.`, `(`...

    Two spellings of the same code give the same text, so `new` mode counts them as one.
    """
    out: list[str] = []
    stack: list[tuple[Node, bool]] = [(node, False)]  # (node, is a template's bracket)
    glue = False  # the previous token wants no space after it
    while stack:
        current, bracket = stack.pop()
        if current.type == "comment":
            continue
        if current.child_count == 0 or current.type in WHOLE_TOKENS:
            token = tsx.text(current)
            if out and not glue and not bracket and token not in TIGHT_BEFORE:
                out.append(" ")
            out.append(token)
            glue = bracket or token in TIGHT_AFTER
        else:
            template = current.type in TEMPLATE_LISTS
            stack.extend((c, template and c.type in ("<", ">")) for c in reversed(current.children))
    return "".join(out)
