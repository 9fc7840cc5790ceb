"""The original as the repository's own code imports it, for its tests and scripts.

The worker loads each build under a name of its own (`<name>_kf<tag>`), with its
library namespaces renamed, so that the original and a candidate share a process. The
repository's tests import the extension by its real name and call its ops by their
real namespaces: they get a build of the original with the real names
(`BuildRequest(real_names=True)`), staged under those names (`staged`), without
anything installed or written into the checkout.

A kernel-builder repository's package, `torch-ext/<name>/`, is on no import path,
and its `_ops.py` is written by the builder: the package is staged from the
repository's folder, kfbot's build beside it under a private name, and an `_ops.py`
that imports that build and names its op namespace.

When kfbot cannot build a `setup.py` extension its own way, the repository's own
build runs instead, `python setup.py build_ext --inplace`, in a scratch copy of the
repository; its `.so` is staged the same way.
"""

from __future__ import annotations

import sys
import sysconfig
from dataclasses import dataclass
from pathlib import Path

from kfbot.evaluate.build import BuildResult
from kfbot.evaluate.build.kernel_builder import is_kernel_builder
from kfbot.evaluate.build.model import internal_name, real_module_name
from kfbot.evaluate.processes import Ran, last_lines, run_process
from kfbot.evaluate.sandbox import untrusted_env
from kfbot.evaluate.staged import StagedModule
from kfbot.evaluate.task import EXTENSION_NAMESPACE
from kfbot.paths import copy_repository
from kfbot.scan.model import BuildRecipe

FALLBACK_TIMEOUT_S = 1800.0
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
class Fallback:
    """The repository's own `setup.py build_ext --inplace`, run in a scratch copy."""

    ran: Ran | None  # None: the copy could not be made or there is no setup.py
    artifact: Path | None  # the extension's .so in the copy
    why: str  # one line: what happened

    @property
    def ok(self) -> bool:
        return self.artifact is not None

    def result(self, recipe: BuildRecipe) -> BuildResult:
        """The artifact as the worker loads an original: under its real name."""
        return BuildResult(ok=self.ok, stage="done" if self.ok else "compile",
                           artifact=self.artifact, module_name=real_module_name(recipe.name),
                           library_namespaces={}, diagnostics=(), resources=(), seconds=0.0,
                           compiled=0, reused=0, key=f"setup.py:{self.artifact}")

    def evidence(self) -> str:
        return last_lines(self.ran.tail) if self.ran is not None else ""


def setup_py_fallback(root: Path, recipe: BuildRecipe, scratch: Path,
                      python: str = sys.executable,
                      timeout_s: float = FALLBACK_TIMEOUT_S) -> Fallback:
    """Build `recipe` (a setup.py extension) with the repository's own setup.py."""
    setup = Path(recipe.file)
    if recipe.kind != "setup_py" or setup.name != "setup.py":
        return Fallback(None, None, "no setup.py to fall back on")
    copy = scratch / "repo"
    copy_repository(root, copy)
    folder = copy / setup.parent
    if not (folder / "setup.py").is_file():
        return Fallback(None, None, f"{setup} is not in the copy of the repository")
    env = untrusted_env({"PYTHONDONTWRITEBYTECODE": "1"})
    ran = run_process([python, "setup.py", "build_ext", "--inplace"], folder, env,
                      timeout_s, scratch / "setup.log", writable=[copy])
    artifact = _built_extension(folder, recipe.name) if ran.ok else None
    if artifact is not None:
        return Fallback(ran, artifact, f"`python {setup} build_ext --inplace` built it in "
                        "a scratch copy")
    why = f"`python {setup} build_ext --inplace` {ran.how()}" if not ran.ok else \
        f"`python {setup} build_ext --inplace` left no {recipe.name} extension"
    return Fallback(ran, None, why)


def _built_extension(folder: Path, name: str) -> Path | None:
    """Where build_ext --inplace puts extension `name`: its package folder, named with
    the interpreter's suffix (`_C.cpython-311-x86_64-linux-gnu.so`)."""
    *package, last = name.split(".")
    where = folder.joinpath(*package)
    suffix = sysconfig.get_config_var("EXT_SUFFIX") or ".so"
    for candidate in (where / f"{last}{suffix}", where / f"{last}.so"):
        if candidate.is_file():
            return candidate
    found = sorted(where.glob(f"{last}.*.so")) if where.is_dir() else []
    return found[0] if found else None
