"""Layouts of library-style repositories the scan reads, on small repositories written
here (the fixtures `library_loop`, `selective_ops`, `cmake_ext` and `subfolder_setup`
show them at full size): ops chosen by a table keyed by the device, scripts with no
`__main__` guard, an extension imported inside `try/except ImportError`, sources a
function returns, a kernel in a header of another folder, torchvision-style and older
registrations, and builds the repository runs itself."""

from __future__ import annotations

from pathlib import Path

import pytest

from kfbot.config import Config, load_config
from kfbot.errors import KfbotError
from kfbot.evaluate.task import make_task
from kfbot.scan.model import Kernel
from kfbot.scan.scanner import scan

BLUR = """\
__global__ void blur_kernel(const float* x, float* y, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) y[i] = x[i];
}
void blur(const float* x, float* y, int n) { blur_kernel<<<(n + 255) / 256, 256>>>(x, y, n); }
PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) { m.def("blur", &blur); }
"""
BLUR_CPU = """\
void blur(const float* x, float* y, int n) { for (int i = 0; i < n; ++i) y[i] = x[i]; }
PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) { m.def("blur", &blur); }
"""
TWO_BUILDS = """\
from setuptools import setup
from torch.utils.cpp_extension import CppExtension, CUDAExtension
setup(ext_modules=[CUDAExtension("blur_cuda", ["csrc/blur.cu"]),
                   CppExtension("blur_cpu", ["csrc/blur_cpu.cpp"])])
"""


def _write(root: Path, files: dict[str, str]) -> None:
    for rel, text in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)


def _scan(root: Path, files: dict[str, str]) -> dict[str, Kernel]:
    _write(root, files)
    return {k.name: k for k in scan(root, Config()).kernels}


def _refs(kernel: Kernel) -> list[str]:
    return [f"{r.file}:{r.line}" for r in kernel.references]


def test_an_op_chosen_by_the_device_through_a_table(tmp_path: Path) -> None:
    kernels = _scan(tmp_path, {
        "csrc/blur.cu": BLUR, "csrc/blur_cpu.cpp": BLUR_CPU, "setup.py": TWO_BUILDS,
        "blurops.py": """\
import blur_cpu
import blur_cuda

_IMPL = {"cpu": blur_cpu, "cuda": blur_cuda}


def blur(x):
    return _IMPL[x.device.type].blur(x)


def blur_inline(x):
    return {"cpu": blur_cpu, "cuda": blur_cuda}[x.device.type].blur(x)
""",
        "tests/test_blur.py": """\
import torch
from blurops import blur, blur_inline


def test_blur():
    x = torch.randn(100, device="cuda")
    torch.testing.assert_close(blur(x), x)


def test_blur_inline():
    x = torch.randn(100, device="cuda")
    torch.testing.assert_close(blur_inline(x), x.clone())
""",
    })
    assert _refs(kernels["blur_kernel"]) == ["tests/test_blur.py:7", "tests/test_blur.py:12"]
    assert {r.module_hint for r in kernels["blur_kernel"].references} == {"blur_cuda"}


def test_a_script_with_no_main_guard_and_an_import_inside_try(tmp_path: Path) -> None:
    kernels = _scan(tmp_path, {
        "csrc/blur.cu": BLUR,
        "setup.py": """\
from setuptools import setup
from torch.utils.cpp_extension import CUDAExtension
setup(ext_modules=[CUDAExtension("blur_ext", ["csrc/blur.cu"])])
""",
        "check_blur.py": """\
import torch
try:
    import blur_ext
except ImportError:
    blur_ext = None
    print("blur_ext is not built: python setup.py build_ext --inplace")

x = torch.randn(4096, device="cuda")
y = blur_ext.blur(x)
assert torch.allclose(y, x), "blur does not match"
print("ok")
""",
    })
    (ref,) = kernels["blur_kernel"].references
    assert (ref.file, ref.test, ref.kind, ref.module_hint) == \
        ("check_blur.py", "<module>", "script", "blur_ext")


def test_sources_a_function_returns(tmp_path: Path) -> None:
    kernels = _scan(tmp_path, {
        "csrc/blur.cu": BLUR,
        "setup.py": """\
import os
from setuptools import setup
from torch.utils.cpp_extension import CUDAExtension

HERE = os.path.dirname(os.path.abspath(__file__))


def get_sources():
    return [os.path.join(HERE, "csrc", "blur.cu")]


setup(ext_modules=[CUDAExtension("blur_ext", sources=get_sources())])
""",
    })
    (build,) = kernels["blur_kernel"].builds
    assert (build.kind, build.name, build.sources) == ("setup_py", "blur_ext",
                                                       ("csrc/blur.cu",))


