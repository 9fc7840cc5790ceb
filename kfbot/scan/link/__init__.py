"""Joining the per-file facts of CUDA and Python across the repository.

    join          launches, builds, bindings and tunables joined into kernels by name
    cpp_graph     the C++ call graph: which host functions reach which launchers
    kernel_paths  from a kernel's launches to the bindings that reach them
    pairing       each reference test with the kernels its op reaches, and why not
    dispatch      ops that run one of several kernels, and what chooses between them
    assemble      `Kernel` records built from the linked facts

It may import `scan.cuda`, `scan.python`, the scan's `model` and the ground floor;
never `scan.scanner` or `scan.show`.
"""
