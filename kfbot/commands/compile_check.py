"""Is the changed code well-formed: nvcc's front end, or tree-sitter where it cannot run.

nvcc's front end (`-cubin -fdevice-syntax-only`) parses and type-checks a `.cu` file
with the flags of the build that compiles it, in about 0.3 s. It is not run on a file
that includes PyTorch's headers (about 45 s to parse) nor where there is no nvcc;
those files, and the changed C++ sources nvcc never sees, are parsed with tree-sitter
instead (`syntax_check`), which finds syntax errors (a missing `;` or `}`), not type
errors. tree-sitter's CUDA grammar does not know every macro trick, so where the base
version already had places it could not parse, only errors on changed lines count.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path

from kfbot.evaluate.diagnostics import parse_compiler_output
from kfbot.evaluate.model import Diagnostic
from kfbot.evaluate.sandbox.environment import untrusted_env
from kfbot.paths import file_argument
from kfbot.scan import treesitter
from kfbot.scan.model import BuildRecipe, Kernel

NVCC_TIMEOUT_S = 120.0
# The front end alone: preprocess, parse and type-check host and device code for one
# architecture, emit nothing. About 0.3 s for a small kernel, against about 1 s for
# `-c`, which also runs the host compiler (nvcc 13.0, measured).
FRONT_END = ("-cubin", "-fdevice-syntax-only")
# What torch's cpp_extension adds to every nvcc call; with them, the check sees the
# code the way the repository's own build does.
TORCH_NVCC_FLAGS = ("-D__CUDA_NO_HALF_OPERATORS__", "-D__CUDA_NO_HALF_CONVERSIONS__",
                    "-D__CUDA_NO_BFLOAT16_CONVERSIONS__", "-D__CUDA_NO_HALF2_OPERATORS__",
                    "--expt-relaxed-constexpr", "-std=c++17")
NO_NVCC = "nvcc not found (set CUDA_HOME or put it on PATH)"
DEFAULT_ARCH = "sm_90"  # the builder's default when no GPU says otherwise
_PARSE_FLAG_PREFIXES = ("-I", "-D", "-U", "-isystem", "-include", "-std", "--std", "--expt-",
                        "-expt-", "--extended-lambda", "-extended-lambda", "--use_fast_math",
                        "-use_fast_math", "--include-path", "--define-macro", "--undefine-macro",
                        "-Xcudafe", "--pre-include", "--system-include")
_PARSE_FLAGS_WITH_VALUE = ("-I", "-D", "-U", "-isystem", "-include", "-Xcudafe",
                           "--include-path", "--define-macro", "--undefine-macro",
                           "--pre-include", "--system-include")
# A file that includes torch's headers takes about 45 s to parse (measured): too slow
# for a commit hook, so it is left to `kfbot hook verify`, which builds it.
_TORCH_HEADER = re.compile(
    r'(?:cannot open source file "|^)(?P<header>(?:torch|ATen|c10|pybind11|caffe2)/[^":]*'
    r"|Python\.h)")


@dataclass(frozen=True)
class CompileResult:
    file: str  # root-relative
    errors: tuple[Diagnostic, ...]
    skipped: str | None = None  # why it was not checked
    output: str = ""
    seconds: float = 0.0


class Compiles:
    """nvcc's front end over some `.cu` files, started at once and running while the
    caller does other work; `results()` waits for them."""

    def __init__(self, root: Path, files: Sequence[str], kernels: Sequence[Kernel]) -> None:
        self.root = root
        self.nvcc = find_nvcc() if files else None
        self.pending = [f for f in files if (root / f).is_file()]
        self.kernels = kernels
        self.running: list[_Nvcc] = []
        self._start(os.cpu_count() or 1)

    def _start(self, count: int) -> None:
        while self.nvcc is not None and self.pending and count > 0:
            file = self.pending.pop(0)
            recipe = recipe_for(file, self.kernels)
            self.running.append(_Nvcc(file, nvcc_command(self.nvcc, file, recipe), self.root))
            count -= 1

    def results(self) -> list[CompileResult]:
        if self.nvcc is None:
            return [CompileResult(f, (), NO_NVCC) for f in self.pending]
        done = []
        while self.running:
            done.append(self.running.pop(0).result())
            self._start(1)
        return done


class _Nvcc:
    def __init__(self, file: str, command: Sequence[str], cwd: Path) -> None:
        self.file = file
        self.started = time.monotonic()
        # A file, not a pipe: nothing reads the output until the scan is done, and a
        # full pipe would stall the compiler. Closed by `result`.
        self.log = tempfile.TemporaryFile()  # noqa: SIM115
        # The repository's code is only parsed, but nvcc runs the host compiler and what
        # the flags name: it gets the allowlisted environment, not the developer's.
        self.proc = subprocess.Popen(list(command), cwd=cwd, stdout=self.log,
                                     stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                     env=untrusted_env())

    def result(self) -> CompileResult:
        try:
            self.proc.wait(timeout=max(1.0, NVCC_TIMEOUT_S - (time.monotonic() - self.started)))
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            return CompileResult(self.file, (), f"it took over {NVCC_TIMEOUT_S:.0f} s")
        seconds = time.monotonic() - self.started
        self.log.seek(0)
        output = self.log.read().decode(errors="replace")
        self.log.close()
        return compile_result(self.file, self.proc.returncode, output, seconds)


def compile_result(file: str, returncode: int, output: str, seconds: float) -> CompileResult:
    """Read nvcc's output: errors with file and line, or why the file was not checked."""
    # nvcc names the file as it was given (`./a.cu`); the report names it as git does.
    errors = tuple(replace(d, file=d.file and d.file.removeprefix("./"))
                   for d in parse_compiler_output(output) if d.severity == "error")
    header = next((m for d in errors if (m := _TORCH_HEADER.search(d.message))), None)
    if header is not None:
        return CompileResult(file, (), f"PyTorch's headers ({header['header']}) take about "
                             "45 s to parse; `kfbot hook verify` builds what includes them",
                             output, seconds)
    if returncode != 0 and not errors:
        errors = (Diagnostic("build", "compile_error", f"nvcc failed (exit {returncode})",
                             file=file),)
    return CompileResult(file, errors, None, output, seconds)


