"""Source rewrites: rules/rewrites.yaml and the expert library rules/experts/ name them,
this package implements them.

Each rewrite finds nodes with tree-sitter (CUDA grammar) and splices text by byte
ranges, so a comment or a string that mentions a trigger never triggers anything. A
rewrite that does not apply returns None and proposes nothing; every rewrite is
idempotent (its own output no longer has the shape it rewrites). A rewrite changes
only its target: one kernel, the device functions only it calls, and its launches.

    syntax       tree-sitter helpers shared by every rewrite; the `Target`
    files        which text a rewrite sees (a C++/CUDA file, a load_inline string)
    launch       changing a kernel's launches together with it
    qualifiers   restrict-pointers, launch-bounds, unroll-constant-loops
    elementwise  grid-stride-loop, vectorize-float4
    reduction    warp-shuffle-reduction
    fastmath     fast-math-intrinsics, fast-math-flags
    rowshape     recognising a thread-per-row kernel
    rows         warp-per-row, block-per-row
    grid2d       recognising a 2-D thread-per-element kernel
    matmul       matmul-register-tiling(-large)
    transpose    tiled-transpose
    registry     implementations by name
    catalogue    loading the rules files
    classify     which kernel class a kernel belongs to; worked examples for the LLM
    propose      the rules mutator's candidates

It may import the scan's tree-sitter helpers, the candidate and scope records of
`kfbot.evaluate` and the ground floor; nothing of the search's driver.
"""

from kfbot.search.rewrites.catalogue import (
    Expert,
    KernelClass,
    Library,
    Rewrite,
    load_library,
    load_rewrites,
)
from kfbot.search.rewrites.classify import Recognised, recognise, worked_examples
from kfbot.search.rewrites.files import cuda_text
from kfbot.search.rewrites.propose import locate, propose_rewrites
from kfbot.search.rewrites.syntax import Target

__all__ = ["Expert", "KernelClass", "Library", "Recognised", "Rewrite", "Target", "cuda_text",
           "load_library", "load_rewrites", "locate", "propose_rewrites", "recognise",
           "worked_examples"]
