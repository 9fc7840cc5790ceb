"""The original as the repository's own code imports it, for its tests and scripts.

The worker loads each build under a name of its own (`<name>_kf<tag>`), with its
library namespaces renamed, so that the original and a candidate share a process. The
repository's tests import the extension by its real name and call its ops by their
real namespaces: they get a build of the original with the real names
(`BuildRequest(real_names=True)`), staged under those names (`staged`), without
anything installed or written into the checkout.

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
from kfbot.evaluate.build.model import real_module_name
from kfbot.evaluate.processes import Ran, last_lines, run_process
from kfbot.evaluate.sandbox import untrusted_env
from kfbot.evaluate.staged import StagedModule
from kfbot.paths import copy_repository
from kfbot.scan.model import BuildRecipe

FALLBACK_TIMEOUT_S = 1800.0


def staged_modules(recipe: BuildRecipe, built: BuildResult) -> tuple[StagedModule, ...]:
    """What the repository's code imports or loads, mapped to a real-names build."""
    if not built.ok or built.artifact is None:
        return ()
    return (StagedModule(recipe.name, "extension", str(built.artifact)),)


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
                      timeout_s, scratch / "setup.log")
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