def find_nvcc() -> str | None:
    """nvcc from CUDA_HOME / CUDA_PATH, else from PATH, as the builder looks for it."""
    for variable in ("CUDA_HOME", "CUDA_PATH"):
        home = os.environ.get(variable)
        if home and os.access(os.path.join(home, "bin", "nvcc"), os.X_OK):
            return os.path.join(home, "bin", "nvcc")
    return shutil.which("nvcc")


def recipe_for(file: str, kernels: Sequence[Kernel]) -> BuildRecipe | None:
    """The build that compiles `file`, as a kernel's task would pick it (declared first)."""
    recipes = [b for k in kernels for b in k.builds if file in b.sources or k.file == file]
    declared = [b for b in recipes if b.origin == "declared"]
    chosen = declared or recipes
    return chosen[0] if chosen else None


def nvcc_command(nvcc: str, file: str, recipe: BuildRecipe | None) -> list[str]:
    """The front-end check of `file` (root-relative; nvcc runs in the root) with the
    include folders, defines and CUDA flags of the build that compiles it."""
    flags: list[str] = []
    if recipe is not None:
        flags += [f"-I{d}" for d in recipe.include_dirs]
        flags += [f"-D{k}={v}" if v else f"-D{k}" for k, v in recipe.defines]
        flags += front_end_flags(recipe.extra_cuda_cflags)
    own_std = any(f.startswith(("-std", "--std")) for f in flags)
    defaults = [f for f in TORCH_NVCC_FLAGS if not (own_std and f.startswith("-std"))]
    return [nvcc, *FRONT_END, f"-arch={_arch()}", *defaults, *flags, "-o", os.devnull,
            file_argument(file)]


def front_end_flags(flags: Sequence[str]) -> list[str]:
    """Those of a build's nvcc flags that change how the source parses: include folders,
    macros, the language standard, the `--expt-*` extensions, fast math (it defines
    __USE_FAST_MATH__). Architecture, output and code generation flags are left out."""
    kept: list[str] = []
    takes_value = False
    for flag in flags:
        if takes_value:
            kept.append(flag)
            takes_value = False
        elif flag in _PARSE_FLAGS_WITH_VALUE:
            kept.append(flag)
            takes_value = True
        elif flag.startswith(_PARSE_FLAG_PREFIXES):
            kept.append(flag)
    return kept


def _arch() -> str:
    """The newest architecture of TORCH_CUDA_ARCH_LIST ("8.0;9.0+PTX" -> sm_90)."""
    listed = re.findall(r"(\d+)\.(\d+)([a-z]?)", os.environ.get("TORCH_CUDA_ARCH_LIST", ""))
    if not listed:
        return DEFAULT_ARCH
    major, minor, suffix = max(listed, key=lambda m: (int(m[0]), int(m[1]), m[2]))
    return f"sm_{major}{minor}{suffix}"


# --- tree-sitter, where nvcc did not look ---------------------------------------------------


@dataclass(frozen=True)
class SyntaxProblem:
    file: str
    line: int
    message: str

    def text(self) -> str:
        return f"{self.file}:{self.line}: error: {self.message} (found by tree-sitter)"


def syntax_check(file: str, now: bytes, before: bytes | None,
                 changed: Callable[[], frozenset[int]]) -> list[SyntaxProblem]:
    """The syntax errors of `file` (its bytes `now`) that the change made: all of them
    when the file is new or its version `before` parsed cleanly, else those touching the
    lines `changed()` names (the grammar's blind spots were there already)."""
    found = treesitter.syntax_errors(treesitter.parse_cuda(now))
    if found and before is not None and treesitter.syntax_errors(treesitter.parse_cuda(before)):
        lines = changed()
        # A line either side: the parser may notice a missing token a line late or early.
        found = [e for e in found if any(e[0] - 1 <= n <= e[1] + 1 for n in lines)]
    return [SyntaxProblem(file, first, message) for first, _, message in found]
