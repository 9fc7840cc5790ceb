"""The repository layouts the builder treats apart, one module each.

The plain layouts, a `load()` of source files and a `setup.py` with `CUDAExtension`,
are the builder's own path: staged (`build.stage`) and compiled object by object
(`build.builder`). A layout that needs more has a module here:

    load_inline     sources held as strings in a Python file
    kernel_builder  Hugging Face kernel-builder (`build.toml`, `torch-ext/`), built
                    without the builder
    own             what kfbot cannot build object by object (a `setup.py` that runs
                    CMake, a `pyproject.toml` backend): the repository builds itself

A new layout gets a module here, and the branch that chooses it in `build.stage` or
`build.repository`. It may import the rest of `kfbot.evaluate.build`, the sandbox and
the scan's records.
"""
