"""Compiler output parsing on real nvcc/g++/ptxas/nvlink output.

Each case is a small source plus the commands that build it. The tests compile
them for real when nvcc is on PATH, and also parse copies of the same output
captured under tests/data/nvcc/ so the parsers stay covered without a toolkit.
Regenerate the copies with `python tests/evaluate/test_diagnostics.py` after changing a case.
"""

from __future__ import annotations

import os
import re
import shutil
import stat
import subprocess
import sys
from dataclasses import dataclass, replace
from pathlib import Path

import pytest

from kfbot.evaluate.build.diagnostics import (
    demangle,
    parse_compiler_output,
    parse_ptxas_resources,
    resource_diagnostics,
)
from kfbot.evaluate.model import Diagnostic, KernelResources

DATA = Path(__file__).parents[1] / "data" / "nvcc"
CAPTURE_DIR = "/tmp/kfbot-capture"  # where the stored outputs were compiled
CAPTURED_RELEASE = "13.0"  # register counts and messages are exact for this nvcc only
NVCC = ("nvcc", "-arch=sm_90", "-cubin", "-Xptxas", "-v", "-o", "{dir}/out.cubin")


@dataclass(frozen=True)
class Case:
    name: str
    files: tuple[tuple[str, str], ...]  # (path under the work dir, text)
    commands: tuple[tuple[str, ...], ...]  # "{dir}" stands for the work dir


UNDEFINED = """\
__global__ void k(float* out) {
  out[threadIdx.x] = missing_value;
}
"""

# A conversion error, an unused variable (numbered warning) and an operator error
# that only shows up two template instantiations deep.
TEMPLATE = """\
template <typename T> struct Outer {
  template <typename U> __device__ static U go(U u) { return u * T(); }
};
template <typename T> __device__ T wrap(T t) { return Outer<int>::go(t); }
struct P {};
__global__ void k(float* out) {
  int unused = 3;
  out[0] = wrap(P());
}
"""

MISSING_INCLUDE = '#include "not_there.cuh"\n__global__ void k() {}\n'

HOST_HEADER = 'static int h = "no";\n'
HOST = """\
#include "host.h"
#include <vector>
template <typename T> T twice(T x) { return x * 2; }
struct Box {};
int main() {
  int unused;
  std::vector<int> v;
  int* p = v;
  Box b = twice(Box{});
  return 0;
}
"""

SHARED = """\
__global__ void big_smem(float* out) {
  __shared__ float s[100000];
  s[threadIdx.x] = out[threadIdx.x];
  __syncthreads();
  out[threadIdx.x] = s[threadIdx.x + 1];
}
"""

# An extern "C" kernel with shared memory and a barrier, a template whose local
# array is indexed at run time (stack frame, no spills), and a kernel with more
# live values than -maxrregcount leaves registers for (spills).
RESOURCES = """\
extern "C" __global__ void softmax_kernel(const float* x, float* y, int n) {
  __shared__ float buf[1024];
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  buf[threadIdx.x] = i < n ? x[i] : 0.0f;
  __syncthreads();
  if (i < n) y[i] = __expf(buf[threadIdx.x]);
}

template <int N>
__global__ void local_array(const float* in, float* out, const int* idx) {
  float acc[N];
  for (int i = 0; i < N; ++i) acc[i] = in[threadIdx.x + i];
  for (int i = 0; i < N; ++i) acc[idx[i] % N] += acc[i] * 1.5f;
  out[threadIdx.x] = acc[idx[0] % N];
}
template __global__ void local_array<256>(const float*, float*, const int*);

__global__ void pressure(const float* in, float* out, int n) {
  float acc[64];
#pragma unroll
  for (int j = 0; j < 64; ++j) acc[j] = 0.0f;
  for (int i = 0; i < n; ++i) {
    float x = in[i];
#pragma unroll
    for (int j = 0; j < 64; ++j) acc[j] = acc[j] * x + j;
  }
  float s = 0.0f;
#pragma unroll
  for (int j = 0; j < 64; ++j) s += acc[j] * acc[(j + 7) % 64];
  out[threadIdx.x] = s;
}
"""

