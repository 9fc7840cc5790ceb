"""The fast path: a candidate's kernel compiled alone and linked to the host part of its
unit, which is compiled once per original; and every way back to the full build.

The split itself is checked on the fixture layouts (tree-sitter only). The compiles
are real: nvcc builds the host part and the kernel's unit of a small layout whose host
part includes a torch header (c10's, a few seconds), and the objects are linked with
`ld -r` to show that every kernel the host part launches is defined. Loading the
result needs a CUDA torch: tests/evaluate/test_split_build_gpu.py.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import time
from pathlib import Path

import pytest

from kfbot.evaluate.build import Builder, BuildRequest, cpp_extension
from kfbot.evaluate.build.fast.split import (
    Refused,
    Split,
    host_difference,
    instantiations,
    split_unit,
)
from kfbot.scan.model import BuildRecipe

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures"
ONE_UNIT = FIXTURES / "one_unit_ops"
ONE_UNIT_FILES = ("csrc/main.cu", "csrc/kernels/common.cuh", "csrc/kernels/softmax.cuh",
                  "csrc/kernels/relu.cuh", "csrc/kernels/rmsnorm.cuh")
TORCH_FILES = FIXTURES / "torch_files_ops"
SOFTMAX = "csrc/kernels/softmax.cuh"
HAVE_NVCC = shutil.which("nvcc") is not None and shutil.which("nm") is not None


def _one_unit(path: str = "", old: str = "", new: str = "") -> dict[str, str]:
    """The one-unit fixture's files, with `old` replaced by `new` in `path`."""
    files = {p: (ONE_UNIT / p).read_text() for p in ONE_UNIT_FILES}
    if path:
        assert old in files[path], (path, old)
        files[path] = files[path].replace(old, new)
    return files


def _split(unit: str, files: dict[str, str], kernel: str) -> Split:
    found = split_unit(unit, files, kernel)
    assert isinstance(found, Split), found
    return found


# --- the split, on the fixture layouts --------------------------------------------------


def test_one_unit_kernel_moves_with_its_launcher_and_lines_stay() -> None:
    files = _one_unit()
    split = _split("csrc/main.cu", files, "naive_softmax_kernel")
    assert {(m.name, m.kernel) for m in split.moved} == {
        ("naive_softmax_kernel", True), ("softmax_forward", False)}
    device, host = split.device, split.host
    assert "torch/extension.h" not in device["csrc/main.cu"]
    assert "PYBIND11_MODULE" not in device["csrc/main.cu"]
    assert "expf(in[j] - peak) / total" in device["csrc/kernels/softmax.cuh"]
    assert "#define CEIL_DIV" in device["csrc/kernels/common.cuh"]
    assert "relu_kernel" not in device["csrc/kernels/relu.cuh"]  # other kernels stay out
    assert "expf" not in host["csrc/kernels/softmax.cuh"]  # declared, not defined
    assert "naive_softmax_kernel(const float* x, float* y, int rows, int cols) ;" in \
        host["csrc/kernels/softmax.cuh"]
    assert "PYBIND11_MODULE" in host["csrc/main.cu"]
    for path, text in files.items():  # compiler messages name the repository's lines
        assert device[path].count("\n") == host[path].count("\n") == text.count("\n")


def test_a_change_to_the_kernel_or_its_movable_launch_shares_the_host_part() -> None:
    original = _split("csrc/main.cu", _one_unit(), "naive_softmax_kernel")
    body = _one_unit(SOFTMAX, *(
        "for (int j = 0; j < cols; ++j) out[j] = expf(in[j] - peak) / total;",
        "float inv = 1.0f / total;\n    for (int j = 0; j < cols; ++j) "
        "out[j] = expf(in[j] - peak) * inv;"))
    launch = _one_unit(SOFTMAX, *("const int threads = 128;",
                                                   "const int threads = 64;"))
    for files in (body, launch):
        assert host_difference(original, _split("csrc/main.cu", files,
                                                "naive_softmax_kernel")) is None
    wrapper = _one_unit("csrc/main.cu", *('"softmax: 2-D float32"', '"softmax: 2-D"'))
    why = host_difference(original, _split("csrc/main.cu", wrapper, "naive_softmax_kernel"))
    assert why is not None and "csrc/main.cu:15" in why and "softmax: 2-D" in why


