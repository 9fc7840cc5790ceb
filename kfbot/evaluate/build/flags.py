"""Compile and link commands: torch's flags, the recipe's own, and the tunables as -D.

A command is planned with `OUTPUT` standing for the object path, and keyed by
everything that can change the object (see `object_key`).
"""

from __future__ import annotations

import os
import re
import shutil
from collections.abc import Iterable, Mapping, Sequence

from kfbot.evaluate.build import cpp_extension
from kfbot.evaluate.build.model import ObjectPlan, digest
from kfbot.evaluate.candidate import NVCC_FLAGS_PARAM, nvcc_flags
from kfbot.paths import file_argument
from kfbot.scan.model import BuildRecipe

CUDA_SUFFIXES = (".cu", ".cuh")  # torch's _is_cuda_file
PTXAS_VERBOSE = ("-Xptxas", "-v")  # resource usage of every kernel, in the compile log
OUTPUT = "$out"  # stands for the object path in a planned command
# include_dirs travel through torch's flag writer as absolute paths under this mark,
# and come back as paths relative to the stage folder.
STAGE_MARK = "/__kfbot_stage__"


def resolved(command: Sequence[str]) -> tuple[str, ...]:
    """The programs before the first flag (ccache, the compiler) as the files they run,
    so that another toolkit or compiler is another key."""
    words: list[str] = []
    for word in command:
        if word.startswith("-"):
            break
        found = shutil.which(word)
        words.append(os.path.realpath(found) if found else word)
    return tuple(words)


def object_key(
    command: Sequence[str], source: str, text: str, headers: Iterable[tuple[str, str]]
) -> str:
    """Cache key of one object: what is run, on what, with which local headers."""
    return digest(
        "object",
        resolved(command),
        list(command),
        cpp_extension.torch_version(),
        source,
        text,
        sorted(headers),
    )


# --- flags ----------------------------------------------------------------------------


def _defined_names(flags: Sequence[str]) -> set[str]:
    names: set[str] = set()
    for index, flag in enumerate(flags):
        if flag == "-D" and index + 1 < len(flags):
            names.add(flags[index + 1].partition("=")[0])
        elif flag.startswith("-D") and len(flag) > 2:
            names.add(flag[2:].partition("=")[0])
    return names


def _without_defines(flags: Sequence[str], names: Iterable[str]) -> list[str]:
    """`flags` less every -DNAME / -DNAME=V / `-D NAME=V` of the given names."""
    drop = set(names)
    kept: list[str] = []
    skip = False
    for index, flag in enumerate(flags):
        if skip:
            skip = False
            continue
        if flag == "-D" and index + 1 < len(flags) and flags[index + 1].partition("=")[0] in drop:
            skip = True
        elif not (flag.startswith("-D") and flag[2:].partition("=")[0] in drop):
            kept.append(flag)
    return kept


def _define(name: str, value: str) -> str:
    return f"-D{name}={value}" if value != "" else f"-D{name}"


def recipe_flags(
    recipe: BuildRecipe, extra_cuda: Sequence[str]
) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """(cflags, cuda cflags) as the repository passes them.

    setup.py's define_macros reach every compile but are not among the flag lists.
    """
    written = _defined_names([*recipe.extra_cflags, *recipe.extra_cuda_cflags])
    macros = tuple(_define(n, v) for n, v in recipe.defines if n not in written)
    return ((*recipe.extra_cflags, *macros), (*recipe.extra_cuda_cflags, *extra_cuda, *macros))


def marked(folder: str) -> str:
    if os.path.isabs(folder):
        return folder
    return STAGE_MARK if folder == "." else f"{STAGE_MARK}/{folder}"


def unmark(flags: Sequence[str]) -> tuple[str, ...]:
    return tuple(flag.replace(f"{STAGE_MARK}/", "").replace(STAGE_MARK, ".") for flag in flags)


def is_cuda(path: str) -> bool:
    return path.endswith(CUDA_SUFFIXES)


def _mentions(text: str, name: str) -> bool:
    return re.search(rf"(?<![A-Za-z0-9_]){re.escape(name)}(?![A-Za-z0-9_])", text) is not None


def _params_for(flags: Sequence[str], text: str, params: Mapping[str, str]) -> dict[str, str]:
    """The tunables that can matter to one translation unit.

    A -D for a name that neither its local sources nor its own flags mention
    cannot change the object; leaving it out keeps the torch-heavy bindings
    object cached while a tunable of the kernel file is swept.
    """
    defined = _defined_names(flags)
    return {n: v for n, v in params.items() if n in defined or _mentions(text, n)}


def compile_command(
    flags: cpp_extension.TorchFlags, source: str, cuda: bool, params: Mapping[str, str], text: str
) -> tuple[str, ...]:
    """One compile, as torch's ninja rules spell it (less the dependency files)."""
    if cuda:
        head, pre, post = flags.nvcc, flags.cuda_cflags, (*flags.cuda_post_cflags, *PTXAS_VERBOSE)
    else:
        head, pre, post = flags.cxx, flags.cflags, flags.post_cflags
    used = _params_for([*pre, *post], text, params)
    used.pop(NVCC_FLAGS_PARAM, None)
    defines = [_define(name, value) for name, value in sorted(used.items())]
    extra = nvcc_flags(params) if cuda else ()
    return (
        *head,
        *_without_defines(pre, used),
        "-c",
        file_argument(source),
        "-o",
        OUTPUT,
        *_without_defines(post, used),
        *defines,
        *extra,
    )


def shim_text(module: str, internal: str) -> str:
    return (
        "// Import hook of this build: forwards to the bindings' own entry point.\n"
        f'extern "C" void* PyInit_{internal}();\n'
        f'extern "C" __attribute__((visibility("default"))) void* PyInit_{module}() '
        f"{{ return PyInit_{internal}(); }}\n"
    )


def shim_plan(cxx: Sequence[str], module: str, internal: str) -> ObjectPlan:
    line = (*cxx, "-fPIC", "-x", "c++", "-c", "-", "-o", OUTPUT)
    text = shim_text(module, internal)
    return ObjectPlan("<shim>", line, object_key(line, "<shim>", text, ()), False)


def link_flags(flags: cpp_extension.TorchFlags) -> tuple[str, ...]:
    shared = () if "-shared" in flags.ldflags else ("-shared",)
    return (*flags.ldflags, *shared)


