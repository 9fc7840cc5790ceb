"""`kfbot verify --explain` from the command line: each step with its outcome, the
failed one with its evidence and the kfbot.yaml that would get past it, without a GPU
when a step before the comparison fails, and the checkout left as it was."""

from __future__ import annotations

import hashlib
import os
import shutil
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
    assert lines[-4:] == ["import  skipped  not run: the build step failed",
                          "capture  skipped  not run: the build step failed",
                          "reference  skipped  not run: the build step failed",
                          "comparison  skipped  not run: the build step failed"]
    assert "no CUDA GPU" not in done.stderr  # the answer needed no GPU
    assert _hashes(root) == before


FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"


def _explain(root: Path, kernel: str, cache: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "KFBOT_CACHE": str(cache), "COLUMNS": "200"}
    return subprocess.run([sys.executable, "-m", "kfbot", "verify", kernel, "--repo",
                           str(root), "--explain"], capture_output=True, text=True, env=env,
                          timeout=300)


def test_a_build_it_cannot_tell_is_a_failed_step_with_its_evidence(tmp_path: Path) -> None:
    """No setup.py, no load(): what used to stop with an error and no steps."""
    root = tmp_path / "repo"
    shutil.copytree(FIXTURES / "setup_rowsum", root)
    (root / "setup.py").unlink()
    done = _explain(root, "rowsum_kernel", tmp_path / "cache")
    assert done.returncode == 1, done.stderr
    lines = [line.strip() for line in done.stdout.splitlines()]
    assert lines[0] == ("pair  ok  1 test calls the op: "
                        "tests/test_rowsum.py::test_rowsum_matches_torch")
    assert lines[1].startswith("build  FAILED  kfbot cannot tell how this kernel is built: "
                               "no setup.py, pyproject.toml, load() or load_inline() the scan "
                               "could read compiles rowsum_kernel.cu")
    assert "| bound by rowsum.cpp:20 (pybind11 TORCH_EXTENSION_NAME.rowsum)" in lines
    snippet = done.stdout[done.stdout.index("kfbot.yaml that would get past this step:"):]
    # The repository's own names: the module its test imports, the files that hold the
    # kernel and the binding that reaches it.
    assert "name: rowsum_ext" in snippet
    assert "sources: [rowsum.cpp, rowsum_kernel.cu]" in snippet
    assert [line.split("  ")[0] for line in lines if "  " in line and not
            line.startswith(("|", "tasks", "-", "kernel", "build:", "kind", "name", "sources",
                             "extra", "evidence", "kfbot.yaml"))] == \
        ["pair", "build", "import", "capture", "reference", "comparison"]
    assert lines[-1] == "comparison  skipped  not run: the build step failed"
    assert "kfbot: error" not in done.stderr


def test_a_kernel_no_binding_reaches_fails_at_the_pair_step(tmp_path: Path) -> None:
    root = tmp_path / "repo"
    shutil.copytree(FIXTURES / "setup_rowsum", root)
    (root / "rowsum.cpp").write_text("// the bindings moved elsewhere\n")
    done = _explain(root, "rowsum_kernel", tmp_path / "cache")
    assert done.returncode == 1, done.stderr
    lines = [line.strip() for line in done.stdout.splitlines()]
    assert lines[0].startswith("pair  FAILED  no Python binding reaches the kernel: it is "
                               "launched from launch_rowsum")
    assert any(line.startswith("| rowsum_kernel.cu:") and "launched in launch_rowsum" in line
               for line in lines)
    assert lines[-5:] == ["build  skipped  not run: the pair step failed (the build: setup_py "
                          "rowsum_ext (setup.py:8))",
                          *(f"{step}  skipped  not run: the pair step failed"
                            for step in ("import", "capture", "reference", "comparison"))]
    # Without --explain: the same failure in one line, and how to see the rest.
    plain = subprocess.run([sys.executable, "-m", "kfbot", "verify", "rowsum_kernel", "--repo",
                            str(root)], capture_output=True, text=True, timeout=300,
                           env={**os.environ, "KFBOT_CACHE": str(tmp_path / "cache")})
    assert plain.returncode == 1
    assert "no Python binding reaches this kernel" in plain.stderr


def _hashes(root: Path) -> dict[str, str]:
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(root.rglob("*")) if p.is_file() and ".git" not in p.parts}