def test_template_kernel_and_launcher_move_and_name_their_instances() -> None:
    split = _split("csrc/main.cu", _one_unit(), "relu_kernel")
    assert {(m.name, m.template) for m in split.moved} == {
        ("relu_kernel", True), ("relu_forward", True)}
    symbols = ["void relu_forward<float>(float const*, float*, long, CUstream_st*)",
               "void relu_forward<double>(double const*, double*, long, CUstream_st*)",
               "at::Tensor::data_ptr<float>() const", "c10::detail::torchCheckFail(...)"]
    made = instantiations(split, symbols)
    assert made == ["template void relu_forward<double>(double const*, double*, long, "
                    "CUstream_st*);",
                    "template void relu_forward<float>(float const*, float*, long, "
                    "CUstream_st*);"]
    hidden = instantiations(split, ["void relu_forward<(anonymous namespace)::T>(...)"])
    assert isinstance(hidden, Refused) and "no other unit can name" in hidden.reason


def test_per_file_layout_keeps_the_torch_launch_in_the_host_part() -> None:
    unit = "csrc/softmax.cu"
    text = (TORCH_FILES / unit).read_text()
    original = _split(unit, {unit: text}, "softmax_kernel")
    assert [m.name for m in original.moved] == ["softmax_kernel"]
    helper = text.replace("peak = block_reduce(peak, scratch, true);",
                          "peak = row_max(peak, scratch);").replace(
        "__global__ void softmax_kernel", "__device__ float row_max(float v, float* s) "
        "{ return block_reduce(v, s, true); }\n\n__global__ void softmax_kernel")
    # A helper only the kernel uses is the kernel's: the host part is the same.
    assert host_difference(original, _split(unit, {unit: helper}, "softmax_kernel")) is None
    threads = text.replace("constexpr int kThreads = 256;", "constexpr int kThreads = 128;")
    why = host_difference(original, _split(unit, {unit: threads}, "softmax_kernel"))
    assert why is not None and "kThreads = 128" in why  # the launch in softmax_cuda uses it


def test_a_helper_another_kernel_uses_keeps_the_candidate_whole() -> None:
    files = _one_unit(SOFTMAX, *(
        "for (int j = 0; j < cols; ++j) total += expf(in[j] - peak);",
        "for (int j = 0; j < cols; ++j) total += expf(in[j] - peak) + 0.0f * warp_sum(0.f);"))
    original = _split("csrc/main.cu", files, "naive_softmax_kernel")
    changed = dict(files)
    changed["csrc/kernels/common.cuh"] = files["csrc/kernels/common.cuh"].replace(
        "v += __shfl_xor_sync", "v = v + __shfl_xor_sync")
    why = host_difference(original, _split("csrc/main.cu", changed, "naive_softmax_kernel"))
    # rmsnorm_kernel, which stays in the host part, calls warp_sum too.
    assert why is not None and "common.cuh" in why


@pytest.mark.parametrize(("old", "new", "reason"), [
    ("int row = blockIdx.x * blockDim.x + threadIdx.x;",
     "int row = blockIdx.x * C10_WARP_SIZE + threadIdx.x;",
     "kernel naive_softmax_kernel's code uses C10_WARP_SIZE from the torch headers"),
    ("__global__ void naive_softmax_kernel(", "namespace {\n__global__ void hidden_k() {}\n}\n"
     "__global__ void naive_softmax_kernel(", None),
])
def test_what_cannot_leave_the_torch_headers_is_refused(old: str, new: str,
                                                        reason: str | None) -> None:
    files = _one_unit(SOFTMAX, old, new)
    found = split_unit("csrc/main.cu", files, "naive_softmax_kernel")
    if reason is None:  # an unrelated anonymous namespace is no reason
        assert isinstance(found, Split)
    else:
        assert isinstance(found, Refused) and found.reason == reason


