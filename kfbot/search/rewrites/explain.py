"""Why each rewrite does or does not apply to a kernel: the plan's `rules` lines.

A rewrite that applies says whether it needed the kernel's helpers inlined; one that
does not names the first thing in the kernel that its pattern does not allow (for the
row rewrites, from the row shape's own checks) or, for the others, what it looks for.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from kfbot.search.rewrites import syntax as sx
from kfbot.search.rewrites.catalogue import Rewrite
from kfbot.search.rewrites.files import cuda_text
from kfbot.search.rewrites.inline import inline_helpers
from kfbot.search.rewrites.propose import locate
from kfbot.search.rewrites.registry import AS_WRITTEN, OWN_TEXT, PARAM_REWRITES
from kfbot.search.rewrites.rowshape import row_kernel, why_not_row_kernel

_ROWS = frozenset({"warp_per_row", "block_per_row", "row_map_per_block",
                   "row_split_by_length"})
_LAUNCHING = _ROWS | {"register_tiling", "register_tiling_large", "tiled_transpose",
                      "launch_bounds", "warp_shuffle_reduction", "occupancy_2",
                      "occupancy_4"}


def explain(files: Mapping[str, str], editable: Sequence[str], kernel: str,
            rewrites: Sequence[Rewrite], params: Mapping[str, str] | None = None,
            rtol: float | None = None) -> list[str]:
    """One line per rewrite: `id: applies ...` or `id: does not apply: why`."""
    paths = [p for p in editable if p in files]
    home, target = locate(files, paths, kernel, rtol)
    code = cuda_text(home, files[home]) if home is not None else None
    inlined = inline_helpers(code, target.kernel) if code is not None else None
    out = []
    for r in rewrites:
        if r.rewrite in PARAM_REWRITES:
            made = PARAM_REWRITES[r.rewrite]({p: files[p] for p in paths}, params or {})
            out.append(f"{r.id}: " + ("applies" if made is not None else
                                      "does not apply: the build already asks for it"))
            continue
        if code is None:
            out.append(f"{r.id}: does not apply: {kernel} is not defined in exactly one "
                       "editable file")
            continue
        fn = AS_WRITTEN[r.rewrite]
        if inlined is not None and r.rewrite not in OWN_TEXT \
                and fn(inlined.source, target) is not None:
            out.append(f"{r.id}: applies with the helpers inlined "
                       f"({', '.join(inlined.helpers)})")
        elif fn(code, target) is not None:
            out.append(f"{r.id}: applies")
        else:
            out.append(f"{r.id}: does not apply: {_why(r, code, inlined, target)}")
    return out


def _why(r: Rewrite, code: str, inlined: object, target: sx.Target) -> str:
    if target.launched_elsewhere and r.rewrite in _LAUNCHING:
        return "the kernel is launched from another file, whose launch it cannot change"
    source = getattr(inlined, "source", None) or code
    kernels = sx.kernels_named(sx.parse(source), target.kernel)
    if len(kernels) != 1:
        return f"{len(kernels)} kernels are named {target.kernel} in the file"
    if r.rewrite in _ROWS:
        shape = row_kernel(kernels[0])
        if shape is None:
            return why_not_row_kernel(kernels[0])
        if r.rewrite == "row_map_per_block":
            return "its row loops accumulate: a reduction, which the row-reduction rewrites take"
        if r.rewrite == "row_split_by_length":
            return ("its column loops do not all run to one parameter of the kernel, or a "
                    "launch of it is not a `kernel<<<grid, block>>>(...);` statement")
        return "a launch of it is not a plain <<<grid, block>>> statement it can change"
    return f"it looks for: {r.applies_when}"
