"""Reading Python source, one file at a time, with `ast` (torch is never imported).

    facts       a file's facts: builds, inline sources, ops, reference tests (wires the rest)
    scopes      the file indexed: functions, classes, imports, assignments
    values      expressions and paths evaluated statically
    flow        the lists a setup script builds step by step
    builds      extension builds: setup.py, load, load_inline, CUDAExtension
    inline      the CUDA sources a `load_inline` call holds in strings
    ops         calls into compiled extensions and `torch.ops`
    references  reference tests: a bound op compared with a PyTorch computation
    compare     the comparisons a test makes, and their tolerances
    inputs      the inputs a test builds
    benchmarks  benchmark scripts and the shapes they time
    modules     what a file offers to the files that import it
    graph       paths through the repository's modules to the ops they reach
    syntax      small helpers on `ast` nodes
    flag_edit   the nvcc flag list of a build call, as text kfbot can change

It may import the scan's `model` and the ground floor; nothing of `scan.cuda` or
`scan.link`.
"""
