"""The Hugging Face kernel builder's build.toml is a build recipe kind of its own."""

from __future__ import annotations

from pathlib import Path

from kfbot.config import Config
from kfbot.evaluate.task import make_task
from kfbot.scan.build_toml import read_build_toml
from kfbot.scan.scanner import scan
from kfbot.scan.select import select_kernel

FIXTURE = Path(__file__).resolve().parents[2] / "fixtures" / "kernel_builder"

TOML = b"""\
[general]
name = "my-ops"
backends = ["cuda", "metal"]
colour = "blue"

[torch]
src = ["torch-ext/torch_binding.cpp", "torch-ext/torch_binding.h"]

[kernel.fast]
backend = "cuda"
depends = ["torch", "cutlass_3_6"]
cuda-capabilities = ["9.0"]
cuda-flags = ["-DFAST=1", "--use_fast_math"]
src = ["csrc/fast.cu", "csrc/common.h"]
stream = "no"

[kernel.slow]
backend = "cuda"
depends = ["torch"]
src = ["csrc/slow.cu"]

[kernel.metal]
backend = "metal"
src = ["metal/ops.mm"]
"""


def test_cuda_sections_make_one_recipe() -> None:
    facts = read_build_toml("sub/build.toml", TOML)
    (build,) = facts.builds
    assert (build.kind, build.name, build.file, build.line) == (
        "kernel_builder", "my_ops", "sub/build.toml", 9)
    assert build.sources == ("sub/torch-ext/torch_binding.cpp", "sub/csrc/fast.cu",
                             "sub/csrc/slow.cu")  # headers are not compiled; metal is not read
    assert build.extra_cuda_cflags == ("-DFAST=1", "--use_fast_math")
    assert build.defines == (("FAST", "1"),)
    assert (build.capabilities, build.depends) == (("9.0",), ("torch", "cutlass_3_6"))
    assert build.package_dir == "sub/torch-ext/my_ops"
    assert build.cannot_tell and "cuda-flags differ" in build.cannot_tell[0]


def test_unknown_keys_and_broken_files_are_warnings_with_lines() -> None:
    problems = {(p.line, p.message) for p in read_build_toml("build.toml", TOML).problems}
    assert problems == {
        (4, "build.toml: unknown key [general] `colour` (the kernel builder would reject it); "
            "ignored"),
        (15, "build.toml: unknown key [kernel.fast] `stream` (the kernel builder would reject "
             "it); ignored")}
    broken = read_build_toml("build.toml", b"[general]\nname = \n")
    (problem,) = broken.problems
    assert broken.builds == () and problem.line == 2 and "cannot be read" in problem.message


def test_kernel_builder_fixture(tmp_path: Path) -> None:
    report = scan(FIXTURE, Config())
    kernel = select_kernel(report.kernels, "rms_norm_kernel")
    (build,) = kernel.builds
    assert (build.kind, build.name, build.sources) == (
        "kernel_builder", "kb_norm", ("torch-ext/torch_binding.cpp", "kb_norm/rms_norm.cu",
                                      "kb_norm/fused_add_rms_norm.cu", "kb_norm/norm_torch.cpp"))
    assert build.extra_cuda_cflags == ("-DKB_NORM_THREADS=256",)
    assert [(b.kind, b.module, b.name) for b in kernel.bindings] == [
        ("torch_library", "kb_norm", "rms_norm"), ("torch_library_impl", "kb_norm", "rms_norm")]
    assert [(r.file, r.line, r.test) for r in kernel.references] == [
        ("tests/test_rms_norm.py", 18, "test_rms_norm"),
        ("tests/test_rms_norm.py", 27, "test_rms_norm_layer")]
    assert kernel.references[0].chain[1].name == "kb_norm.rms_norm"  # torch-ext/kb_norm
    # Verification builds it: the op's namespace is whatever the build defines
    # TORCH_EXTENSION_NAME as (kfbot.evaluate.build.layouts.kernel_builder).
    task = make_task(kernel, FIXTURE, Config())
    assert (task.op.kind, task.op.module, task.op.name) == (
        "torch_op", "TORCH_EXTENSION_NAME", "rms_norm")


def test_the_kernels_benchmark_framework_is_a_reference(tmp_path: Path) -> None:
    """kernels-community repositories often test only through `kernels.benchmark`:
    `benchmark_<case>` runs `self.kernel.<op>`, `verify_<case>` returns the reference."""
    files = {
        "build.toml": '[general]\nname = "wkv"\nbackends = ["cuda"]\n[torch]\n'
                      'src = ["torch-ext/torch_binding.cpp"]\n[kernel.wkv]\nbackend = "cuda"\n'
                      'depends = ["torch"]\nsrc = ["wkv/wkv.cu"]\n',
        "wkv/wkv.cu": "__global__ void wkv_kernel(float* y) {}\n"
                      "void wkv_forward(float* y) { wkv_kernel<<<1, 1>>>(y); }\n",
        "torch-ext/torch_binding.cpp": "TORCH_LIBRARY_EXPAND(TORCH_EXTENSION_NAME, ops) {\n"
                                       '  ops.def("forward(Tensor! y) -> ()");\n'
                                       '  ops.impl("forward", torch::kCUDA, &wkv_forward);\n}\n',
        "torch-ext/wkv/__init__.py": "from ._ops import ops\n\n"
                                     "def forward(y):\n    ops.forward(y)\n",
        "benchmarks/benchmark.py": """\
import torch
from kernels.benchmark import Benchmark

def wkv_reference(y):
    return torch.zeros_like(y)

class WkvBenchmark(Benchmark):
    def setup(self):
        self.out = torch.ones(8)
    def benchmark_base(self):
        self.kernel.forward(self.out)
    def verify_base(self):
        return wkv_reference(self.out)
""",
    }
    for rel, text in files.items():
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text(text)
    (kernel,) = scan(tmp_path, Config()).kernels
    (ref,) = kernel.references
    assert (ref.file, ref.line, ref.test, ref.kind, ref.reference) == (
        "benchmarks/benchmark.py", 11, "WkvBenchmark.benchmark_base", "script",
        "wkv_reference(self.out)")
    assert ref.comparison == "kernels.benchmark (WkvBenchmark.verify_base)"
    assert [s.name for s in ref.chain[1:3]] == ["wkv.forward", "wkv.forward -> wkv_forward"]
