"""The implementations that the `rewrite:` key of rules/rewrites.yaml and rules/experts/
names, by name.

A source rewrite takes one file's C++/CUDA text and the target, and returns the new
text or None when it does not apply; applying it to its own output changes nothing.
A param rewrite changes the candidate's params instead of its files.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

from kfbot.search.rewrites.elementwise import grid_stride_loop, vectorize_float4
from kfbot.search.rewrites.fastmath import fast_math_flags, fast_math_intrinsics
from kfbot.search.rewrites.inline import inline_helpers
from kfbot.search.rewrites.matmul import register_tiling, register_tiling_large
from kfbot.search.rewrites.online import online_softmax
from kfbot.search.rewrites.qualifiers import (
    launch_bounds,
    occupancy,
    restrict_pointers,
    unroll_constant_loops,
)
from kfbot.search.rewrites.reduction import warp_shuffle_reduction
from kfbot.search.rewrites.rowcache import cache_row_in_shared
from kfbot.search.rewrites.rowchoice import row_split_by_length
from kfbot.search.rewrites.rows import block_per_row, row_map_per_block, warp_per_row
from kfbot.search.rewrites.syntax import Target
from kfbot.search.rewrites.transpose import tiled_transpose
from kfbot.search.rewrites.vectorrows import GUARD, vectorize_row_loads

SourceRewrite = Callable[[str, Target], "str | None"]
ParamRewrite = Callable[[Mapping[str, str], Mapping[str, str]], "dict[str, str] | None"]


def through_helpers(fn: SourceRewrite) -> SourceRewrite:
    """`fn` on the kernel with its helper device functions inlined (see `inline.py`),
    else on the kernel as written. Inlined first: a row kernel whose statistics come
    from helpers also has the shape as written, with each split thread running the
    helper's whole loop alone."""
    def rewrite(source: str, target: Target) -> str | None:
        inlined = inline_helpers(source, target.kernel)
        found = fn(inlined.source, target) if inlined is not None else None
        return found if found is not None else fn(source, target)

    rewrite.__name__ = getattr(fn, "__name__", "rewrite")
    rewrite.__doc__ = fn.__doc__
    return rewrite


def widest_through_helpers(fn: SourceRewrite, mark: str) -> SourceRewrite:
    """`fn` as written or with the helpers inlined, whichever changes more places (counted
    by `mark` in its output): a warp's own reduction helpers need no inlining to have
    their loads vectorised, a row read inside helpers does."""
    def rewrite(source: str, target: Target) -> str | None:
        plain = fn(source, target)
        inlined = inline_helpers(source, target.kernel)
        deep = fn(inlined.source, target) if inlined is not None else None
        if deep is not None and (plain is None or deep.count(mark) > plain.count(mark)):
            return deep
        return plain

    rewrite.__name__ = getattr(fn, "__name__", "rewrite")
    rewrite.__doc__ = fn.__doc__
    return rewrite


AS_WRITTEN: dict[str, SourceRewrite] = {
    "restrict_pointers": restrict_pointers,
    "launch_bounds": launch_bounds,
    "occupancy_2": occupancy(2),
    "occupancy_4": occupancy(4),
    "unroll_constant_loops": unroll_constant_loops,
    "grid_stride_loop": grid_stride_loop,
    "vectorize_float4": vectorize_float4,
    "warp_shuffle_reduction": warp_shuffle_reduction,
    "fast_math_intrinsics": fast_math_intrinsics,
    "warp_per_row": warp_per_row,
    "block_per_row": block_per_row,
    "row_map_per_block": row_map_per_block,
    "register_tiling": register_tiling,
    "register_tiling_large": register_tiling_large,
    "tiled_transpose": tiled_transpose,
    "online_softmax": online_softmax,
    "row_split_by_length": row_split_by_length,
    "cache_row_in_shared": cache_row_in_shared,
    "vectorize_row_loads": vectorize_row_loads,
}
# Every rewrite sees the kernel through its helpers; the qualifier ones change only the
# kernel's own text, which inlining would rewrite for nothing.
OWN_TEXT = frozenset({"restrict_pointers", "launch_bounds", "unroll_constant_loops",
                      "occupancy_2", "occupancy_4", "fast_math_intrinsics"})
SOURCE_REWRITES: dict[str, SourceRewrite] = {
    name: fn if name in OWN_TEXT else through_helpers(fn) for name, fn in AS_WRITTEN.items()}
SOURCE_REWRITES["vectorize_row_loads"] = widest_through_helpers(vectorize_row_loads,
                                                                f"{GUARD}(")
PARAM_REWRITES: dict[str, ParamRewrite] = {
    "fast_math_flags": fast_math_flags,
}
IMPLEMENTATIONS = frozenset(SOURCE_REWRITES) | frozenset(PARAM_REWRITES)
