"""Which kernel class of the expert library a kernel belongs to, read off its syntax tree.

A class is recognised with confidence when one of its structural rewrites applies to
the kernel (its exact shape is there): then the rules mutator proposes the rewrite.
It is likely when looser signs are there (a loop that accumulates a row, a product
summed over k, a one-element-per-thread body, a 2-D copy whose two sides step along
different indices): then the LLM mutator is shown the class's worked examples, which
need no exact shape to help.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache

from kfbot.search.rewrites import syntax as sx
from kfbot.search.rewrites.catalogue import Expert, Library
from kfbot.search.rewrites.elementwise import elementwise_shape
from kfbot.search.rewrites.grid2d import grid2d
from kfbot.search.rewrites.registry import SOURCE_REWRITES
from kfbot.search.rewrites.rowshape import column_loop
from kfbot.search.rewrites.syntax import Target


@dataclass(frozen=True)
class Recognised:
    kernel_class: str
    confident: bool  # one of the class's rewrites applies as it is
    evidence: str  # the rewrites that apply, or the sign seen


def recognise(source: str, target: Target, library: Library) -> list[Recognised]:
    """The classes `target`'s kernel (defined in `source`) belongs to, confident first."""
    out: list[Recognised] = []
    fns = sx.kernels_named(sx.parse(source), target.kernel)
    if len(fns) != 1:
        return out
    for cls in library.classes:
        applying = [e.id for e in library.of(cls.id)
                    if SOURCE_REWRITES[e.rewrite](source, target) is not None]
        if applying:
            out.append(Recognised(cls.id, True, f"{', '.join(applying)} apply"))
            continue
        sign = _SIGNS[cls.id](fns[0]) if cls.id in _SIGNS else None
        if sign is not None:
            out.append(Recognised(cls.id, False, sign))
    return sorted(out, key=lambda r: not r.confident)


def _row_sign(fn: sx.Node) -> str | None:
    for node in sx.walk(fn):
        if node.type == "for_statement":
            loop = column_loop(node)
            if loop is not None and loop.accumulators:
                return f"a loop accumulates {loop.accumulators[0].name} over a row"
    return None


def _elementwise_sign(fn: sx.Node) -> str | None:
    loops = [column_loop(n) for n in sx.walk(fn) if n.type == "for_statement"]
    if loops and all(loop is not None and not loop.accumulators for loop in loops):
        return "a thread maps a row's elements one by one in a loop"
    return "one element per thread under `if (i < n)`" if elementwise_shape(fn) else None


def _matmul_sign(fn: sx.Node) -> str | None:
    for node in sx.walk(fn):
        if node.type == "assignment_expression" and sx.text(sx.field(node, "operator")) == "+=":
            right = sx.field(node, "right")
            if right is not None and right.type == "binary_expression" \
                    and sx.text(sx.field(right, "operator")) == "*" \
                    and all(sx.strip(s).type == "subscript_expression"
                            for s in (sx.field(right, "left"), sx.field(right, "right"))) \
                    and _in_loop(node):
                return f"a product of two arrays summed in a loop: {sx.text(node)}"
    return None


def _transpose_sign(fn: sx.Node) -> str | None:
    shape = grid2d(fn)
    if shape is None or len(shape.body) != 1:
        return None
    reads = [n for n in sx.walk(shape.body[0]) if n.type == "subscript_expression"]
    return "a 2-D copy from one array to another" if len(reads) == 2 else None


def _in_loop(node: sx.Node) -> bool:
    current = node.parent
    while current is not None and current.type != "function_definition":
        if current.type in ("for_statement", "while_statement", "do_statement"):
            return True
        current = current.parent
    return False


_SIGNS = {"row-reduction": _row_sign, "elementwise": _elementwise_sign,
          "matmul": _matmul_sign, "transpose": _transpose_sign}


def worked_examples(library: Library, classes: list[str]) -> tuple[str, ...]:
    """The worked examples of the classes' rewrites, as Markdown for the LLM mutator:
    what each rewrite does and why, the example kernel before and after (the rewrite's
    own output)."""
    return tuple(_example(e) for c in dict.fromkeys(classes) for e in library.of(c))


@cache
def _example(expert: Expert) -> str:
    after = SOURCE_REWRITES[expert.rewrite](expert.example, Target(expert.example_kernel))
    lines = [f"### {expert.id} ({expert.kernel_class}): {expert.what}", f"Why: {expert.why}",
             "Before:", f"```cuda\n{expert.example.rstrip()}\n```"]
    # The shipped examples are checked to apply (tests/search/test_experts.py).
    if after is not None:
        lines += ["After:", f"```cuda\n{after.rstrip()}\n```"]
    return "\n".join(lines)
