"""The original as the repository's own code imports it, for its tests and scripts.

The worker loads each build under a name of its own (`<name>_kf<tag>`), with its
library namespaces renamed, so that the original and a candidate share a process. The
repository's tests import the extension by its real name and call its ops by their
real namespaces: they get a build of the original with the real names
(`BuildRequest(real_names=True)`), staged under those names (`capture.imports`), without
anything installed or written into the checkout.

A kernel-builder repository's package, `torch-ext/<name>/`, is on no import path,
and its `_ops.py` is written by the builder: the package is staged from the
repository's folder, kfbot's build beside it under a private name, and an `_ops.py`
that imports that build and names its op namespace.

When kfbot cannot build an extension its own way, or the recipe is the repository's
own (a `setup.py` that builds in a loop or runs CMake), the repository builds itself in
a scratch copy (`build/layouts/own.py`) and the library that holds the kernel is found by its
name or its symbols (`own_original`); the tests then run in that copy.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from kfbot.evaluate.build import BuildRequest, BuildResult
from kfbot.evaluate.build.layouts.kernel_builder import is_kernel_builder
from kfbot.evaluate.build.layouts.own import (
    OwnBuild,
    OwnBuilder,
    OwnRecipe,
    build_evidence,
    own_recipe,
)
from kfbot.evaluate.build.model import clean, internal_name, module_name, real_module_name
from kfbot.evaluate.build.registrations import (
    TORCH_NAMESPACES,
    aliases,
    owned_namespaces,
    rename_registrations,
)
from kfbot.evaluate.build.symbols import Holder, has_device_code, holders
from kfbot.evaluate.capture.imports import StagedModule
from kfbot.evaluate.model import Diagnostic
from kfbot.evaluate.task import EXTENSION_NAMESPACE
from kfbot.scan.model import BuildRecipe, KernelDef

# The build's module inside a kernel-builder package: private, unlike the builder's names.
EXTENSION_MODULE = "_kfbot_ext"
OPS_PY = '''\
"""Written by kfbot in place of the kernel builder's: the ops of kfbot's build."""
import torch

from . import {module}

ops = torch.ops.{namespace}


def add_op_namespace_prefix(op_name: str) -> str:
    return f"{namespace}::{{op_name}}"
'''


def staged_modules(
    root: Path, recipe: BuildRecipe, built: BuildResult
) -> tuple[StagedModule, ...]:
    """What the repository's code imports or loads, mapped to a real-names build."""
    if not built.ok or built.artifact is None:
        return ()
    if is_kernel_builder(recipe):
        return _kernel_builder_package(root, recipe, built)
    return (StagedModule(recipe.name, "extension", str(built.artifact)),)


def _kernel_builder_package(
    root: Path, recipe: BuildRecipe, built: BuildResult
) -> tuple[StagedModule, ...]:
    """`torch-ext/<name>/` as the package, kfbot's build inside it, and its `_ops`."""
    name = recipe.name.replace("-", "_")  # `[general] name`, as the package is named
    folder = root / Path(recipe.file).parent / "torch-ext" / name
    assert built.artifact is not None
    namespace = built.library_namespaces.get(EXTENSION_NAMESPACE, internal_name(recipe.name))
    return (
        StagedModule(name, "package", str(folder)),
        StagedModule(f"{name}.{EXTENSION_MODULE}", "extension", str(built.artifact),
                     init=internal_name(recipe.name)),
        StagedModule(f"{name}._ops", "source", str(folder / "_ops.py"),
                     source=OPS_PY.format(module=EXTENSION_MODULE, namespace=namespace)),
    )


@dataclass(frozen=True)
class OwnOriginal:
    """The original as the repository's own build made it, and the library in it that
    holds the kernel (found by the name the recipe gives it, else by its symbols)."""

    build: OwnBuild
    library: str | None  # path inside the built tree
    holder: Holder | None  # the symbols that placed the kernel there
    why: str  # one line: what happened

    @property
    def ok(self) -> bool:
        return self.build.ok and self.library is not None

    @property
    def artifact(self) -> Path | None:
        return self.build.original / self.library if self.library is not None else None

    @property
    def module(self) -> str:
        """The dotted name the repository imports the library by."""
        return self.build.module_name(self.library) if self.library is not None else ""

    def result(self) -> BuildResult:
        """The artifact as the worker loads an original: under its real name."""
        return BuildResult(ok=self.ok, stage="done" if self.ok else "compile",
                           artifact=self.artifact,
                           module_name=real_module_name(self.module or "_"),
                           library_namespaces={}, diagnostics=(), resources=(),
                           seconds=self.build.seconds, compiled=0, reused=0,
                           key=f"own:{self.build.key}:{self.library}")

    def evidence(self) -> str:
        return self.build.evidence()


def own_original(root: Path, recipe: OwnRecipe, builder: OwnBuilder,
                 kernel: KernelDef | None, name: str = "") -> OwnOriginal:
    """Build the repository its own way and find the library that holds `kernel`:
    the one imported as `name` when the recipe names it, else by its symbols."""
    build = builder.original(root, recipe)
    if not build.ok:
        return OwnOriginal(build, None, None, build.why)
    named = [lib for lib in build.libraries if name and build.module_name(lib) == name]
    if named:
        return OwnOriginal(build, named[0], None, f"{build.why}; {name} is "
                           f"{named[0]}")
    found = holders(kernel, [build.original / lib for lib in build.libraries]) \
        if kernel is not None else []
    if not found:
        shown = ", ".join(build.libraries[:6]) + (" ..." if len(build.libraries) > 6 else "")
        what = kernel.qualified_name if kernel is not None else name
        cuda = any(has_device_code(build.original / lib) for lib in build.libraries)
        none = "" if cuda else "; none holds CUDA device code: the build compiled no .cu " \
            "file here (its setup.py may compile CUDA only where torch sees a GPU, or " \
            "read a switch other than FORCE_CUDA=1)"
        return OwnOriginal(build, None, None, f"{build.why}, but none of them holds "
                           f"{what} ({shown}){none}")
    library = found[0].library.relative_to(build.original).as_posix()
    others = f"; also in {', '.join(h.library.name for h in found[1:3])}" \
        if len(found) > 1 else ""
    return OwnOriginal(build, library, found[0], f"{build.why}; the kernel is in "
                       f"{build.module_name(library)} ({found[0].evidence()}){others}")


