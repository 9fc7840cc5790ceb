"""`kfbot check [FILES...]`: the light pre-commit hook, without torch or network.

For the changed files (the ones pre-commit passes, or every file changed since the
base revision when none are given) it scans the repository, names the kernels the
change touches, runs nvcc's front end over the changed `.cu` files, and reports every
kernel that had a reference test at the base revision and has none now.

Exit codes (what pre-commit expects: non-zero shows the output and fails the hook):
0 nothing wrong, or nothing to check; 1 a compile error or a broken reference
pairing; 2 bad usage (not a git repository, an unknown base revision, a bad config).
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from kfbot.changes import (
    BrokenPairing,
    ChangedKernel,
    broken_pairings,
    changed_kernels,
    changed_paths,
    given_paths,
    is_kernel_source,
    resolve_base,
    scan_base,
)
from kfbot.commands.options import add_repo_arguments
from kfbot.config import Config, load_config
from kfbot.errors import EXIT_FAILURE, EXIT_OK
from kfbot.evaluate.diagnostics import parse_compiler_output
from kfbot.evaluate.model import Diagnostic
from kfbot.scan.model import BuildRecipe, Kernel, ScanReport
from kfbot.scan.scanner import scan

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
HEADER_SUFFIXES = (".cuh", ".h", ".hpp", ".hh", ".hxx", ".inl", ".cuinl")
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


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("check", help="pre-commit: scan and compile-check changed kernels "
                                     "(no torch, no GPU)",
                       description="The light pre-commit hook: names the kernels a change "
                                   "touches, checks their syntax (nvcc's front end, or "
                                   "tree-sitter where nvcc cannot run) and fails when a "
                                   "kernel lost its reference test.")
    p.add_argument("files", nargs="*", type=Path,
                   help="changed files (default: every file changed since --base)")
    add_repo_arguments(p)
    p.add_argument("--base", default="HEAD", metavar="REV",
                   help="revision whose reference pairing to compare with")
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    root = args.repo.resolve()
    paths = given_paths(root, args.files) if args.files else changed_paths(root, args.base)
    paths = [p for p in paths if is_kernel_source(p)]
    if not paths:
        print("kfbot check: no kernel sources changed")
        return EXIT_OK
    config = load_config(args.config, root)
    report = scan(root, config)
    changed = changed_kernels(root, args.base, paths, report)
    compiles = Compiles(root, to_compile(paths, changed), report.kernels)
    try:  # the base is scanned while nvcc runs
        broken = _pairings(root, args.base, report, config if args.config else None)
    finally:
        results = compiles.results()
    _print_kernels(changed, paths)
    _print_compiles(results, compiles.nvcc)
    for item in broken:
        print(item.line(args.base))
    failed = broken or any(r.errors for r in results)
    return EXIT_FAILURE if failed else EXIT_OK


def to_compile(paths: Sequence[str], changed: Sequence[ChangedKernel]) -> list[str]:
    """The changed `.cu` files, and those that define or launch a kernel whose changed
    header they include: a header is only ever compiled as part of a `.cu` file."""
    files = [p for p in paths if p.endswith(".cu")]
    for item in changed:
        if any(f.endswith(HEADER_SUFFIXES) for f in item.files):
            k = item.kernel
            files += [f for f in (k.file, *(s.file for s in k.launch_sites)) if f.endswith(".cu")]
    return list(dict.fromkeys(files))


def _pairings(root: Path, base: str, report: ScanReport,
              config: Config | None) -> list[BrokenPairing]:
    sha = resolve_base(root, base)
    if sha is None:
        print(f"kfbot check: {base} has no commit yet: reference pairing not compared")
        return []
    return broken_pairings(root, base, report, scan_base(root, sha, config))


def _print_kernels(changed: Sequence[ChangedKernel], paths: Sequence[str]) -> None:
    files = f"{len(paths)} changed file{'s' if len(paths) != 1 else ''}"
    if not changed:
        print(f"kfbot check: no kernel is touched by the {files}")
        return
    print(f"kfbot check: {len(changed)} kernel{'s' if len(changed) != 1 else ''} "
          f"touched by the {files}:")
    for item in changed:
        k = item.kernel
        refs = f"{len(k.references)} reference test{'s' if len(k.references) != 1 else ''}" \
            if k.references else "NO REFERENCE TEST"
        print(f"  {k.definition.qualified_name} ({k.file}:{k.definition.line}; {refs}; changed: "
              f"{', '.join(item.files)})")


def _print_compiles(results: Sequence[CompileResult], nvcc: str | None) -> None:
    if not results:
        return
    if nvcc is None:
        print("kfbot check: nvcc not found (set CUDA_HOME or put it on PATH): "
              "compile check skipped")
        return
    for r in results:
        if r.skipped:
            print(f"{r.file}: compile check skipped: {r.skipped}")
        elif not r.errors:
            print(f"{r.file}: compiles (nvcc front end, {r.seconds:.2f} s)")
        for d in r.errors:
            print(f"{d.file or r.file}:{d.line or 0}: error: {d.message}")
        if r.errors and not any(d.file for d in r.errors):
            print(r.output.strip())  # a failure that names no line: show nvcc's own words


# --- the nvcc front-end check -------------------------------------------------------------


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
            return [CompileResult(f, ()) for f in self.pending]
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
        self.proc = subprocess.Popen(list(command), cwd=cwd, stdout=self.log,
                                     stderr=subprocess.STDOUT)

    def result(self) -> CompileResult:
        try:
            self.proc.wait(timeout=max(1.0, NVCC_TIMEOUT_S - (time.monotonic() - self.started)))
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            return CompileResult(self.file, (), f"nvcc took over {NVCC_TIMEOUT_S:.0f} s")
        seconds = time.monotonic() - self.started
        self.log.seek(0)
        output = self.log.read().decode(errors="replace")
        self.log.close()
        return compile_result(self.file, self.proc.returncode, output, seconds)


def compile_result(file: str, returncode: int, output: str, seconds: float) -> CompileResult:
    """Read nvcc's output: errors with file and line, or why the file was not checked."""
    errors = tuple(d for d in parse_compiler_output(output) if d.severity == "error")
    header = next((m for d in errors if (m := _TORCH_HEADER.search(d.message))), None)
    if header is not None:
        return CompileResult(file, (), f"it includes PyTorch's headers ({header['header']}), "
                             "which take about 45 s to parse; `kfbot hook verify` builds it",
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
    return [nvcc, *FRONT_END, f"-arch={_arch()}", *defaults, *flags, "-o", os.devnull, file]


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
