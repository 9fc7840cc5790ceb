"""The fixture repositories hold real code: every .cu compiles with nvcc (device code; the
host code is checked by nvcc's front end), every .cpp with g++.

Skipped: fixtures/hostile (junk on purpose) and committed torch JIT build folders (any
folder holding a build.ninja), whose sources are generated copies. The inline softmax,
whose CUDA lives in a Python string, is compiled the way load_inline would write it.
These compiles need nvcc / g++ and torch's headers; they run two at a time.
"""

from __future__ import annotations

import importlib.util
import os
import re
import shutil
import subprocess
import sysconfig
import types
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

import pytest
from cuda_compile import NVCC, cuda_include, torch_includes
from kernel_builder_tool import REGISTRATION_H

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures"
SKIPPED_FIXTURES = {"hostile", "cheats"}  # cheats: compiled by test_cheat_corpus.py
CXX = shutil.which("g++")


def _sources(suffix: str) -> list[Path]:
    found = []
    for dirpath, dirnames, filenames in os.walk(FIXTURES):
        here = Path(dirpath)
        if here == FIXTURES:
            dirnames[:] = [d for d in dirnames if d not in SKIPPED_FIXTURES]
        if "build.ninja" in filenames:
            dirnames[:] = []
            continue
        dirnames.sort()
        found += [here / f for f in sorted(filenames) if f.endswith(suffix)]
    return found


def _id(path: Path) -> str:
    return path.relative_to(FIXTURES).as_posix()


def _fixture_root(path: Path) -> Path:
    return FIXTURES / path.relative_to(FIXTURES).parts[0]


# Headers that a fixture's build tool writes and its repository does not hold.
_TOOL_HEADERS = {"kernel_builder": {"registration.h": REGISTRATION_H}}