def test_a_device_variable_the_host_sets_is_refused() -> None:
    text = (TORCH_FILES / "csrc/gelu.cu").read_text()
    text = text.replace("__global__ void gelu_kernel", "__constant__ float c_scale[1];\n\n"
                        "__global__ void gelu_kernel").replace(
        "y[i] = 0.5f * v", "y[i] = c_scale[0] * v").replace(
        "auto y = torch::empty_like(x);", "auto y = torch::empty_like(x);\n    float half = "
        "0.5f;\n    cudaMemcpyToSymbol(c_scale, &half, sizeof(float));")
    found = split_unit("csrc/gelu.cu", {"csrc/gelu.cu": text}, "gelu_kernel")
    assert isinstance(found, Refused) and "device variable c_scale" in found.reason
    anonymous = text.replace("__global__ void gelu_kernel", "namespace {\n__global__ void "
                             "gelu_kernel").replace("torch::Tensor gelu_cuda", "}\n"
                                                    "torch::Tensor gelu_cuda")
    found = split_unit("csrc/gelu.cu", {"csrc/gelu.cu": anonymous}, "gelu_kernel")
    assert isinstance(found, Refused) and "anonymous namespace" in found.reason


# --- real compiles: a small layout whose host part includes a torch header ------------

LIGHT = {
    "csrc/k/common.cuh": """\
#pragma once
#include <cuda_runtime.h>
#define CEIL_DIV(a, b) (((a) + (b) - 1) / (b))
__device__ __forceinline__ float twice(float v) { return 2.0f * v; }
""",
    "csrc/k/scale.cuh": """\
#pragma once
#include "k/common.cuh"
namespace ops {
template <typename T>
__global__ void scale_kernel(const T* x, T* y, int n, T s) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = x[i] * s;
}
template <typename T>
void scale_forward(const T* x, T* y, int n, T s, cudaStream_t stream) {
    scale_kernel<T><<<CEIL_DIV(n, 128), 128, 0, stream>>>(x, y, n, s);
}
}  // namespace ops
__global__ void double_kernel(const float* x, float* y, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = twice(x[i]);
}
""",
    "csrc/main.cu": """\
#include <c10/util/Exception.h>
#include "k/scale.cuh"
void scale(const float* x, float* y, int n, float s) {
    TORCH_CHECK(n >= 0, "scale: n must not be negative");
    ops::scale_forward<float>(x, y, n, s, nullptr);
    ops::scale_forward<double>((const double*)x, (double*)y, n, (double)s, nullptr);
}
void twice_all(const float* x, float* y, int n) {
    TORCH_CHECK(n >= 0, "twice: n must not be negative");
    double_kernel<<<CEIL_DIV(n, 256), 256>>>(x, y, n);
}
""",
}
RECIPE = BuildRecipe(kind="setup_py", name="light_ops", file="setup.py", line=1,
                     sources=("csrc/main.cu",), include_dirs=("csrc",),
                     extra_cuda_cflags=("-O3",))
needs_nvcc = pytest.mark.skipif(not HAVE_NVCC, reason="needs nvcc and nm")


