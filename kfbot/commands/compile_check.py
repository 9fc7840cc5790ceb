"""Does the changed code compile: nvcc's front end, with the build's own flags.

nvcc's front end (`-cubin -fdevice-syntax-only`) parses and type-checks a `.cu` file
with the flags of the build that compiles it, in about 0.3 s. A file that includes
PyTorch's headers takes about 45 s to parse, too long for a commit: it is skipped, and
tree-sitter reads it instead (kfbot.commands.syntax_diff), unless `with_torch` asks for
the compile and torch's headers are installed for this Python.

Only what nvcc says about the change stops a commit. A failure that names no line (an
architecture this nvcc does not know, a broken host compiler) and a header the
committed version could not find either (a library that is not installed here) are
reasons the file was not checked, said as such.
"""

from __future__ import annotations

import importlib.util
import os
import re
import shutil
import subprocess
import sysconfig
import tempfile
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path

from kfbot.evaluate.build.diagnostics import parse_compiler_output
from kfbot.evaluate.model import Diagnostic
from kfbot.evaluate.sandbox.environment import untrusted_env
from kfbot.paths import file_argument
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
# for a commit hook by default; `kfbot hook verify` builds it.
_TORCH_HEADER = re.compile(r"^(?:torch|ATen|c10|pybind11|caffe2)/|^Python\.h$")
# A header the compiler could not find, as cudafe++ and the host compiler say it.
_NOT_FOUND = re.compile(r'cannot open source file "(?P<a>[^"]+)"|^(?P<b>[^:\s]+): No such file')
TORCH_SECONDS = 45  # about, for one file with torch's headers (nvcc 13.0, measured)
# What torch's cpp_extension defines for an extension's sources: PYBIND11_MODULE needs
# the name (any name parses).
_TORCH_DEFINES = ("-DTORCH_API_INCLUDE_EXTENSION_H", "-DTORCH_EXTENSION_NAME=kfbot_check")


@dataclass(frozen=True)
class CompileResult:
    file: str  # root-relative
    errors: tuple[Diagnostic, ...]
    skipped: str | None = None  # why it was not checked
    output: str = ""
    seconds: float = 0.0
    missing_header: str | None = None  # the first header the compiler could not find
    with_torch: bool = False  # compiled with torch's headers


class Compiles:
    """nvcc's front end over some `.cu` files, started at once and running while the
    caller does other work; `results()` waits for them. With `with_torch`, a file that
    needs PyTorch's headers is compiled again with them, where they are installed."""

    def __init__(self, root: Path, files: Sequence[str], kernels: Sequence[Kernel],
                 with_torch: bool = False) -> None:
        self.root = root
        self.nvcc = find_nvcc() if files else None
        self.pending = [(f, False) for f in files if (root / f).is_file()]
        self.kernels = kernels
        self.torch_dirs = torch_include_dirs() if with_torch else None
        self.with_torch = with_torch
        self.running: list[_Nvcc] = []
        self._start(os.cpu_count() or 1)

    def _start(self, count: int) -> None:
        while self.nvcc is not None and self.pending and count > 0:
            file, torch = self.pending.pop(0)
            command = nvcc_command(self.nvcc, file, recipe_for(file, self.kernels),
                                   self.torch_dirs if torch else None)
            timeout = NVCC_TIMEOUT_S * (3 if torch else 1)
            self.running.append(_Nvcc(file, command, self.root, timeout, torch))
            count -= 1

    def results(self) -> list[CompileResult]:
        if self.nvcc is None:
            return [CompileResult(f, (), NO_NVCC) for f, _ in self.pending]
        done = []
        while self.running:
            result = self._settled(self.running.pop(0).result())
            if result is not None:
                done.append(result)
            self._start(1)
        return done

    def _settled(self, result: CompileResult) -> CompileResult | None:
        """The result, or None where the file is compiled again with torch's headers."""
        if not (self.with_torch and _needs_torch(result) and not result.with_torch):
            return result
        if self.torch_dirs is None:
            return replace(result, skipped=f"{result.skipped}; torch is not installed for "
                           "this Python, so --with-torch cannot compile it")
        self.pending.append((result.file, True))
        return None


