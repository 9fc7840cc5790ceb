"""The one module that talks to tree-sitter: parsers, compiled queries, node helpers.

The CUDA grammar is used for every C/C++/CUDA file: it is a superset of the C++
grammar that also understands `__global__`, `__launch_bounds__` and `<<<...>>>`,
which the plain C++ grammar turns into error nodes.
"""

from __future__ import annotations

from collections.abc import Iterator
from functools import cache

import tree_sitter as ts
import tree_sitter_cuda

Node = ts.Node
Tree = ts.Tree


@cache
def cuda_language() -> ts.Language:
    return ts.Language(tree_sitter_cuda.language())


@cache
def _parser() -> ts.Parser:
    return ts.Parser(cuda_language())


def parse_cuda(source: bytes) -> ts.Tree:
    return _parser().parse(source)


@cache
def query(pattern: str) -> ts.Query:
    """Compile a query once per process; patterns are module constants."""
    compiled: ts.Query = ts.Query(cuda_language(), pattern)
    return compiled


def matches(pattern: str, node: Node) -> Iterator[dict[str, Node]]:
    """Yield each match of `pattern` under `node` as {capture: first node}."""
    cursor = ts.QueryCursor(query(pattern))
    for _, captures in cursor.matches(node):
        yield {name: nodes[0] for name, nodes in captures.items()}


def matches_by_pattern(patterns: tuple[str, ...], node: Node) -> list[list[dict[str, Node]]]:
    """Run several one-pattern queries as one query (one walk of the tree).

    Returns, for each pattern in order, its matches as {capture: first node}.
    """
    combined = query("\n".join(patterns))
    if combined.pattern_count != len(patterns):
        raise ValueError("each pattern must be exactly one query pattern")
    out: list[list[dict[str, Node]]] = [[] for _ in patterns]
    for index, captures in ts.QueryCursor(combined).matches(node):
        out[index].append({name: nodes[0] for name, nodes in captures.items()})
    return out


def text(node: Node | None) -> str:
    # `Node.text` copies the bytes out of the source at every access: read it once.
    raw = node.text if node is not None else None
    return raw.decode("utf-8", errors="replace") if raw is not None else ""


def line(node: Node) -> int:
    """1-based line of the node's first character."""
    return int(node.start_point[0]) + 1


def error_lines(tree: ts.Tree, limit: int = 5) -> list[int]:
    """Lines of the first `limit` ERROR or MISSING nodes, for a readable problem report."""
    found: list[int] = []
    cursor = ts.QueryCursor(query("(ERROR) @e"))
    for node in cursor.captures(tree.root_node).get("e", []):
        found.append(line(node))
        if len(found) >= limit:
            return sorted(set(found))
    if not found and tree.root_node.has_error:
        found.extend(_missing_lines(tree.root_node, limit))
    return sorted(set(found))


def _missing_lines(root: Node, limit: int) -> list[int]:
    out: list[int] = []
    stack = [root]
    while stack and len(out) < limit:
        node = stack.pop()
        if node.is_missing:
            out.append(line(node))
        elif node.has_error:
            stack.extend(node.children)
    return out


def syntax_errors(tree: ts.Tree, limit: int = 20) -> list[tuple[int, int, str]]:
    """The first `limit` places the grammar could not parse, in source order, each as
    (first line, last line, what is wrong): a MISSING token the parser had to assume,
    or an ERROR node it had to skip."""
    found: list[tuple[int, int, str]] = []
    stack = [tree.root_node]
    while stack and len(found) < limit:
        node = stack.pop()
        if node.is_missing:
            found.append((line(node), line(node), f"missing `{node.type}`"))
        elif node.type == "ERROR":
            words = " ".join(text(node).split())
            shown = words if len(words) <= 40 else words[:39] + "…"
            found.append((line(node), int(node.end_point[0]) + 1,
                          f"cannot parse `{shown}`" if shown else "cannot parse this"))
        elif node.has_error:
            stack.extend(reversed(node.children))
    return sorted(found)


def pattern_matches(pattern: str, node: Node) -> list[tuple[int, dict[str, Node]]]:
    """Each match of a query of any number of patterns as (pattern index, {capture: node})."""
    cursor = ts.QueryCursor(query(pattern))
    return [(index, {name: nodes[0] for name, nodes in captures.items()})
            for index, captures in cursor.matches(node)]
