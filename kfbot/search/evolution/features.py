"""The behaviour cell of a candidate, read off its CUDA/C++ source with tree-sitter.

A cell (`kfbot.search.model.Cell`) says *how* a candidate does its work, so that the
MAP-Elites archive keeps different designs apart. Only code inside `__global__` and
`__device__` functions counts for memory, sync and decomposition. The facts come
from tree-sitter nodes (calls, types, subscripts, arithmetic), so a `__shfl_xor_sync`
or `atomicAdd` written in a comment or a string is never seen, which a regex over
the text could not promise.

Each axis takes the first value, in this order, whose sign is found (the rarer and
more telling design wins: a kernel that shuffles usually also has a barrier):

memory
  tensor-core     `wmma::`/`nvcuda::` names, `mma_sync`, `__hmma*`/`__imma*`, or
                  `mma.sync`/`wgmma` in inline asm
  shared-tiling   a `__shared__` array (or a pointer made from one) subscripted in a loop
  vectorized      a float2/float4/int4/half2/... type (a variable or a cast)
  global          otherwise
sync
  warp-shuffle    `__shfl*_sync`, `__reduce_*_sync`, `cg::reduce`, `tile.shfl_*()`
  atomics         `atomicAdd`, `atomicMax`, ... (any `atomic[A-Z]*` call)
  barriers        `__syncthreads*`, `__syncwarp`, `cg::sync(g)`, `g.sync()`
  none            otherwise
decomposition
  grid-stride     a `+=` or for-loop step built from blockDim * gridDim (maybe via a variable)
  warp-per-row    a warp id (threadIdx.x / 32, / warpSize, >> 5) combined with blockIdx
  block-per-tile  blockIdx.x and blockIdx.y each scaled by a constant (literal,
                  UPPER_CASE or kName): fixed-size tiles
  block-per-row   blockIdx.x alone (maybe through a variable) scaled by a non-constant
                  (`x + blockIdx.x * cols`), used as a whole subscript, or stored in a
                  variable named like `row`
  thread-per-element  blockIdx.x * (blockDim.x or a constant) + threadIdx.x
  other           otherwise
block
  The bucket of `block_size` when given, else of the first kernel's
  `__launch_bounds__(N, ...)` when N is an integer literal, else "?".

Variables are followed through their assignments in the same function, so
`int stride = blockDim.x * gridDim.x; ... i += stride` is still a grid-stride loop.
"""

from __future__ import annotations

import bisect
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from kfbot.scan import treesitter as tsx
from kfbot.scan.treesitter import Node
from kfbot.search.model import Cell

VECTOR_TYPES = ("float2", "float4", "double2", "int2", "int4", "uint2", "uint4", "half2",
                "__half2", "__nv_bfloat162", "nv_bfloat162", "longlong2", "ulonglong2")
_VECTOR_LIST = " ".join(f'"{name}"' for name in VECTOR_TYPES)

# One query per source: each pattern below is one index of `matches_by_pattern`.
KERNEL_Q = '(function_definition "__global__" body: (_)) @fn'
DEVICE_Q = '(function_definition "__device__" body: (_)) @fn'
BOUNDS_Q = "(launch_bounds . (_) @max) @bounds"
CALL_Q = "(call_expression function: (_) @callee) @call"
VECTOR_Q = f"((type_identifier) @type (#any-of? @type {_VECTOR_LIST}))"
WMMA_Q = '((namespace_identifier) @ns (#any-of? @ns "wmma" "nvcuda"))'
ASM_Q = '(gnu_asm_expression assembly_code: (_) @asm (#match? @asm "mma\\\\.sync|wgmma"))'
SHARED_Q = """(declaration (type_qualifier) @q declarator: (array_declarator) @array
  (#eq? @q "__shared__"))"""
SUBSCRIPT_Q = "(subscript_expression argument: (_) @base indices: (_) @index) @sub"
LOOP_Q = "[(for_statement) (while_statement) (do_statement) (for_range_loop)] @loop"
ASSIGN_Q = """[(init_declarator declarator: [(identifier) @name
                                           (pointer_declarator declarator: (identifier) @name)]
                               value: (_) @value)
  (assignment_expression left: (identifier) @name operator: "=" right: (_) @value)]"""
STEP_Q = """[(assignment_expression operator: "+=" right: (_) @step)
  (for_statement update: (_) @step)]"""
BINARY_Q = "(binary_expression) @expr"
PATTERNS = (KERNEL_Q, DEVICE_Q, BOUNDS_Q, CALL_Q, VECTOR_Q, WMMA_Q, ASM_Q, SHARED_Q,
            SUBSCRIPT_Q, LOOP_Q, ASSIGN_Q, STEP_Q, BINARY_Q)

