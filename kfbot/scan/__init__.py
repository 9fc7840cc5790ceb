"""The scan: the repository read without running it, by tree-sitter. CUDA and C++ sources
(`cuda_*`), Python sources (`py_*`, `python_facts`), the two joined into kernels, their
builds, bindings, references and tests (`link`, `pairing`, `dispatch`, `assemble`),
and the report (`scanner`, `render`, `summary`).

It may import only the ground floor (errors, config, git, text); every later stage
reads its records (`kfbot.scan.model`).
"""
