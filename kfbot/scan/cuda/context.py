"""What the per-file CUDA readers may ask of the file being read: one Protocol.

`facts.Ctx` builds the lookups once per file (one multi-pattern query, function
and scope ranges) and hands itself to `bindings`, `calls` and `macros`.
They name it through this Protocol rather than by importing `facts`, which
imports them: the readers sit below the module that composes them.
"""

from __future__ import annotations

from typing import Protocol

from kfbot.scan.treesitter import Node


class FileContext(Protocol):
    """One parsed CUDA/C++ file and its lookups (implemented by `facts.Ctx`)."""

    file: str
    # The bytes the tree was parsed from: a byte test tells a file holds no such thing.
    source: bytes
    # The query pattern of a call, whose matches the readers take from the file's query.
    call_pattern: str
    # Every function definition as (start byte, end byte, node), in file order.
    functions: list[tuple[int, int, Node]]
    # Parameter names by function start byte, filled by whoever reads them first.
    params: dict[int, tuple[str, ...]]

    def line(self, node: Node) -> int: ...

    def found(self, pattern: str) -> list[dict[str, Node]]: ...

    def found_in(self, pattern: str, capture: str, node: Node) -> list[dict[str, Node]]: ...

    def conditions_at(self, node: Node, fn: Node | None) -> tuple[str, ...]: ...

    def scope_of(self, node: Node) -> list[str]: ...

    def enclosing_function(self, node: Node) -> Node | None: ...

    def device_only(self, fn: Node) -> bool: ...

    def function_name(self, fn: Node) -> str | None: ...