class _Nvcc:
    def __init__(self, file: str, command: Sequence[str], cwd: Path, timeout: float,
                 torch: bool) -> None:
        self.file = file
        self.timeout = timeout
        self.torch = torch
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
            self.proc.wait(timeout=max(1.0, self.timeout - (time.monotonic() - self.started)))
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            self.log.close()
            return CompileResult(self.file, (), f"nvcc took over {self.timeout:.0f} s",
                                 with_torch=self.torch)
        seconds = time.monotonic() - self.started
        self.log.seek(0)
        output = self.log.read().decode(errors="replace")
        self.log.close()
        return replace(compile_result(self.file, self.proc.returncode, output, seconds),
                       with_torch=self.torch)


def compile_result(file: str, returncode: int, output: str, seconds: float) -> CompileResult:
    """Read nvcc's output: errors with file and line, or why the file was not checked."""
    # nvcc names the file as it was given (`./a.cu`); the report names it as git does.
    diagnostics = [replace(d, file=d.file and d.file.removeprefix("./"))
                   for d in parse_compiler_output(output)]
    errors = tuple(d for d in diagnostics if d.severity == "error")
    missing = next((m["a"] or m["b"] for d in errors if (m := _NOT_FOUND.search(d.message))),
                   None)
    if missing is not None and _TORCH_HEADER.search(missing):
        return CompileResult(file, (), f"PyTorch's headers ({missing}) take about "
                             f"{TORCH_SECONDS} s to parse; `kfbot hook verify` builds what "
                             "includes them", output, seconds, missing)
    if returncode != 0 and not any(d.line for d in errors):
        said = errors[0].message if errors else next(
            (line.strip() for line in output.splitlines() if line.strip()), "no message")
        return CompileResult(file, (), f"nvcc stopped without naming a line (exit "
                             f"{returncode}: {said[:200]})", output, seconds)
    return CompileResult(file, errors, None, output, seconds, missing)


def _needs_torch(result: CompileResult) -> bool:
    return bool(result.missing_header and _TORCH_HEADER.search(result.missing_header))


def excused(results: Sequence[CompileResult],
            before: Mapping[str, bytes | None]) -> list[CompileResult]:
    """`results` where a file failed only because a header could not be found that its
    committed version (`before`, by file) includes too: not checked, rather than failed.
    A library missing here (cutlass not checked out) is no fault of the change; a new
    `#include` that names nothing is."""
    out = []
    for r in results:
        old = before.get(r.file)
        if r.errors and r.missing_header and old is not None and _includes(old, r.missing_header):
            r = replace(r, errors=(), skipped=f"nvcc cannot find {r.missing_header} here, "
                        "which the committed version includes too")
        out.append(r)
    return out


def _includes(source: bytes, header: str) -> bool:
    pattern = rb'^\s*#\s*include\s*[<"]' + re.escape(header.encode()) + rb'[>"]'
    return re.search(pattern, source, re.M) is not None


def torch_include_dirs() -> tuple[str, ...] | None:
    """The include folders torch's cpp_extension gives a build, for the torch installed
    for this Python, found without importing it; None when there is none."""
    try:
        spec = importlib.util.find_spec("torch")
    except (ImportError, ValueError):
        return None
    folders = spec.submodule_search_locations if spec is not None else None
    if not folders:
        return None
    include = Path(next(iter(folders))) / "include"
    if not (include / "torch" / "extension.h").is_file():
        return None
    return (str(include), str(include / "torch" / "csrc" / "api" / "include"),
            sysconfig.get_paths()["include"])


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


def nvcc_command(nvcc: str, file: str, recipe: BuildRecipe | None,
                 torch_dirs: Sequence[str] | None = None) -> list[str]:
    """The front-end check of `file` (root-relative; nvcc runs in the root) with the
    include folders, defines and CUDA flags of the build that compiles it, and with
    `torch_dirs`, torch's include folders and the defines of its extensions."""
    flags: list[str] = []
    if torch_dirs is not None:
        flags += [*(f"-I{d}" for d in torch_dirs), *_TORCH_DEFINES]
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