SHUFFLE_NAME = re.compile(r"^__(shfl\w*|reduce_\w+_sync)$")
ATOMIC_NAME = re.compile(r"^(atomic[A-Z]\w*|__nv_atomic\w*)$")
BARRIER_NAME = re.compile(r"^(__syncthreads(_count|_and|_or)?|__syncwarp|__barrier_sync)$")
TENSOR_NAME = re.compile(
    r"^(__[hib]mma\w*|mma_sync|load_matrix_sync|store_matrix_sync|fill_fragment)$")
CG_NAMESPACES = frozenset({"cg", "cooperative_groups"})
CONSTANT_NAME = re.compile(r"^([A-Z][A-Z0-9_]+|k[A-Z]\w*)$")  # TILE, BLOCK_M, kTile
WARP_SIZE = re.compile(r"^(32|warpSize|[A-Za-z_]*[Ww][Aa][Rr][Pp]_?[Ss][Ii][Zz][Ee])$")
BUILTINS = {"threadIdx.x": {"tid.x"}, "blockIdx.x": {"bid.x", "=bid.x"},
            "blockIdx.y": {"bid.y", "=bid.y"}}
BUCKETS = ((64, "<=64"), (128, "128"), (256, "256"), (512, "512"), (1024, "1024"))
# Tags starting with "=" say what a whole expression *is* (not just what it contains);
# they do not survive arithmetic.
EXACT = frozenset({"=bid.x", "=bid.y", "=const"})
MAX_DEPTH = 200  # expression/variable nesting followed; deeper code is generated noise


def cell_of(sources: Sequence[str], block_size: int | None = None) -> Cell:
    """The behaviour cell of a candidate made of these CUDA/C++ source texts."""
    facts = _Facts()
    for source in sources:
        _Source(tsx.parse_cuda(source.encode("utf-8")).root_node).read(facts)
    return Cell(_memory(facts.signs), _sync(facts.signs), _decomposition(facts.signs),
                _block(block_size if block_size is not None else facts.bounds))


@dataclass
class _Facts:
    """What all sources of one candidate showed: signs by name, the first kernel's bounds."""

    signs: set[str] = field(default_factory=set)
    bounds: int | None = None
    seen_kernel: bool = False


def _memory(signs: set[str]) -> str:
    return _first(signs, ("tensor-core", "shared-tiling", "vectorized"), "global")


def _sync(signs: set[str]) -> str:
    return _first(signs, ("warp-shuffle", "atomics", "barriers"), "none")


def _decomposition(signs: set[str]) -> str:
    if "tile.x" in signs and "tile.y" in signs:
        signs = signs | {"block-per-tile"}
    order = ("grid-stride", "warp-per-row", "block-per-tile", "block-per-row",
             "thread-per-element")
    return _first(signs, order, "other")


def _first(signs: set[str], order: Iterable[str], default: str) -> str:
    return next((name for name in order if name in signs), default)


def _block(size: int | None) -> str:
    if size is None or size <= 0:
        return "?"
    return next((label for limit, label in BUCKETS if size <= limit), "?")