HOST_LINK = "void f();\nint main() { f(); }\n"

LINK = """\
extern __device__ float helper(float);
__global__ void uses(float* p) { p[threadIdx.x] = helper(p[threadIdx.x]); }
"""

CASES = (
    Case("undefined", (("src/undefined.cu", UNDEFINED),), ((*NVCC, "{dir}/src/undefined.cu"),)),
    Case("template", (("src/template.cu", TEMPLATE),), ((*NVCC, "{dir}/src/template.cu"),)),
    Case("missing_include", (("src/include.cu", MISSING_INCLUDE),),
         ((*NVCC, "{dir}/src/include.cu"),)),
    Case("host", (("src/host.h", HOST_HEADER), ("src/host.cpp", HOST)),
         (("g++", "-Wall", "-fsyntax-only", "{dir}/src/host.cpp"),)),
    Case("shared", (("src/shared.cu", SHARED),), ((*NVCC, "{dir}/src/shared.cu"),)),
    Case("resources", (("src/resources.cu", RESOURCES),),
         ((*NVCC, "-maxrregcount=16", "{dir}/src/resources.cu"),)),
    Case("two_arches", (("src/resources.cu", RESOURCES),),
         (("nvcc", "-c", "-gencode", "arch=compute_80,code=sm_80", "-gencode",
           "arch=compute_90,code=sm_90", "-Xptxas", "-v", "-o", "{dir}/out.o",
           "{dir}/src/resources.cu"),)),
    Case("bad_arch", (("src/k.cu", SHARED),), (("nvcc", "-arch=sm_99", "-cubin",
                                                "{dir}/src/k.cu"),)),
    Case("host_link", (("src/main.cpp", HOST_LINK),),
         (("g++", "-o", "{dir}/app", "{dir}/src/main.cpp"),)),
    # Relative paths: nvlink names the object file in its message.
    Case("nvlink", (("link.cu", LINK),),
         (("nvcc", "-arch=sm_90", "-rdc=true", "-c", "-o", "link.o", "link.cu"),
          ("nvcc", "-arch=sm_90", "-o", "app", "link.o"))),
)


def error(kind: str, message: str, file: str | None = None, line: int | None = None,
          *details: tuple[str, str]) -> Diagnostic:
    return Diagnostic("build", kind, message, "error", file, line, details)


def warning(kind: str, message: str, file: str | None = None, line: int | None = None,
            *details: tuple[str, str]) -> Diagnostic:
    return Diagnostic("build", kind, message, "warning", file, line, details)


OPERATOR_NOTE = ("note", "built-in operator*(<promoted arithmetic>, <promoted arithmetic>) "
                 "does not match because argument #1 does not match parameter")
REGISTER_FLOOR = ("For profile sm_90 adjusting per thread register count of 16 "
                  "to lower bound of 24")
SHARED_TOO_BIG = ("Entry function '_Z8big_smemPf' uses too much shared data "
                  "(0x61a80 bytes, 0xc000 max)")

