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
from kfbot.search.rewrites.matmul import register_tiling, register_tiling_large
from kfbot.search.rewrites.qualifiers import launch_bounds, restrict_pointers, unroll_constant_loops
from kfbot.search.rewrites.reduction import warp_shuffle_reduction
from kfbot.search.rewrites.rows import block_per_row, row_map_per_block, warp_per_row
from kfbot.search.rewrites.syntax import Target
from kfbot.search.rewrites.transpose import tiled_transpose

SourceRewrite = Callable[[str, Target], "str | None"]
ParamRewrite = Callable[[Mapping[str, str], Mapping[str, str]], "dict[str, str] | None"]

SOURCE_REWRITES: dict[str, SourceRewrite] = {
    "restrict_pointers": restrict_pointers,
    "launch_bounds": launch_bounds,
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
}
PARAM_REWRITES: dict[str, ParamRewrite] = {
    "fast_math_flags": fast_math_flags,
}
IMPLEMENTATIONS = frozenset(SOURCE_REWRITES) | frozenset(PARAM_REWRITES)
