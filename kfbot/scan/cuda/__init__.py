"""Reading CUDA and C++ source, one file at a time, with tree-sitter queries.

    facts       a file's facts: kernels, launches, bindings, tunables (wires the rest)
    context     the `FileContext` Protocol the readers below see the file through
    bindings    PYBIND11_MODULE / TORCH_LIBRARY registrations
    calls       host functions and the calls between them
    macros      launches written inside macros
    conditions  the branches a launch is under
    attrs       attributes the grammar does not know (`__launch_bounds__`...)
    syntax      small helpers on CUDA syntax nodes

It may import the scan's `model` and `treesitter` and the ground floor; nothing of
`scan.python` or `scan.link`.
"""