EXPECTED_DIAGNOSTICS: dict[str, list[Diagnostic]] = {
    "undefined": [
        error("compile_error", 'identifier "missing_value" is undefined', "src/undefined.cu", 2)],
    "template": [
        error("compile_error", 'no suitable conversion function from "P" to "float" exists',
              "src/template.cu", 8),
        warning("compile_warning", 'variable "unused" was declared but never referenced',
                "src/template.cu", 7, ("code", "177-D")),
        error("compile_error", 'no operator "*" matches these operands', "src/template.cu", 2,
              ("detail", "operand types are: P * int"), OPERATOR_NOTE,
              ("context", 'instantiation of "U Outer<T>::go(U) [with T=int, U=P]" at line 4'),
              ("context", 'instantiation of "T wrap(T) [with T=P]" at line 8')),
    ],
    "missing_include": [
        error("compile_error", "not_there.cuh: No such file or directory", "src/include.cu", 1,
              ("column", "10"))],
    "host": [
        error("compile_error", "invalid conversion from 'const char*' to 'int' [-fpermissive]",
              "src/host.h", 1, ("context", "In file included from {dir}/src/host.cpp:1"),
              ("column", "16")),
        error("compile_error", "cannot convert 'std::vector<int>' to 'int*' in initialization",
              "src/host.cpp", 8, ("context", "{dir}/src/host.cpp: In function 'int main()'"),
              ("column", "12")),
        # -Wunused-variable fires when the function ends, after the error inside it.
        warning("compile_warning", "unused variable 'unused' [-Wunused-variable]",
                "src/host.cpp", 6, ("column", "7")),
        warning("compile_warning", "unused variable 'p' [-Wunused-variable]",
                "src/host.cpp", 8, ("column", "8")),
        error("compile_error", "no match for 'operator*' (operand types are 'Box' and 'int')",
              "src/host.cpp", 3,
              ("context", "{dir}/src/host.cpp: In instantiation of 'T twice(T) [with T = Box]'"),
              ("context", "{dir}/src/host.cpp:9:16:   required from here"), ("column", "47")),
    ],
    "shared": [error("ptxas_error", SHARED_TOO_BIG, None, None, ("function", "_Z8big_smemPf"))],
    "resources": [warning("ptxas_warning", REGISTER_FLOOR)],
    "two_arches": [],
    "bad_arch": [error("compile_error", "Unsupported gpu architecture 'sm_99'")],
    "host_link": [error("link_error", "undefined reference to `f()'")],
    "nvlink": [error("link_error", "Undefined reference to '_Z6helperf' in 'link.o'")],
}

PRESSURE = "_Z8pressurePKfPfi"
LOCAL_ARRAY = "_Z11local_arrayILi256EEvPKfPfPKi"
SOFTMAX = "softmax_kernel"


def kernel(name: str, arch: str, registers: int, **numbers: int) -> KernelResources:
    return KernelResources(name, name, arch, registers, **numbers)


EXPECTED_RESOURCES: dict[str, list[KernelResources]] = {
    "shared": [kernel("_Z8big_smemPf", "sm_90", 10, shared_bytes=400000, barriers=1)],
    "resources": [
        kernel(PRESSURE, "sm_90", 24, stack_frame_bytes=32, spill_store_bytes=44,
               spill_load_bytes=44),
        kernel(LOCAL_ARRAY, "sm_90", 24, stack_frame_bytes=1024),
        kernel(SOFTMAX, "sm_90", 12, shared_bytes=4096, barriers=1),
    ],
    "two_arches": [
        kernel(PRESSURE, "sm_80", 64, constant_bytes=372),
        kernel(LOCAL_ARRAY, "sm_80", 38, stack_frame_bytes=1024, constant_bytes=376),
        kernel(SOFTMAX, "sm_80", 10, shared_bytes=4096, constant_bytes=372, barriers=1),
        kernel(PRESSURE, "sm_90", 63),
        kernel(LOCAL_ARRAY, "sm_90", 38, stack_frame_bytes=1024),
        kernel(SOFTMAX, "sm_90", 12, shared_bytes=4096, barriers=1),
    ],
}


def expected_diagnostics(case: str, workdir: str) -> list[Diagnostic]:
    """The expectations with gcc's context lines (which keep full paths) filled in."""
    return [replace(d, details=tuple((k, v.replace("{dir}", workdir)) for k, v in d.details))
            for d in EXPECTED_DIAGNOSTICS[case]]


def capture(case: Case, workdir: Path) -> str:
    """Write the case's sources into `workdir`, build them, return all output."""
    for name, text in case.files:
        (workdir / name).parent.mkdir(parents=True, exist_ok=True)
        (workdir / name).write_text(text)
    env = {**os.environ, "LC_ALL": "C"}  # plain ASCII quotes from gcc
    output = []
    for command in case.commands:
        argv = [part.replace("{dir}", str(workdir)) for part in command]
        done = subprocess.run(argv, cwd=workdir, env=env, stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True, timeout=120, check=False)
        output.append(done.stdout)
    return "".join(output)


