"""`kfbot verify --explain` from the command line: each step with its outcome, the
failed one with its evidence and the kfbot.yaml that would get past it, without a GPU
when a step before the comparison fails, and the checkout left as it was."""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
from pathlib import Path

KERNEL = """\
__global__ void twice_kernel(const float* x, float* y, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) y[i] = 2.0f * x[i] +;
}

void launch_twice(const float* x, float* y, int n) {
  twice_kernel<<<(n + 255) / 256, 256>>>(x, y, n);
}
"""
BINDING = """\
#include <pybind11/pybind11.h>
#include <cstdint>

void launch_twice(const float* x, float* y, int n);

void twice(std::uintptr_t x, std::uintptr_t y, int n) {
  launch_twice(reinterpret_cast<const float*>(x), reinterpret_cast<float*>(y), n);
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) { m.def("twice", &twice); }
"""
SETUP = """\
from setuptools import setup
from torch.utils.cpp_extension import BuildExtension, CUDAExtension

setup(name="twice_ext", ext_modules=[CUDAExtension("twice_ext", ["csrc/bind.cpp", "csrc/twice.cu"],
      extra_compile_args={"nvcc": ["-O3", "--use_fast_math"]})],
      cmdclass={"build_ext": BuildExtension})
"""
TEST = """\
import torch
import twice_ext


def test_twice():
    x = torch.randn(1000, device="cuda")
    y = torch.empty_like(x)
    twice_ext.twice(x.data_ptr(), y.data_ptr(), x.numel())
    torch.testing.assert_close(y, x * 2)
"""


def test_explain_names_the_failed_step_with_its_evidence(tmp_path: Path) -> None:
    root = tmp_path / "repo"
    for rel, text in {"csrc/twice.cu": KERNEL, "csrc/bind.cpp": BINDING, "setup.py": SETUP,
                      "tests/test_twice.py": TEST}.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)
    subprocess.run(["git", "init", "-q"], cwd=root, check=True)
    before = _hashes(root)
    env = {**os.environ, "KFBOT_CACHE": str(tmp_path / "cache"), "COLUMNS": "200"}
    done = subprocess.run([sys.executable, "-m", "kfbot", "verify", "twice_kernel", "--repo",
                           str(root), "--explain"], capture_output=True, text=True, env=env,
                          timeout=600)
    assert done.returncode == 1, done.stderr
    assert done.stdout, done.stderr
    lines = [line.strip() for line in done.stdout.splitlines()]
    assert lines[0] == "pair  ok  1 test calls the op: tests/test_twice.py::test_twice"
    assert lines[1].startswith("build  FAILED  setup_py twice_ext (setup.py:4): the original "
                               "does not build at the compile stage")
    assert any(line.startswith("| csrc/twice.cu:3:") for line in lines)
    snippet = done.stdout[done.stdout.index("kfbot.yaml that would get past this step:"):]
    assert "kernel: csrc/twice.cu::twice_kernel" in snippet
    assert 'extra_cuda_cflags: ["-O3", "--use_fast_math"]' in snippet
    assert lines[-3:] == ["import  skipped  not run: the build step failed",
                          "capture  skipped  not run: the build step failed",
                          "reference  skipped  not run: the build step failed"]
    assert "no CUDA GPU" not in done.stderr  # the answer needed no GPU
    assert _hashes(root) == before


def _hashes(root: Path) -> dict[str, str]:
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(root.rglob("*")) if p.is_file() and ".git" not in p.parts}
