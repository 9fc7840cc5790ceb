"""The Hugging Face kernel-builder layout, built without the builder.

A kernel-builder repository holds a `build.toml`, its CUDA sources, and
`torch-ext/torch_binding.cpp`, which includes `registration.h` and registers its ops
with `TORCH_LIBRARY_EXPAND(TORCH_EXTENSION_NAME, ops)`. The builder writes
`registration.h`; the repository does not hold it. kfbot writes it next to each
binding source that includes it: the `_EXPAND` macros, which expand their namespace
argument first, and `REGISTER_EXTENSION`, a Python entry point for a library that only
registers ops. (The builder's generated `_ops.py` is written where the package is
staged: `kfbot.evaluate.build.repository`.)
"""

from __future__ import annotations

import posixpath
from collections.abc import Callable

from kfbot.scan.model import BuildRecipe

RECIPE_FILE = "build.toml"
REGISTRATION = "registration.h"

REGISTRATION_H = """\
// Written by kfbot in place of the one the kernel builder provides.
#pragma once

#include <Python.h>
#include <torch/library.h>

#define _KFBOT_CONCAT(A, B) A##B
#define CONCAT(A, B) _KFBOT_CONCAT(A, B)
#define _KFBOT_STRINGIFY(A) #A
#define STRINGIFY(A) _KFBOT_STRINGIFY(A)

// The namespace argument is expanded first, so it may itself be a macro.
#define TORCH_LIBRARY_EXPAND(NAME, MODULE) TORCH_LIBRARY(NAME, MODULE)
#define TORCH_LIBRARY_IMPL_EXPAND(NAME, DEVICE, MODULE) TORCH_LIBRARY_IMPL(NAME, DEVICE, MODULE)

// An empty Python module: importing the library runs its registrations.
#define REGISTER_EXTENSION(NAME)                                                   \\
  PyMODINIT_FUNC CONCAT(PyInit_, NAME)() {                                         \\
    static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, STRINGIFY(NAME),    \\
                                        nullptr, 0, nullptr};                      \\
    return PyModule_Create(&module);                                               \\
  }
"""

def is_kernel_builder(recipe: BuildRecipe) -> bool:
    return posixpath.basename(recipe.file) == RECIPE_FILE


def generated_headers(recipe: BuildRecipe, exists: Callable[[str], bool]) -> dict[str, str]:
    """`registration.h` beside each binding source, where the repository has none.

    `exists` says whether a repository path is a file (the candidate's view)."""
    if not is_kernel_builder(recipe):
        return {}
    folders = {posixpath.dirname(s) for s in recipe.sources if s.endswith((".cpp", ".cc"))}
    paths = (posixpath.join(folder, REGISTRATION) for folder in sorted(folders))
    return {path: REGISTRATION_H for path in paths if not exists(path)}