def fallback_recipe(recipe: BuildRecipe) -> OwnRecipe | None:
    """The repository's own build of a recipe kfbot could not build itself: its
    setup.py (or pyproject.toml) in the folder it is in."""
    if recipe.kind == "repository" or (recipe.kind == "setup_py" and
                                       Path(recipe.file).name == "setup.py"):
        return own_recipe(recipe.file)
    return None


# --- candidates, built the repository's way ----------------------------------------------

_SOURCES = (".cu", ".cuh", ".cpp", ".cc", ".cxx", ".c", ".h", ".hpp", ".hh", ".inl")
_REGISTRY = re.compile(r"RegisterOperators\s*\(\s*\)[^;]*?\.op\s*\(\s*\"(\w+)::")
_REGISTERED = re.compile(r"\.op\s*\(\s*\"(\w+)::(\w+)")


@dataclass(frozen=True)
class Registrations:
    """The built tree's files that register torch ops, and the namespaces they own: a
    candidate's library registers them under names of its own (`<ns>_kf<tag>`), so that
    the original and the candidate can be loaded into one process."""

    texts: Mapping[str, str]  # repository path -> text
    owned: frozenset[str]
    alias: Mapping[str, str]

    def renamed(self, files: Mapping[str, str], tag: str
                ) -> tuple[dict[str, str], dict[str, str]]:
        """The candidate's files with every registration renamed, and the renames."""
        names = {ns: f"{ns}_kf{clean(tag)}" for ns in sorted(self.owned)}
        out = dict(files)
        if not names:
            return out, names
        for rel, text in {**self.texts, **files}.items():
            if rel.endswith(_SOURCES):
                new = rename_registrations(text, names, self.alias, modules=False)
                if new != text:
                    out[rel] = new
        return out, names


def registrations(build: OwnBuild, library: Path) -> Registrations:
    """The registrations of the tree the repository's own build compiled that the
    candidate's `library` needs renamed: every `TORCH_LIBRARY*` block (which library
    holds one cannot be told from outside), and the `RegisterOperators` files whose op
    names `library` holds (an op per library, as some libraries build: the other
    libraries' files are left as they are, so they are not compiled again)."""
    texts: dict[str, str] = {}
    folder = build.original / build.recipe.folder
    data = library.read_bytes() if library.is_file() else b""
    for path in sorted(folder.rglob("*")):
        rel = path.relative_to(build.original).as_posix()
        if not rel.endswith(_SOURCES) or not path.is_file() or "/build/" in f"/{rel}":
            continue
        text = path.read_text(encoding="utf-8", errors="replace")
        if "TORCH_LIBRARY" in text or ("RegisterOperators" in text and any(
                f"{ns}::{op}".encode() in data for ns, op in _REGISTERED.findall(text))):
            texts[rel] = text
    alias = aliases(texts.values(), {})
    owned = owned_namespaces(texts.values(), alias) | {
        ns for text in texts.values() for ns in _REGISTRY.findall(text)}
    return Registrations(texts, frozenset(owned - TORCH_NAMESPACES), alias)


def own_candidate(original: OwnOriginal, builder: OwnBuilder, regs: Registrations,
                  request: BuildRequest) -> BuildResult:
    """A candidate's library, built by the repository's own build with the candidate's
    files: what the worker loads beside the original."""
    module = real_module_name(original.module or "_")
    tagged = module_name(original.module or "_", request.tag)
    refused = _unsupported(request)
    if refused or original.library is None:
        why = refused or original.why
        return _failed(tagged, module, why)
    files, names = regs.renamed(request.files, request.tag)
    made = builder.candidate(original.build, original.library, files, request.tag)
    if not made.ok:
        return _failed(tagged, module, made.why, made.tail, made.seconds)
    return BuildResult(ok=True, stage="done", artifact=made.artifact, module_name=tagged,
                       library_namespaces=names, diagnostics=(), resources=(),
                       seconds=made.seconds, compiled=0, reused=0,
                       key=f"own:{original.build.key}:{request.tag}", init=module)


def _unsupported(request: BuildRequest) -> str:
    """What the repository's own build cannot apply: flags are the build's own."""
    if request.params:
        shown = ", ".join(f"{k}={v}" for k, v in sorted(request.params.items()))
        return (f"parameters ({shown}) are passed as -D flags, which the repository's own "
                "build does not take from kfbot; change the source instead")
    if request.extra_cuda_cflags:
        return (f"flags ({' '.join(request.extra_cuda_cflags)}) are not passed to the "
                "repository's own build")
    return ""


def _failed(tagged: str, module: str, why: str, tail: str = "",
            seconds: float = 0.0) -> BuildResult:
    details = (("output_tail", build_evidence(tail)),) if tail else ()
    diagnostic = Diagnostic("build", "own_build", why, "error", details=details)
    return BuildResult(ok=False, stage="compile", artifact=None, module_name=tagged,
                       library_namespaces={}, seconds=seconds, compiled=0, reused=0,
                       diagnostics=(diagnostic,), resources=(), key="", init=module)