def test_a_kernel_in_a_header_of_another_folder(tmp_path: Path) -> None:
    kernels = _scan(tmp_path, {
        "include/ops/blur_kernel.cuh": """\
#pragma once
__global__ void blur_kernel(const float* x, float* y, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) y[i] = x[i];
}
""",
        "src/cuda/blur.cu": """\
#include "ops/blur_kernel.cuh"
void blur(const float* x, float* y, int n) { blur_kernel<<<(n + 255) / 256, 256>>>(x, y, n); }
PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) { m.def("blur", &blur); }
""",
        "setup.py": """\
from setuptools import setup
from torch.utils.cpp_extension import CUDAExtension
setup(ext_modules=[CUDAExtension("blur_ext", ["src/cuda/blur.cu"], include_dirs=["include"])])
""",
    })
    kernel = kernels["blur_kernel"]
    assert [(b.kind, b.name) for b in kernel.builds] == [("setup_py", "blur_ext")]
    assert [(b.module, b.name) for b in kernel.bindings] == [("blur_ext", "blur")]


def test_selective_names_and_the_older_registry(tmp_path: Path) -> None:
    kernels = _scan(tmp_path, {
        "csrc/ops.cpp": """\
#include <torch/library.h>
TORCH_LIBRARY_FRAGMENT(vis, m) {
  m.def(TORCH_SELECTIVE_SCHEMA("vis::blur(Tensor x) -> Tensor"));
}
""",
        "csrc/cuda/blur_kernel.cu": """\
#include <torch/library.h>
__global__ void blur_kernel(const float* x, float* y, int n) {}
at::Tensor blur_cuda(const at::Tensor& x) { blur_kernel<<<1, 1>>>(nullptr, nullptr, 0); return x; }
TORCH_LIBRARY_IMPL(vis, CUDA, m) {
  m.impl(TORCH_SELECTIVE_NAME("vis::blur"), TORCH_FN(blur_cuda));
}
""",
        "csrc/cuda/sharpen_cuda.h": "#pragma once\nat::Tensor sharpen_cuda(at::Tensor x);\n",
        "csrc/cuda/sharpen_cuda.cu": """\
#include "sharpen_cuda.h"
__global__ void sharpen_kernel(float* y) {}
at::Tensor sharpen_cuda(at::Tensor x) { sharpen_kernel<<<1, 1>>>(nullptr); return x; }
""",
        "csrc/sharpen.cpp": """\
#include "cuda/sharpen_cuda.h"
#define VIS_API __attribute__((visibility("default")))
VIS_API torch::Tensor sharpen(torch::Tensor x) { return sharpen_cuda(x); }
static auto registry = torch::RegisterOperators().op("vis::sharpen", &sharpen);
""",
    })
    assert [(b.kind, b.module, b.name, b.cpp_function) for b in kernels["blur_kernel"].bindings
            if b.cpp_function] == [("torch_library_impl", "vis", "blur", "blur_cuda")]
    assert [(b.module, b.name, b.cpp_function) for b in kernels["sharpen_kernel"].bindings] == \
        [("vis", "sharpen", "sharpen")]


def test_a_build_the_repository_runs_itself(tmp_path: Path) -> None:
    kernels = _scan(tmp_path, {
        "csrc/blur.cu": BLUR,
        "CMakeLists.txt": "cmake_minimum_required(VERSION 3.18)\nproject(blur CXX CUDA)\n",
        "setup.py": """\
import subprocess
from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext


class CMakeExtension(Extension):
    def __init__(self, name):
        super().__init__(name, sources=[])


class CMakeBuild(build_ext):
    def build_extension(self, ext):
        subprocess.check_call(["cmake", "-S", ".", "-B", self.build_temp])
        subprocess.check_call(["cmake", "--build", self.build_temp])


setup(name="blur", ext_modules=[CMakeExtension("blur._C")], cmdclass={"build_ext": CMakeBuild})
""",
    })
    (build,) = kernels["blur_kernel"].builds
    assert (build.kind, build.file) == ("repository", "setup.py")
    assert "setup.py runs CMake (CMakeLists.txt)" in build.cannot_tell[0]


def test_paths_taken_apart_and_joined_from_file(tmp_path: Path) -> None:
    kernels = _scan(tmp_path, {
        "blur3d/blur.cu": BLUR,
        "blur3d/setup.py": """\
from setuptools import setup
from torch.utils.cpp_extension import CUDAExtension
setup(ext_modules=[CUDAExtension("blur_3d", ["/".join(__file__.split("/")[:-1] + ["blur.cu"])])])
""",
        "blur3d/dist_blur.py": """\
import os
from torch.utils.cpp_extension import load
blur_3d = load(name="blur_3d", sources=[
    "/".join(os.path.abspath(__file__).split("/")[:-1] + ["blur.cu"])])
""",
    })
    builds = kernels["blur_kernel"].builds
    assert sorted((b.kind, b.name, b.sources) for b in builds) == [
        ("load", "blur_3d", ("blur3d/blur.cu",)), ("setup_py", "blur_3d", ("blur3d/blur.cu",))]