class _Source:
    """One parsed source: its query matches, device-code ranges and variable values."""

    def __init__(self, root: Node) -> None:
        found = tsx.matches_by_pattern(PATTERNS, root)
        self._found = dict(zip(PATTERNS, found, strict=True))
        self.kernels = sorted((m["fn"] for m in self._found[KERNEL_Q]),
                              key=lambda fn: fn.start_byte)
        functions = sorted(self.kernels + [m["fn"] for m in self._found[DEVICE_Q]],
                           key=lambda fn: fn.start_byte)
        self._starts = [fn.start_byte for fn in functions]
        self._functions = functions
        self.shared = {_declared_name(m["array"]) for m in self._found[SHARED_Q]}
        self.values = self._variable_values()
        self._memo: dict[int, frozenset[str]] = {}

    def device(self, pattern: str, capture: str) -> list[dict[str, Node]]:
        """The matches of `pattern` whose `capture` lies in a __global__/__device__ function."""
        return [m for m in self._found[pattern] if self.function_of(m[capture]) is not None]

    def function_of(self, node: Node) -> Node | None:
        # Byte ranges, not `Node.parent`: parents are found by a walk from the root.
        i = bisect.bisect_right(self._starts, node.start_byte) - 1
        if i >= 0 and node.end_byte <= self._functions[i].end_byte:
            return self._functions[i]
        return None

    def _variable_values(self) -> dict[tuple[int, str], list[Node]]:
        """Values assigned to each local name, keyed by (function start, name)."""
        values: dict[tuple[int, str], list[Node]] = {}
        for m in self.device(ASSIGN_Q, "value"):
            fn = self.function_of(m["value"])
            assert fn is not None  # `device` kept only matches inside a function
            values.setdefault((fn.start_byte, tsx.text(m["name"])), []).append(m["value"])
        return values

    def read(self, facts: _Facts) -> None:
        """Add this source's signs (and the first kernel's bounds) to `facts`."""
        if not facts.seen_kernel and self.kernels:
            facts.seen_kernel = True
            facts.bounds = self._bounds(self.kernels[0])
        facts.signs |= self._call_signs() | self._memory_signs() | self._work_signs()

    def _bounds(self, kernel: Node) -> int | None:
        for m in self._found[BOUNDS_Q]:
            if kernel.start_byte <= m["bounds"].start_byte < kernel.end_byte:
                return _int_literal(m["max"])
        return None

    def _call_signs(self) -> set[str]:
        signs: set[str] = set()
        for m in self.device(CALL_Q, "call"):
            signs |= _call_sign(m["callee"])
        return signs

    def _memory_signs(self) -> set[str]:
        signs: set[str] = set()
        if self.device(WMMA_Q, "ns") or self.device(ASM_Q, "asm"):
            signs.add("tensor-core")
        if self.device(VECTOR_Q, "type"):
            signs.add("vectorized")
        if self.shared and self._shared_in_loop():
            signs.add("shared-tiling")
        return signs

    def _shared_in_loop(self) -> bool:
        """Is a __shared__ array (or a pointer made from one) subscripted inside a loop?"""
        loops = [(m["loop"].start_byte, m["loop"].end_byte) for m in self.device(LOOP_Q, "loop")]
        for m in self.device(SUBSCRIPT_Q, "sub"):
            sub = m["sub"]
            inside = any(start <= sub.start_byte and sub.end_byte <= end for start, end in loops)
            if inside and "smem" in self.tags(m["base"]):
                return True
        return False

    def _work_signs(self) -> set[str]:
        """Decomposition signs: tags of all arithmetic, subscripts, assignments and steps."""
        signs: set[str] = set()
        for m in self.device(BINARY_Q, "expr"):
            signs |= self.tags(m["expr"])
        for m in self.device(STEP_Q, "step"):
            if "stride" in self.tags(m["step"]):
                signs.add("grid-stride")
        for m in self.device(SUBSCRIPT_Q, "sub"):
            if "=bid.x" in self.tags(_only_child(m["index"])):
                signs.add("row")  # x[blockIdx.x]: one block, one row
        for m in self.device(ASSIGN_Q, "value"):
            if "row" in tsx.text(m["name"]).lower() and "=bid.x" in self.tags(m["value"]):
                signs.add("row")  # int row = blockIdx.x
        renamed = {"row": "block-per-row", "gtid": "thread-per-element",
                   "warp-row": "warp-per-row"}
        return {renamed.get(sign, sign) for sign in signs}

    def tags(self, node: Node, depth: int = 0) -> frozenset[str]:
        """What an expression is built from (see `_node_tags`), memoized per node."""
        hit = self._memo.get(node.id)
        if hit is not None:
            return hit
        if depth > MAX_DEPTH:
            return frozenset()
        self._memo[node.id] = frozenset()  # a variable defined from itself adds nothing
        found = frozenset(self._node_tags(node, depth + 1))
        self._memo[node.id] = found
        return found

    def _node_tags(self, node: Node, depth: int) -> set[str]:
        kind = node.type
        if kind == "field_expression":
            return _builtin_tags(node) or self._children_tags(node, depth)
        if kind == "identifier":
            return self._identifier_tags(node, depth)
        if kind == "number_literal":
            return {"=const"}
        if kind == "binary_expression":
            return self._binary_tags(node, depth)
        inner = _cast_operand(node)
        if inner is not None:  # (x), (int)x, static_cast<int>(x) are still x
            return set(self.tags(inner, depth))
        return self._children_tags(node, depth)

    def _children_tags(self, node: Node, depth: int) -> set[str]:
        found: set[str] = set()
        for child in node.named_children:
            found |= self.tags(child, depth)
        return found - EXACT

    def _identifier_tags(self, node: Node, depth: int) -> set[str]:
        name = tsx.text(node)
        fn = self.function_of(node)
        values = self.values.get((fn.start_byte, name), []) if fn is not None else []
        found: set[str] = {"smem"} if name in self.shared else set()
        if not values and CONSTANT_NAME.match(name):
            found.add("=const")  # a macro or constexpr such as TILE or kBlock
        for value in values:
            found |= self.tags(value, depth)
        return found

    def _binary_tags(self, node: Node, depth: int) -> set[str]:
        left, right = node.child_by_field_name("left"), node.child_by_field_name("right")
        operator = node.child_by_field_name("operator")
        if left is None or right is None or operator is None:
            return self._children_tags(node, depth)
        lhs, rhs = self.tags(left, depth), self.tags(right, depth)
        found = set(lhs | rhs) - EXACT
        if operator.type == "*":
            found |= _product_tags(lhs, rhs) | _product_tags(rhs, lhs)
        elif operator.type == "+" and "bscale" in found and "tid.x" in found:
            found.add("gtid")
        elif _is_warp_id(operator.type, lhs, right):
            found.add("warp")
        if "warp" in found and ("bid.x" in found or "bid.y" in found):
            found.add("warp-row")
        return found