def nvcc_release() -> str | None:
    done = subprocess.run(["nvcc", "--version"], capture_output=True, text=True, check=False)
    found = re.search(r"release (\d+\.\d+)", done.stdout)
    return found[1] if found else None


def shape(diagnostics: list[Diagnostic]) -> list[tuple[str, str | None, int | None]]:
    return [(d.kind, d.file, d.line) for d in diagnostics]


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_real_compiler_output(case: Case, tmp_path: Path) -> None:
    if shutil.which("nvcc") is None or shutil.which("g++") is None:
        pytest.skip("needs nvcc and g++ on PATH")
    text = capture(case, tmp_path)
    found = parse_compiler_output(text, root=str(tmp_path))
    resources = parse_ptxas_resources(text, demanglers=())
    expected = expected_diagnostics(case.name, str(tmp_path))
    if nvcc_release() == CAPTURED_RELEASE:
        assert found == expected
        assert resources == EXPECTED_RESOURCES.get(case.name, [])
    else:  # other releases word messages and allocate registers differently
        assert shape(found) == shape(expected)
        assert [(r.mangled, r.arch, r.shared_bytes) for r in resources] == [
            (r.mangled, r.arch, r.shared_bytes) for r in EXPECTED_RESOURCES.get(case.name, [])]


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_stored_compiler_output(case: Case) -> None:
    text = (DATA / f"{case.name}.txt").read_text()
    assert parse_compiler_output(text, root=CAPTURE_DIR) == expected_diagnostics(
        case.name, CAPTURE_DIR)
    assert parse_ptxas_resources(text, demanglers=()) == EXPECTED_RESOURCES.get(case.name, [])


def test_paths_outside_root_stay_as_printed() -> None:
    text = (DATA / "undefined.txt").read_text()
    (found,) = parse_compiler_output(text, root="/elsewhere")
    assert found.file == f"{CAPTURE_DIR}/src/undefined.cu"
    (found,) = parse_compiler_output(text)
    assert found.file == f"{CAPTURE_DIR}/src/undefined.cu"


def test_repeated_output_is_deduplicated() -> None:
    text = (DATA / "template.txt").read_text()
    assert parse_compiler_output(text * 2, root=CAPTURE_DIR) == expected_diagnostics(
        "template", CAPTURE_DIR)


def test_older_formats() -> None:
    # Older EDG numbers errors without "-D"; older ptxas has no barrier count and
    # CRLF output from Windows builds must parse the same.
    text = (
        "kernel.cu(7): error #20: identifier \"foo\" is undefined\r\n"
        "          detected during instantiation of \"void f<T>() [with T=int]\" at line 9\r\n"
        "\r\n"
        "kernel.cu(1): catastrophic error: cannot open source file \"gone.h\"\r\n"
        "kernel.cu(2): remark #1234-D: a remark is not a problem\r\n"
        "ptxas info    : Compiling entry function '_Z1kPf' for 'sm_70'\r\n"
        "ptxas info    : Function properties for _Z1kPf\r\n"
        "    8 bytes stack frame, 4 bytes spill stores, 8 bytes spill loads\r\n"
        "ptxas info    : Used 4 registers, 16 bytes smem, 356 bytes cmem[0], 8 bytes cmem[2]\r\n"
        "ptxas info    : Compiling entry function 'bare' for 'sm_70'\r\n"
    )
    assert parse_compiler_output(text) == [
        error("compile_error", 'identifier "foo" is undefined', "kernel.cu", 7, ("code", "20"),
              ("context", 'instantiation of "void f<T>() [with T=int]" at line 9')),
        error("compile_error", 'cannot open source file "gone.h"', "kernel.cu", 1)]
    assert parse_ptxas_resources(text, demanglers=()) == [
        kernel("_Z1kPf", "sm_70", 4, shared_bytes=16, constant_bytes=364, stack_frame_bytes=8,
               spill_store_bytes=4, spill_load_bytes=8),
        kernel("bare", "sm_70", 0)]