def test_a_wrapper_that_checks_its_inputs_is_no_reference(tmp_path: Path) -> None:
    """A library's own wrapper compares two of its inputs before calling the op: that
    checks nothing of the op, in either branch."""
    kernels = _scan(tmp_path, {
        "csrc/blur.cu": BLUR.replace("PYBIND11_MODULE(TORCH_EXTENSION_NAME, m)",
                                     "PYBIND11_MODULE(blur_ext, m)"),
        "setup.py": """\
from setuptools import setup
from torch.utils.cpp_extension import CUDAExtension
setup(ext_modules=[CUDAExtension("blurlib.blur_ext", ["csrc/blur.cu"])])
""",
        "blurlib/__init__.py": "from .blur import blur\n",
        "blurlib/blur.py": """\
import torch
from . import blur_ext


def blur(x, batch_x, batch_y):
    if x.is_cuda:
        if not torch.equal(batch_x, batch_y):
            raise ValueError("batch_x and batch_y differ")
        return blur_ext.blur(x)
    if not torch.equal(batch_x.unique(), batch_y.unique()):
        raise ValueError("batch_x and batch_y differ")
    return x.clone()
""",
    })
    assert kernels["blur_kernel"].bindings
    assert _refs(kernels["blur_kernel"]) == []


def test_a_declared_repository_build_and_its_budget(tmp_path: Path) -> None:
    _write(tmp_path, {
        "csrc/blur.cu": BLUR,
        "setup.py": "from setuptools import setup\nsetup(name='blur')\n",
        "kfbot.yaml": """\
version: 1
tasks:
  - name: blur
    kernel: blur_kernel
    build:
      kind: repository
      file: setup.py
repository_build:
  timeout: 5m
""",
    })
    config = load_config(None, tmp_path)
    report = scan(tmp_path, config)
    (kernel,) = report.kernels
    first = kernel.builds[0]
    assert (first.kind, first.file, first.origin) == \
        ("repository", "setup.py", "declared")
    task = make_task(kernel, tmp_path, config, report.kernels)
    assert task.build.kind == "repository" and task.own_build_timeout_s == 300.0


def test_a_budget_without_its_unit_is_refused(tmp_path: Path) -> None:
    _write(tmp_path, {"kfbot.yaml": "version: 1\nrepository_build:\n  timeout: '30'\n"})
    with pytest.raises(KfbotError, match=r"kfbot.yaml:3: repository_build.timeout: expected "
                       r"a duration with its unit \(90s, 45m, 1h30m\), got '30'"):
        load_config(None, tmp_path)


FIXTURES = Path(__file__).resolve().parents[2] / "fixtures"


@pytest.mark.parametrize(("fixture", "expected"), [
    ("library_loop", {
        "csrc/cuda/row_scale_cuda.cu::rowlib::row_scale_kernel":
            ("repository", "rowlib.row_scale", ["test/test_row_scale.py:14"]),
        "csrc/cuda/row_shift_cuda.cu::rowlib::row_shift_kernel":
            ("repository", "rowlib.row_shift", ["test/test_row_shift.py:14"])}),
    ("subfolder_setup", {
        "nearest3d/nearest.cu::nearest_kernel":
            ("load", "nearest_3d.forward", ["check_nearest.py:15"]),
        "nearest2d/nearest.cu::nearest_kernel":
            ("load", "nearest_2d.forward", ["tests/test_nearest_2d.py:18"])}),
    ("selective_ops", {
        "visops/csrc/kernels/blur_rows.cuh::visops::blur_rows_kernel":
            ("setup_py", "visops.blur_rows", ["test/test_blur_rows.py:21"])}),
    ("cmake_ext", {
        "csrc/clamp.cu::clamp01_kernel":
            ("repository", "clampops.clamp01", ["tests/test_clamp01.py:8"])}),
])
def test_the_fixtures_of_these_layouts_pair(
        fixture: str, expected: dict[str, tuple[str, str, list[str]]]) -> None:
    report = scan(FIXTURES / fixture, Config())
    found = {k.id: (k.builds[0].kind if k.builds else "",
                    f"{k.bindings[-1].module}.{k.bindings[-1].name}" if k.bindings else "",
                    [f"{r.file}:{r.line}" for r in k.references])
             for k in report.kernels}
    assert found == expected
