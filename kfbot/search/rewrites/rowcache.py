"""cache-row-in-shared: a block-per-row kernel that reads its row in several passes (the
maximum, the sum of exponentials, the output; the mean, the variance, the output)
reads it from global memory once, into shared memory, and the later passes from there.

    __shared__ __align__(16) float kfbot_row[2048];
    const bool kfbot_cached = (cols) <= 2048;
    if (kfbot_cached) {
        for (int kfbot_c = threadIdx.x; kfbot_c < (cols); kfbot_c += blockDim.x)
            kfbot_row[kfbot_c] = row[kfbot_c];
        __syncthreads();
    }
    const float* kfbot_row_p = kfbot_cached ? kfbot_row : row;

Then every pass reads `kfbot_row_p[j]` where it read `row[j]`. A row longer than the
cache is read from global memory as before. It applies where the passes are loops that
split the row among the block's threads (`j = threadIdx.x; j += blockDim.x`), each
directly in one block of statements, reading one float pointer the kernel never writes
through at `j`, two passes at least, with the same bound; nothing before the first
pass may leave some threads of the block early (the barrier needs them all).
"""

from __future__ import annotations

from dataclasses import dataclass

from kfbot.search.rewrites import syntax as sx
from kfbot.search.rewrites.syntax import Target
from kfbot.search.rewrites.vectorrows import float_pointers

CACHE = 2048  # floats: 8 KB of shared memory a block
PREFIX = "kfbot_row"
_BLOCK_STEPS = ("blockDim.x", "(int)blockDim.x", "static_cast<int>(blockDim.x)")


@dataclass(frozen=True)
class _Pass:
    loop: sx.Node
    bound: str
    reads: tuple[sx.Node, ...]  # the subscripts `p[j]`


def cache_row_in_shared(source: str, target: Target) -> str | None:
    root = sx.parse(source)
    kernels = sx.kernels_named(root, target.kernel)
    if len(kernels) != 1 or PREFIX in sx.identifiers(kernels[0]):
        return None
    kernel = kernels[0]
    choice = _choose(kernel)
    if choice is None:
        return None
    pointer, passes = choice
    first = passes[0].loop
    if not _uniform_before(kernel, first):
        return None
    src = source.encode()
    indent = sx.indent_at(src, first) or "    "
    view = f"{PREFIX}_p"
    fill = [f"__shared__ __align__(16) float {PREFIX}[{CACHE}];  // the row, read once",
            f"const bool kfbot_cached = ({passes[0].bound}) <= {CACHE};",
            "if (kfbot_cached) {",
            f"    for (int kfbot_c = threadIdx.x; kfbot_c < ({passes[0].bound}); "
            f"kfbot_c += blockDim.x) {PREFIX}[kfbot_c] = {pointer}[kfbot_c];",
            "    __syncthreads();", "}",
            f"const float* {view} = kfbot_cached ? {PREFIX} : {pointer};", ""]
    edits: list[sx.Edit] = [(first.start_byte, first.start_byte,
                             f"\n{indent}".join(fill).encode())]
    for p in passes:
        for read in p.reads:
            base = sx.field(read, "argument")
            assert base is not None
            edits.append((base.start_byte, base.end_byte, view.encode()))
    return sx.spliced(src, edits)


def _choose(kernel: sx.Node) -> tuple[str, list[_Pass]] | None:
    """The pointer read by the most passes (two at least) and those passes."""
    floats = float_pointers(kernel)
    written = _written_pointers(kernel)
    by_pointer: dict[str, list[_Pass]] = {}
    for node in sx.walk(kernel):
        if node.type != "for_statement":
            continue
        found = _block_pass(kernel, node)
        if found is None:
            continue
        j, bound = found
        body = sx.field(node, "body")
        assert body is not None
        reads: dict[str, list[sx.Node]] = {}
        for sub in sx.walk(body):
            base, index = sx.field(sub, "argument"), sx.field(sub, "indices")
            if sub.type == "subscript_expression" and base is not None \
                    and sx.text(base) in floats and sx.text(base) not in written \
                    and index is not None and sx.norm(index) == f"[{j}]":
                reads.setdefault(sx.text(base), []).append(sub)
        for name, subs in reads.items():
            by_pointer.setdefault(name, []).append(_Pass(node, bound, tuple(subs)))
    ranked = sorted(((len(ps), name) for name, ps in by_pointer.items()
                     if len(ps) >= 2 and _one_block(ps) and len({p.bound for p in ps}) == 1
                     and not _reassigned(kernel, name)), reverse=True)
    if not ranked:
        return None
    name = ranked[0][1]
    return name, sorted(by_pointer[name], key=lambda p: p.loop.start_byte)


def _block_pass(kernel: sx.Node, loop: sx.Node) -> tuple[str, str] | None:
    """(j, bound) of `for (int j = <thread index>; j < bound; j += blockDim.x)`."""
    header = sx.less_than_loop(loop)
    if header is None:
        return None
    j, start, bound, update, body = header
    if not sx.is_thread_index(kernel, sx.strip(start)):
        return None
    if update.type != "assignment_expression" or sx.text(sx.field(update, "left")) != j \
            or "".join(sx.text(sx.field(update, "right")).split()) not in _BLOCK_STEPS:
        return None
    if sx.assigned(body, j) or any(sx.assigned(body, n) for n in sx.identifiers(bound)):
        return None
    return j, "".join(sx.text(bound).split())


def _written_pointers(kernel: sx.Node) -> set[str]:
    out = set()
    for node in sx.walk(kernel):
        if node.type == "subscript_expression":
            parent = node.parent
            if parent is not None and ((parent.type == "assignment_expression"
                                        and sx.field(parent, "left") == node)
                                       or parent.type == "update_expression"):
                out.add(sx.text(sx.field(node, "argument")))
    return out


def _reassigned(kernel: sx.Node, name: str) -> bool:
    return sx.assigned(sx.field(kernel, "body") or kernel, name)


def _one_block(passes: list[_Pass]) -> bool:
    """Every pass stands directly in the same block of statements."""
    parents = {p.loop.parent.id if p.loop.parent is not None else -1 for p in passes}
    return len(parents) == 1 and all(p.loop.parent is not None
                                     and p.loop.parent.type == "compound_statement"
                                     for p in passes)


def _uniform_before(kernel: sx.Node, first: sx.Node) -> bool:
    """No thread of the block can have left, or be kept out by a branch, before the first
    pass: every `if` around it and every `return` before it depends on the block only."""
    body = sx.field(kernel, "body")
    thread_names = {"threadIdx"} | {
        sx.text(sx.field(d, "declarator")) for d in sx.walk(kernel)
        if d.type == "init_declarator" and sx.field(d, "value") is not None
        and "threadIdx" in sx.identifiers(sx.field(d, "value") or d)}
    for node in sx.walk(kernel):
        if node.start_byte >= first.start_byte:
            break
        if node.type == "return_statement" and not _block_only(node, thread_names, body):
            return False
    around = first.parent
    while around is not None and around != body:
        if around.type in ("for_statement", "while_statement", "do_statement",
                           "switch_statement") or (
                around.type == "if_statement"
                and sx.identifiers(sx.field(around, "condition") or around) & thread_names):
            return False
        around = around.parent
    return True


def _block_only(ret: sx.Node, thread_names: set[str], body: sx.Node | None) -> bool:
    node: sx.Node | None = ret.parent
    while node is not None and node != body:
        if node.type == "if_statement" and sx.identifiers(
                sx.field(node, "condition") or node) & thread_names:
            return False
        if node.type in ("for_statement", "while_statement", "do_statement"):
            return False
        node = node.parent
    return True