def _product_tags(factor: frozenset[str], other: frozenset[str]) -> set[str]:
    """Shape tags of `factor * other` (called both ways round)."""
    found: set[str] = set()
    if "bdim" in factor and "gdim" in other:
        found.add("stride")  # blockDim.x * gridDim.x: all threads of the grid
    constant = "=const" in other
    if "=bid.x" in factor:
        # blockIdx.x * blockDim.x or * 256: the block's first thread; * cols: its row
        found.add("bscale" if constant or "bdim" in other else "row")
        if constant:
            found.add("tile.x")
    if "=bid.y" in factor and constant:
        found.add("tile.y")
    return found


def _is_warp_id(operator: str, lhs: frozenset[str], right: Node) -> bool:
    """threadIdx.x / 32, / warpSize or >> 5: which warp a thread is in."""
    if "tid.x" not in lhs:
        return False
    value = tsx.text(_unwrap(right))
    return (operator == "/" and WARP_SIZE.match(value) is not None) or (
        operator == ">>" and value == "5")


def _builtin_tags(node: Node) -> set[str]:
    name = re.sub(r"\s", "", tsx.text(node))
    if name.startswith("blockDim."):
        return {"bdim"}
    if name.startswith("gridDim."):
        return {"gdim"}
    return set(BUILTINS.get(name, ()))


def _cast_operand(node: Node) -> Node | None:
    """The operand of a parenthesis or a cast, which keeps what the operand *is*."""
    if node.type == "parenthesized_expression" and node.named_child_count == 1:
        return node.named_children[0]
    if node.type == "cast_expression":
        return node.child_by_field_name("value")
    if node.type == "call_expression":
        callee = tsx.text(node.child_by_field_name("function"))
        args = node.child_by_field_name("arguments")
        if callee.startswith("static_cast") and args is not None and args.named_child_count == 1:
            return args.named_children[0]
    return None


def _unwrap(node: Node) -> Node:
    inner = _cast_operand(node)
    return node if inner is None else _unwrap(inner)


def _only_child(node: Node) -> Node:
    return node.named_children[0] if node.named_child_count == 1 else node


def _call_sign(callee: Node) -> set[str]:
    """The memory/sync sign a call shows: `__shfl_xor_sync(...)`, `cg::sync(block)`..."""
    path = re.split(r"::|\.|->", re.sub(r"\s", "", tsx.text(callee)).split("<", 1)[0])
    name, owner = path[-1], (path[-2] if len(path) > 1 else "")
    method = callee.type == "field_expression"  # tile.shfl_down(v, 1), block.sync()
    if SHUFFLE_NAME.match(name) or (name == "reduce" and owner in CG_NAMESPACES) or (
            method and name.startswith("shfl")):
        return {"warp-shuffle"}
    if ATOMIC_NAME.match(name):
        return {"atomics"}
    if BARRIER_NAME.match(name) or (name == "sync" and (method or owner in CG_NAMESPACES)):
        return {"barriers"}
    if TENSOR_NAME.match(name):
        return {"tensor-core"}
    return set()


def _declared_name(declarator: Node) -> str:
    """`tile` of `tile[16][16]`: array declarators nest, the name is innermost."""
    inner = declarator.child_by_field_name("declarator")
    return tsx.text(declarator) if inner is None else _declared_name(inner)


def _int_literal(node: Node) -> int | None:
    digits = tsx.text(node).rstrip("uUlL")
    try:
        return int(digits, 0)
    except ValueError:
        return None