@pytest.fixture(scope="module")
def tool_headers(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Per fixture, a folder holding the headers its build tool would write."""
    out = {}
    for fixture, headers in _TOOL_HEADERS.items():
        folder = tmp_path_factory.mktemp(f"{fixture}-tool-headers")
        for name, text in headers.items():
            (folder / name).write_text(text)
        out[fixture] = folder
    return out


def _include_flags(source: Path, tool_headers: dict[str, Path] | None = None) -> list[str]:
    dirs = [*torch_includes(), sysconfig.get_paths()["include"]]
    own = _fixture_root(source) / "include"
    if own.is_dir():
        dirs.insert(0, str(own))
    dirs[:0] = _quoted_include_roots(source)
    generated = (tool_headers or {}).get(_fixture_root(source).name)
    if generated is not None:
        dirs.append(str(generated))
    return [f"-I{d}" for d in dirs]


def _quoted_include_roots(source: Path) -> list[str]:
    """The fixture's folders from which a `#include "a/b.h"` of `source` resolves, as the
    fixture's own `include_dirs` would give them (a kernel header of another folder)."""
    root = _fixture_root(source)
    roots: list[str] = []
    for name in re.findall(r'^\s*#\s*include\s+"([^"]+)"', source.read_text(), re.MULTILINE):
        for folder in source.parents:
            if (folder / name).is_file() and folder != source.parent:
                roots.append(str(folder))
                break
            if folder == root:
                break
    return roots


def _defines(source: Path) -> list[str]:
    name = _fixture_root(source).name
    return [f"-DTORCH_EXTENSION_NAME={name}_ext", "-DTORCH_API_INCLUDE_EXTENSION_H"]


def _run(cmd: list[str]) -> str | None:
    """None when the command succeeds, else what it printed."""
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
    if proc.returncode == 0:
        return None
    return f"{' '.join(cmd)}\nexit {proc.returncode}\n{proc.stdout}\n{proc.stderr[-6000:]}"


def _compile(cmd: list[str]) -> None:
    error = _run(cmd)
    assert error is None, error


def _nvcc_command(source: Path, out_dir: Path) -> list[str] | str:
    if NVCC is None:
        return "nvcc not found"
    # Device code only (-cubin): nvcc's front end still parses and checks the host code,
    # without g++'s pass over torch's headers; the GPU tests build the fixtures in full.
    cubin = out_dir / (source.stem + ".cubin")
    return [NVCC, "-cubin", "-std=c++17", "-arch=sm_90", *_defines(source),
            *_include_flags(source), str(source), "-o", str(cubin)]


def _gxx_command(source: Path, tool_headers: dict[str, Path]) -> list[str] | str:
    return _gxx(source, _defines(source), _include_flags(source, tool_headers))


def _gxx(source: Path, defines: list[str], includes: list[str]) -> list[str] | str:
    if CXX is None:
        return "g++ not found"
    cuda = cuda_include()
    if cuda is None:
        return "CUDA headers (cuda_runtime.h) not found"
    return [CXX, "-fsyntax-only", "-std=c++17", *defines, *includes, f"-I{cuda}", str(source)]


@pytest.fixture(scope="module")
def pool() -> Iterator[ThreadPoolExecutor]:
    """Two compiles at a time: each is one process, and the torch headers make each take
    5-30 s."""
    with ThreadPoolExecutor(max_workers=2) as executor:
        yield executor


@pytest.fixture(scope="module")
def precompiled(pool: ThreadPoolExecutor, tmp_path_factory: pytest.TempPathFactory
                ) -> Precompiled:
    return Precompiled(tmp_path_factory.mktemp("pch"), pool)


@pytest.fixture(scope="module")
def compiled(request: pytest.FixtureRequest, tool_headers: dict[str, Path],
             pool: ThreadPoolExecutor, precompiled: Precompiled,
             tmp_path_factory: pytest.TempPathFactory) -> dict[Path, list[str] | str | None]:
    """Compile the sources this session selected: per source, None when it compiled, the
    failure's output, or why it could not be tried (a one-line str)."""
    torch_includes()
    selected = {item.callspec.params["source"] for item in request.session.items
                if getattr(item, "callspec", None) is not None
                and isinstance(item.callspec.params.get("source"), Path)}
    out = tmp_path_factory.mktemp("objects")
    commands: dict[Path, list[str] | str] = {
        s: _nvcc_command(s, out / str(i)) if s.suffix == ".cu" else _gxx_command(s, tool_headers)
        for i, s in enumerate(sorted(selected))}
    for i in range(len(commands)):
        (out / str(i)).mkdir()
    runnable = {s: cmd for s, cmd in commands.items() if isinstance(cmd, list)}
    shared = precompiled.start({s: c for s, c in runnable.items() if s.suffix == ".cpp"})

    def run(source: Path) -> str | None:
        return _run(precompiled.command(source, runnable[source]))

    # The others first: they keep the second thread busy while the headers compile.
    order = sorted(runnable, key=lambda s: s in shared)
    errors = dict(zip(order, pool.map(run, order), strict=True))
    return {s: errors[s] if s in errors else commands[s] for s in commands}


# Header sequences that several fixture sources read before anything else. g++ spends
# most of a check in them (torch/extension.h: 24 of 32 s), so each is precompiled once
# and given to those checks with `-include`: g++ reads the precompiled state first, and
# the source's own #includes of the same headers are then no-ops (each has #pragma once
# or an include guard), so the source is checked as it would be without it.
_PRECOMPILED: tuple[tuple[str, ...], ...] = (
    ("torch/extension.h",),
    ("ATen/core/Tensor.h", "ATen/ops/empty.h", "ATen/ops/empty_like.h",
     "c10/core/DeviceGuard.h", "torch/csrc/utils/pybind.h"),
)
_PchKey = tuple[tuple[str, ...], tuple[str, ...]]  # (headers, the check's flags)


class Precompiled:
    """The precompiled headers of one session's checks, built on the compile pool."""

    def __init__(self, folder: Path, pool: ThreadPoolExecutor) -> None:
        self._folder = folder
        self._pool = pool
        self._built: dict[_PchKey, Future[Path | None]] = {}

    def start(self, commands: dict[Path, list[str]]) -> set[Path]:
        """Start the headers that two or more of these g++ checks read first (one
        check gains nothing: building a header costs more than reading it once); the
        checks that will use them."""
        users: dict[_PchKey, list[Path]] = {}
        for source, command in commands.items():
            key = _pch_key(source, command)
            if key is not None:
                users.setdefault(key, []).append(source)
        shared = {key: sources for key, sources in users.items() if len(sources) > 1}
        for key in shared:
            self.build(key)
        return {source for sources in shared.values() for source in sources}

    def build(self, key: _PchKey) -> None:
        if key not in self._built:
            folder = self._folder / str(len(self._built))
            self._built[key] = self._pool.submit(_build_pch, folder, key)

    def command(self, source: Path, command: list[str], build: bool = False) -> list[str]:
        """`command` with the precompiled header it can use, where one was built (or
        is, with `build`)."""
        key = _pch_key(source, command) if source.suffix == ".cpp" else None
        if key is not None and build:
            self.build(key)
        built = self._built.get(key) if key is not None else None
        header = built.result() if built is not None else None
        return command if header is None else [command[0], "-include", str(header), *command[1:]]


def _pch_key(source: Path, command: list[str]) -> _PchKey | None:
    """The precompiled header `source`'s check could use: the first of _PRECOMPILED that
    `source` reads before anything else, with the flags the check reads it under (under
    other include folders it could be other files). All but the extension's name, which
    differs per fixture: g++ refuses a precompiled header where a macro that it tests is
    defined otherwise, and then reads the headers itself."""
    dirs = [Path(flag[2:]) for flag in command if flag.startswith("-I")]
    leading = _leading_headers(source, dirs, frozenset({source.resolve()}))[0]
    flags = tuple(flag for flag in command[1:-1]
                  if flag != "-fsyntax-only" and not flag.startswith("-DTORCH_EXTENSION_NAME="))
    for headers in _PRECOMPILED:
        if leading[:len(headers)] == headers:
            return headers, flags
    return None


_COMMENTS = re.compile(r"//[^\n]*|/\*.*?\*/", re.DOTALL)
_ANGLE_INCLUDE = re.compile(r"#\s*include\s*<([^>]+)>")
_QUOTED_INCLUDE = re.compile(r'#\s*include\s*"([^"]+)"')
_PRAGMA_ONCE = re.compile(r"#\s*pragma\s+once")


def _leading_headers(path: Path, dirs: list[Path], seen: frozenset[Path]
                     ) -> tuple[tuple[str, ...], bool]:
    """The <headers> that the preprocessor reads from `path` before anything else,
    following `path`'s leading "quoted" includes the way g++ finds them (the including
    file's folder, then `dirs`); and whether the file holds nothing else."""
    headers: list[str] = []
    for line in _COMMENTS.sub(" ", path.read_text()).splitlines():
        line = line.strip()
        if not line or _PRAGMA_ONCE.fullmatch(line):
            continue
        if angle := _ANGLE_INCLUDE.fullmatch(line):
            headers.append(angle[1])
            continue
        quoted = _QUOTED_INCLUDE.fullmatch(line)
        found = next((folder / quoted[1] for folder in [path.parent, *dirs]
                      if (folder / quoted[1]).is_file()), None) if quoted else None
        if found is None or found.resolve() in seen:
            return tuple(headers), False
        inner, whole = _leading_headers(found, dirs, seen | {found.resolve()})
        headers += inner
        if not whole:
            return tuple(headers), False
    return tuple(headers), True


def _build_pch(folder: Path, key: _PchKey) -> Path | None:
    """`headers` precompiled as `folder`/leading.h.gch for checks run with `flags`; None
    where g++ cannot build it, and each check reads the headers itself."""
    headers, flags = key
    folder.mkdir()
    header = folder / "leading.h"
    header.write_text("".join(f"#include <{h}>\n" for h in headers))
    build = [CXX or "g++", "-x", "c++-header", *flags, str(header), "-o", f"{header}.gch"]
    return header if _run(build) is None else None


def _outcome(compiled: dict[Path, list[str] | str | None], source: Path) -> None:
    result = compiled[source]
    if isinstance(result, str) and "\n" not in result:
        pytest.skip(result)
    assert result is None, result


def test_fixture_sources_found() -> None:
    cu = {_id(p) for p in _sources(".cu")}
    assert "example/csrc/softmax.cu" in cu
    assert not any(p.startswith("hostile/") or "/build/" in p for p in cu)


@pytest.mark.parametrize("source", _sources(".cu"), ids=_id)
def test_cu_compiles(source: Path, compiled: dict[Path, list[str] | str | None]) -> None:
    _outcome(compiled, source)


@pytest.mark.parametrize("source", _sources(".cpp"), ids=_id)
def test_cpp_compiles(source: Path, compiled: dict[Path, list[str] | str | None]) -> None:
    _outcome(compiled, source)


def _inline_softmax_module() -> types.ModuleType:
    path = FIXTURES / "inline_softmax" / "softmax_inline.py"
    pytest.importorskip("torch.utils.cpp_extension")
    spec = importlib.util.spec_from_file_location("softmax_inline", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _as_load_inline_writes(module: types.ModuleType) -> tuple[str, str]:
    """main.cpp and cuda.cu as torch.utils.cpp_extension.load_inline writes them."""
    main_cpp = "\n".join([
        "#include <torch/extension.h>",
        module.cpp_src,
        "PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {",
        'm.def("softmax", torch::wrap_pybind_function(softmax), "softmax");',
        "}",
    ])
    cuda_cu = "\n".join([
        "#include <torch/types.h>",
        "#include <cuda.h>",
        "#include <cuda_runtime.h>",
        module.cuda_src,
    ])
    return main_cpp, cuda_cu


def test_inline_build_copy_matches_source() -> None:
    main_cpp, cuda_cu = _as_load_inline_writes(_inline_softmax_module())
    build = FIXTURES / "inline_softmax" / "build" / "inline_softmax"
    assert (build / "main.cpp").read_text() == main_cpp
    assert (build / "cuda.cu").read_text() == cuda_cu


def test_inline_cuda_compiles(tmp_path: Path) -> None:
    _, cuda_cu = _as_load_inline_writes(_inline_softmax_module())
    source = tmp_path / "cuda.cu"
    source.write_text(cuda_cu)
    if NVCC is None:
        pytest.skip("nvcc not found")
    _compile([NVCC, "-cubin", "-std=c++17", "-arch=sm_90",
              "-DTORCH_EXTENSION_NAME=inline_softmax",
              *_include_flags(FIXTURES / "inline_softmax" / "softmax_inline.py"),
              str(source), "-o", str(tmp_path / "cuda.cubin")])


def test_inline_main_cpp_compiles(tmp_path: Path, precompiled: Precompiled) -> None:
    main_cpp, _ = _as_load_inline_writes(_inline_softmax_module())
    source = tmp_path / "main.cpp"
    source.write_text(main_cpp)
    # The macros and include folders load_inline compiles main.cpp with (CUDA's too, as
    # the extension has CUDA sources).
    command = _gxx(source, ["-DTORCH_EXTENSION_NAME=inline_softmax",
                            "-DTORCH_API_INCLUDE_EXTENSION_H"],
                   _include_flags(FIXTURES / "inline_softmax" / "softmax_inline.py"))
    if isinstance(command, str):
        pytest.skip(command)
    _compile(precompiled.command(source, command, build=True))


# --- the precompiled headers change no verdict ------------------------------------------


def test_a_check_reads_its_leading_headers_through_quoted_includes() -> None:
    library = FIXTURES / "library_loop" / "csrc"
    dirs = [Path(d) for d in torch_includes()]
    assert _leading_headers(library / "row_scale.cpp", dirs, frozenset()) == (
        ("torch/extension.h",), False)  # rowlib.h includes it, then declares
    nearest = FIXTURES / "subfolder_setup" / "nearest2d" / "nearest_cuda.cpp"
    assert _leading_headers(nearest, dirs, frozenset())[0][:2] == (
        "cuda_runtime.h", "torch/extension.h")


def test_a_source_that_reads_something_else_first_gets_no_precompiled_header(
        tmp_path: Path) -> None:
    flags = [f"-I{d}" for d in torch_includes()]
    cases = {
        "macro_first.cpp": "#define TORCH_ASSERT_ONLY_METHOD_OPERATORS\n"
                           "#include <torch/extension.h>\n",
        "other_header_first.cpp": "#include <vector>\n#include <torch/extension.h>\n",
        "code_first.cpp": "int first = 0;\n#include <torch/extension.h>\n",
        "missing_quoted.cpp": '#include "not_here.h"\n#include <torch/extension.h>\n',
    }
    for name, text in cases.items():
        source = tmp_path / name
        source.write_text(text)
        assert _pch_key(source, ["g++", "-fsyntax-only", *flags, str(source)]) is None, name
    kept = tmp_path / "kept.cpp"
    kept.write_text("// a comment\n#pragma once\n#include <torch/extension.h>\nint x;\n")
    assert _pch_key(kept, ["g++", *flags, str(kept)]) == (("torch/extension.h",), tuple(flags))


def test_an_error_after_the_precompiled_header_still_fails_the_check(
        tmp_path: Path, precompiled: Precompiled) -> None:
    """The same command as a fixture's check, through the precompiled header (g++'s -H
    marks a precompiled header it used with `!`): code that does not compile fails."""
    source = tmp_path / "broken.cpp"
    source.write_text("#include <torch/extension.h>\n#include <cuda_runtime.h>\n\n"
                      "torch::Tensor twice(torch::Tensor x) { return x * undeclared_factor; }\n")
    command = _gxx(source, _defines(FIXTURES / "example" / "csrc" / "bindings.cpp"),
                   _include_flags(FIXTURES / "example" / "csrc" / "bindings.cpp"))
    if isinstance(command, str):
        pytest.skip(command)
    with_header = precompiled.command(source, command, build=True)
    assert "-include" in with_header
    proc = subprocess.run([with_header[0], "-H", *with_header[1:]], capture_output=True,
                          text=True, timeout=900)
    assert proc.returncode != 0
    assert re.search(r"^! \S+leading\.h\.gch$", proc.stderr, re.MULTILINE), proc.stderr[:3000]
    assert re.search(r"\bundeclared_factor\W+ was not declared", proc.stderr), proc.stderr[-3000:]