@pytest.fixture(scope="module")
def light(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("light")
    for path, text in LIGHT.items():
        (root / path).parent.mkdir(parents=True, exist_ok=True)
        (root / path).write_text(text)
    return root


@pytest.fixture(scope="module")
def builder(tmp_path_factory: pytest.TempPathFactory) -> Builder:
    if not HAVE_NVCC:
        pytest.skip("needs nvcc and nm")
    return Builder(tmp_path_factory.mktemp("split-cache"), arch="90")


def _request(root: Path, kernel: str, path: str, old: str, new: str) -> BuildRequest:
    text = LIGHT[path]
    assert old in text
    files = {path: text.replace(old, new)}
    return BuildRequest(RECIPE, root, files=files, tag=f"c{abs(hash(new)) % 10**6}",
                        kernel=kernel)


def _symbols(obj: Path, *flags: str) -> list[str]:
    shown = subprocess.run(["nm", "-C", *flags, str(obj)], capture_output=True, text=True,
                           check=True).stdout
    found = (re.match(r"^\s*(?:[0-9a-f]+\s+)?[A-Za-z]\s+(.*)$", line) for line in
             shown.splitlines())
    return [match[1] for match in found if match is not None]


@needs_nvcc
def test_kernel_unit_and_host_part_link_with_every_launch_defined(
        light: Path, builder: Builder, tmp_path: Path) -> None:
    request = _request(light, "scale_kernel", "csrc/k/scale.cuh", "x[i] * s", "s * x[i]")
    made = builder.fast.objects(request, builder.plan(request))
    assert not isinstance(made, str), made
    host, device, unit = made
    assert unit == "csrc/main.cu" and host.ok and device.ok
    undefined = _symbols(host.path, "-u")
    assert "void ops::scale_forward<float>(float const*, float*, int, float, CUstream_st*)" \
        in undefined  # launched by the host part, defined by the kernel's unit
    assert not any("scale_kernel" in s for s in _symbols(host.path, "--defined-only"))
    both = tmp_path / "both.o"
    subprocess.run(["ld", "-r", "-o", str(both), str(host.path), str(device.path)], check=True)
    left = [s for s in _symbols(both, "-u") if "scale_" in s or "double_" in s]
    assert left == []
    again = _request(light, "scale_kernel", "csrc/k/scale.cuh", "x[i] * s", "x[i] * s * 1")
    second = builder.fast.objects(again, builder.plan(again))
    assert not isinstance(second, str)
    assert second[0].reused and second[0].path == host.path  # compiled once per original
    assert not second[1].reused


@needs_nvcc
def test_each_build_says_which_path_it_took(light: Path, builder: Builder) -> None:
    request = _request(light, "scale_kernel", "csrc/k/scale.cuh", "x[i] * s", "s * x[i]")
    built = builder.build(request)
    notes = [d.message for d in built.diagnostics if d.kind == "build_path"]
    assert len(notes) == 1
    if cpp_extension.has_cuda_libraries():
        assert built.ok and built.path == "fast"
        assert notes[0].startswith("fast build: kernel scale_kernel compiled alone")
    else:  # a CPU torch cannot link CUDA extensions: the full build is tried, and says why
        assert built.path == "full"
        assert notes[0].startswith("full build: linking the kernel's unit to the host part "
                                   "failed: cannot find -lc10_cuda")


@needs_nvcc
def test_a_macro_of_the_host_headers_sends_the_candidate_to_the_full_build(
        light: Path, builder: Builder) -> None:
    # CUDA_KERNEL_ASSERT comes from c10's headers: the kernel's unit alone cannot expand it.
    request = _request(light, "double_kernel", "csrc/k/scale.cuh",
                       "if (i < n) y[i] = twice(x[i]);",
                       "CUDA_KERNEL_ASSERT(n >= 0);\n    if (i < n) y[i] = twice(x[i]);")
    found = builder.fast.build(request, builder.plan(request), time.monotonic())
    assert isinstance(found, str)  # the reason the builder then notes, and builds whole
    assert found.startswith("the kernel's unit did not compile alone: csrc/k/scale.cuh:16")
    assert "CUDA_KERNEL_ASSERT" in found


@needs_nvcc
def test_a_hung_compile_is_killed_at_its_timeout(light: Path, tmp_path: Path) -> None:
    # Inside the build cache, which the sandboxed compile sees (its /tmp is its own).
    (tmp_path / "cache").mkdir()
    fifo = tmp_path / "cache" / "never-written"
    os.mkfifo(fifo)  # the preprocessor waits for a writer that never comes
    builder = Builder(tmp_path / "cache", arch="90", timeout_s=3.0)
    request = _request(light, "double_kernel", "csrc/k/scale.cuh", "#pragma once",
                       f'#pragma once\n#include "{fifo}"')
    started = time.monotonic()
    built = builder.build(request)
    took = time.monotonic() - started
    assert not built.ok and built.stage == "compile"
    errors = [d for d in built.diagnostics if d.severity == "error"]
    assert errors[0].kind == "compile_timeout"
    assert errors[0].message == "compiling csrc/main.cu took longer than 3 s and was killed"
    assert took < 3.0 * 2 + 30  # at most the two compiles' limits, and their start-up
    readers = [pid for pid in os.listdir("/proc") if pid.isdigit() and _holds(pid, fifo)]
    assert readers == []  # nvcc's preprocessor went with nvcc


def _holds(pid: str, path: Path) -> bool:
    try:
        return any(os.readlink(f"/proc/{pid}/fd/{fd}") == str(path)
                   for fd in os.listdir(f"/proc/{pid}/fd"))
    except OSError:
        return False
