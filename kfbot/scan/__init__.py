"""The scan: the repository read without running it, by tree-sitter and `ast`.

    cuda/       reading CUDA and C++: kernels, launches, bindings, tunables, calls
    python/     reading Python: scopes, values, flow, builds, ops, reference tests
    link/       joining the two across files into kernels, pairs and dispatch
    show/       the report for people and machines: tables, summary, --explain, JSON
    scanner     the composition: which files, their facts (cached), linked, shown
    model       the records every later stage reads
    treesitter  the one module that talks to tree-sitter
    forked      work in a forked child, and whether this process may fork
    files, facts_cache, build_toml, tasks, select, observed, changes   the edges

It may import only the ground floor (errors, config, git, text); every later stage
reads its records (`kfbot.scan.model`). Its sub-packages import one way, in the order
listed (cuda/ and python/ know nothing of each other; `tests/test_house.py`).
"""
