"""The fast path: a candidate's kernel compiled alone and linked to the host part of its
unit, compiled once for the original.

    path    deciding and building the fast way, or why the full build is needed
    split   a kernel's translation unit cut into the kernel's unit and the host part
    units   the namespace-level items of a C++/CUDA source, read with tree-sitter

It asks the builder for compiles and links through a Protocol (`path.Compiler`), so
it imports nothing of `build.builder`.
"""
