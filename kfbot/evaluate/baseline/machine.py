"""What this machine must have before a kernel is built, checked in about a second.

`kfbot verify --explain` runs this step before the build, which takes 40 s and more
with torch's headers, so that a machine that cannot get through the baseline says why
at once: a CPU build of torch (it cannot build or run CUDA code), no NVIDIA driver, no
nvcc, no pytest for the repository's tests, or a module the tests import that is not
installed here. Nothing is imported or run: torch's version is read from its files,
the tests' imports from their syntax.

None of these is fixed by a `kfbot.yaml`, so the step proposes none; it says what to
install, by the names the tests use.
"""

from __future__ import annotations

import ast
import importlib.util
import os
import posixpath
import re
import shutil
import sys
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path

from kfbot.errors import KfbotError
from kfbot.evaluate.baseline.steps import StepReport
from kfbot.evaluate.build import find_toolkit
from kfbot.evaluate.task import KernelTask

_CUDA_VERSION = re.compile(r"^cuda(?:\s*:[^=]*)?=\s*(?P<value>.+)$", re.M)
_TORCH_VERSION = re.compile(r"^__version__\s*=\s*['\"](?P<value>[^'\"]+)", re.M)
# Handlers that make an import optional: a test that copes without the module.
_OPTIONAL = {"ImportError", "ModuleNotFoundError", "Exception", "BaseException"}


def environment_step(task: KernelTask, python: str = sys.executable) -> StepReport:
    """One step: ok with what was found, or failed with every missing thing at once."""
    checks = [_torch(python), _driver(), _nvcc()]
    if task.test_targets:
        checks.append(_pytest(python))
    checks += _imports(task, python)
    missing = [short for ok, _, _, short in checks if not ok]
    evidence = "\n".join(f"{what:<8} {why}" for _, what, why, _ in checks)
    if missing:
        return StepReport("environment", "failed", f"this machine lacks {_listed(missing)}; "
                          "nothing can get past the later steps without it", evidence)
    return StepReport("environment", "ok", "CUDA torch, an NVIDIA driver and nvcc are here"
                      + (", and what the tests import" if task.test_targets else ""), evidence)


# Passed, what, what was found or why it fails, and what is missing in a few words.
Check = tuple[bool, str, str, str]


def _listed(items: Sequence[str]) -> str:
    return items[0] if len(items) == 1 else f"{', '.join(items[:-1])} and {items[-1]}"


def _torch(python: str) -> Check:
    spec = importlib.util.find_spec("torch")
    folders = spec.submodule_search_locations if spec is not None else None
    if not folders:
        return (False, "torch", f"torch is not installed for {python}: install the CUDA build "
                "of torch, then pip install 'kfbot[gpu]'", "torch")
    try:
        text = (Path(next(iter(folders))) / "version.py").read_text()
    except OSError:
        return (True, "torch", "installed (its version file could not be read)", "")
    version = m["value"] if (m := _TORCH_VERSION.search(text)) else "?"
    cuda = m["value"].strip() if (m := _CUDA_VERSION.search(text)) else "None"
    if cuda in ("None", "''", '""'):
        return (False, "torch", f"torch {version} for {python} is a CPU build: it cannot "
                "build or run CUDA extensions; install a CUDA build of torch",
                f"a CUDA build of torch ({version} here)")
    return (True, "torch", f"torch {version}, CUDA {cuda.strip(chr(39) + chr(34))}", "")


def _driver() -> Check:
    smi = shutil.which("nvidia-smi")
    if smi is None and not os.path.exists("/dev/nvidiactl"):
        return (False, "driver", "no NVIDIA driver on this machine (no nvidia-smi on PATH, "
                "no /dev/nvidiactl): kernels cannot run here", "an NVIDIA driver")
    return (True, "driver", smi or "/dev/nvidiactl", "")


def _nvcc() -> Check:
    try:
        return (True, "nvcc", find_toolkit().nvcc, "")
    except KfbotError as exc:
        return (False, "nvcc", str(exc), "nvcc")


def _pytest(python: str) -> Check:
    if importlib.util.find_spec("pytest") is None:
        return (False, "pytest", f"pytest is not installed for {python}, which runs the "
                "repository's tests: pip install 'kfbot[gpu]' brings it", "pytest")
    return (True, "pytest", "installed", "")


def _imports(task: KernelTask, python: str) -> list[Check]:
    """One check per file the tests and scripts load (conftest.py files included): the
    modules it imports that are neither the repository's own, nor built by kfbot, nor
    installed for `python`."""
    files = _loaded_files(task)
    own = _own_names(task)
    out = []
    for file in files:
        try:
            tree = ast.parse((task.root / file).read_bytes(), filename=file)
        except (OSError, SyntaxError, ValueError):
            continue  # what cannot be read here, the import step reports when it runs
        here = task.root / posixpath.dirname(file)
        names = sorted({n for n in _imported(tree) if n not in own
                        and not _local(n, (here, task.root, task.root / "src"))})
        absent = [n for n in names if n not in sys.stdlib_module_names
                  and importlib.util.find_spec(n) is None]
        if absent:
            out.append((False, "imports", f"{file} imports {', '.join(absent)}, not installed "
                        f"for {python}: install the repository's test dependencies",
                        f"{', '.join(absent)} (which {file} imports)"))
        else:
            out.append((True, "imports", f"{file}: {', '.join(names) or 'nothing to install'}",
                        ""))
    return out


def _loaded_files(task: KernelTask) -> list[str]:
    tests = [t.partition("::")[0] for t in task.test_targets]
    files = dict.fromkeys([*tests, *task.script_targets])
    for test in tests:  # pytest loads each conftest.py from the root down to the test
        folder = posixpath.dirname(test)
        while True:
            conftest = posixpath.join(folder, "conftest.py") if folder else "conftest.py"
            if (task.root / conftest).is_file():
                files[conftest] = None
            if not folder:
                break
            folder = posixpath.dirname(folder)
    return list(files)


def _own_names(task: KernelTask) -> set[str]:
    """Top-level names kfbot provides when the tests run: the extension it builds."""
    names = {task.build.name.split(".")[0], task.op.module.split(".")[0]}
    if task.build.package_dir:
        names.add(posixpath.basename(task.build.package_dir))
    return names


def _local(name: str, folders: Sequence[Path]) -> bool:
    return any((f / f"{name}.py").is_file() or (f / name).is_dir() for f in folders)


def _imported(tree: ast.AST) -> Iterator[str]:
    """Top-level module names the code imports, except where it copes without them (an
    `except ImportError`) or only type-checks (`if TYPE_CHECKING:`)."""
    yield from _walk(ast.iter_child_nodes(tree))


def _walk(nodes: Iterable[ast.AST]) -> Iterator[str]:
    for node in nodes:
        if isinstance(node, ast.Try) and any(_optional(h.type) for h in node.handlers):
            yield from _walk([*node.orelse, *node.finalbody])
        elif isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            yield from _walk(node.orelse)
        elif isinstance(node, ast.Import):
            yield from (a.name.split(".")[0] for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            if not node.level and node.module:
                yield node.module.split(".")[0]
        else:
            yield from _walk(ast.iter_child_nodes(node))


def _optional(handler: ast.expr | None) -> bool:
    if handler is None:
        return True
    names = [handler] if not isinstance(handler, ast.Tuple) else handler.elts
    return any(ast.unparse(n).rsplit(".", 1)[-1] in _OPTIONAL for n in names)
