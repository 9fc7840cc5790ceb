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
from concurrent.futures import ThreadPoolExecutor
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
    if CXX is None:
        return "g++ not found"
    cuda = cuda_include()
    if cuda is None:
        return "CUDA headers (cuda_runtime.h) not found"
    return [CXX, "-fsyntax-only", "-std=c++17", *_defines(source),
            *_include_flags(source, tool_headers), f"-I{cuda}", str(source)]


@pytest.fixture(scope="module")
def compiled(request: pytest.FixtureRequest, tool_headers: dict[str, Path],
             tmp_path_factory: pytest.TempPathFactory) -> dict[Path, list[str] | str | None]:
    """Compile the sources this session selected, two at a time (each compile is one
    process, and the torch headers make each take 5-30 s): per source, None when it
    compiled, the failure's output, or why it could not be tried (a one-line str)."""
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
    runnable = [s for s, cmd in commands.items() if isinstance(cmd, list)]
    extension = {s for s in runnable if s.suffix == ".cpp" and _EXTENSION_H in s.read_text()}
    with ThreadPoolExecutor(max_workers=2) as pool:
        pch = pool.submit(_extension_pch, tmp_path_factory.mktemp("pch"), commands, extension)

        def run(source: Path) -> str | None:
            command = commands[source]
            assert isinstance(command, list)
            folder = pch.result() if source in extension else None
            return _run(command if folder is None
                        else [command[0], f"-I{folder}", *command[1:]])

        # The others first: they keep the second thread busy while the header compiles.
        order = sorted(runnable, key=lambda s: s in extension)
        errors = dict(zip(order, pool.map(run, order), strict=True))
    return {s: errors[s] if s in errors else commands[s] for s in commands}


_EXTENSION_H = "#include <torch/extension.h>"


def _extension_pch(folder: Path, commands: dict[Path, list[str] | str],
                   sources: set[Path]) -> Path | None:
    """A precompiled torch/extension.h for the g++ checks that include it first, in a
    folder to put ahead of the include path (g++ looks for `<header>.gch` in each folder
    before the header itself); None where it cannot be built, and each check parses the
    header itself. g++ uses it only where the flags match and the include comes first,
    so a check's verdict is the same either way: it only skips re-reading the ~200k
    lines behind that header (26 s a file here, 7 s with it)."""
    if not sources:
        return None
    command = commands[min(sources)]
    assert isinstance(command, list)
    includes = [flag for flag in command if flag.startswith("-I")]
    headers = [Path(flag[2:]) / "torch" / "extension.h" for flag in includes]
    header = next((h for h in headers if h.is_file()), None)
    if header is None:
        return None
    (folder / "torch").mkdir()
    build = [command[0], "-x", "c++-header", "-std=c++17", "-DTORCH_API_INCLUDE_EXTENSION_H",
             *includes, str(header), "-o", str(folder / "torch" / "extension.h.gch")]
    return folder if _run(build) is None else None


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


def test_inline_main_cpp_compiles(tmp_path: Path) -> None:
    main_cpp, _ = _as_load_inline_writes(_inline_softmax_module())
    source = tmp_path / "main.cpp"
    source.write_text(main_cpp)
    if CXX is None:
        pytest.skip("g++ not found")
    _compile([CXX, "-fsyntax-only", "-std=c++17", "-DTORCH_EXTENSION_NAME=inline_softmax",
              *_include_flags(FIXTURES / "inline_softmax" / "softmax_inline.py"), str(source)])