def test_device_function_properties_are_not_kernels() -> None:
    # Under -rdc ptxas reports non-inlined device functions too; only entries count.
    text = (
        "ptxas info    : Function properties for _Z8local_fnf\n"
        "    136 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads\n"
        "ptxas info    : Compiling entry function '_Z4usesPf' for 'sm_90'\n"
        "ptxas info    : Function properties for _Z4usesPf\n"
        "    0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads\n"
        "ptxas info    : Used 24 registers, used 0 barriers\n"
    )
    assert parse_ptxas_resources(text, demanglers=()) == [kernel("_Z4usesPf", "sm_90", 24)]


def test_demangles_with_cxxfilt() -> None:
    if shutil.which("c++filt") is None:
        pytest.skip("needs c++filt")
    text = (DATA / "resources.txt").read_text()
    names = [r.kernel for r in parse_ptxas_resources(text, demanglers=("c++filt",))]
    assert names == ["pressure(float const*, float*, int)",
                     "void local_array<256>(float const*, float*, int const*)", SOFTMAX]


def fake_demangler(directory: Path, body: str) -> None:
    directory.mkdir()
    script = directory / "cu++filt"
    script.write_text(f"#!/bin/sh\n{body}\n")
    script.chmod(script.stat().st_mode | stat.S_IEXEC)


def test_cu_filt_is_preferred_and_called_once(tmp_path: Path,
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    log = tmp_path / "calls.log"
    fake_demangler(tmp_path / "bin",
                   f'echo "$@" >> {log}\nfor n in "$@"; do echo "pretty$n"; done')
    monkeypatch.setenv("PATH", f"{tmp_path / 'bin'}{os.pathsep}{os.environ['PATH']}")
    text = (DATA / "two_arches.txt").read_text()
    names = [r.kernel for r in parse_ptxas_resources(text)]
    assert names == [f"pretty{PRESSURE}", f"pretty{LOCAL_ARRAY}", SOFTMAX] * 2
    assert log.read_text().splitlines() == [f"{PRESSURE} {LOCAL_ARRAY}"]


def test_failing_or_missing_demangler_keeps_mangled_names(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    fake_demangler(tmp_path / "bin", "exit 3")
    monkeypatch.setenv("PATH", str(tmp_path / "bin"))
    assert demangle([PRESSURE], ("cu++filt",)) == {}
    assert demangle([PRESSURE], ("no-such-demangler",)) == {}
    assert demangle([SOFTMAX], ("cu++filt",)) == {}  # nothing mangled: no call at all


def test_resource_diagnostics() -> None:
    pressure, local, softmax = EXPECTED_RESOURCES["resources"]
    found = resource_diagnostics([replace(softmax), pressure])
    assert [(d.kind, d.severity, d.message) for d in found] == [
        ("resources", "info", "softmax_kernel: 12 registers, 0 B spills, 4096 B shared memory"
         " (sm_90)"),
        ("resources", "info", f"{PRESSURE}: 24 registers, 44 B spills, 0 B shared memory"
         " (sm_90)"),
        ("register_spill", "warning", f"{PRESSURE}: registers spilled to local memory"
         " (44 B stores, 44 B loads at 24 registers, sm_90)"),
    ]
    assert dict(found[0].details) == {
        "kernel": SOFTMAX, "mangled": SOFTMAX, "arch": "sm_90", "registers": "12",
        "shared_bytes": "4096", "constant_bytes": "0", "stack_frame_bytes": "0",
        "spill_store_bytes": "0", "spill_load_bytes": "0", "barriers": "1"}
    assert all(d.stage == "build" and d.file is None for d in found)
    assert resource_diagnostics([local])[0].kind == "resources"
    assert len(resource_diagnostics([local])) == 1  # a stack frame alone is not a spill


if __name__ == "__main__":
    # Recapture the stored outputs (needs nvcc and g++).
    workdir = Path(CAPTURE_DIR)
    shutil.rmtree(workdir, ignore_errors=True)
    for each in CASES:
        workdir.mkdir(parents=True)
        DATA.mkdir(parents=True, exist_ok=True)
        (DATA / f"{each.name}.txt").write_text(capture(each, workdir))
        shutil.rmtree(workdir)
    sys.exit(0)
