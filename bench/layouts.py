"""The repository layouts bench/eval_throughput.py measures, and 32 candidates for each.

Each layout is a fixture shaped like a family of real repositories:

- kernel-file: the kernel in a `.cu` of its own without torch headers, a bindings
  `.cpp` beside it (fixtures/load_elementwise): the cheap case;
- torch-files: each kernel in its own `.cu` with the torch headers and the torch
  function that launches it (fixtures/torch_files_ops): the common case;
- one-unit: one translation unit including the torch headers and every kernel's header
  (fixtures/one_unit_ops): every candidate recompiles the torch headers unless split.

The candidates change what search candidates change: launch configuration where the
launch is the kernel's own (the one-unit layout's launchers need no torch), `__restrict__`,
`#pragma unroll`, `__launch_bounds__`, a reciprocal instead of a division. Each one
computes the same function, so each is verified like any candidate.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from kfbot.evaluate.candidate import Candidate

ROOT = Path(__file__).resolve().parents[1]
FIXTURES = ROOT / "fixtures"


@dataclass(frozen=True)
class Layout:
    name: str
    fixture: Path
    kernel: str
    file: str  # the file the candidates edit
    variants: Callable[[str], list[tuple[str, str]]]  # original text -> (label, text)

    def candidates(self, count: int) -> list[Candidate]:
        text = (self.fixture / self.file).read_text()
        return [Candidate(files={self.file: new}, origin="rules", rationale=label)
                for label, new in self.variants(text)[:count]]


def _edit(text: str, old: str, new: str) -> str:
    assert old in text, old
    return text.replace(old, new)


def _kernel_file(text: str) -> list[tuple[str, str]]:
    out = []
    for restrict, block in itertools.product((False, True), (32, 64, 96, 128, 160, 192, 224,
                                                             256, 320, 384, 448, 512, 640,
                                                             768, 896, 1024)):
        new = _edit(text, "constexpr int kBlockSize = 128;", f"constexpr int kBlockSize = {block};")
        if restrict:
            new = _edit(new, "(const float* x, float* y, int64_t n) {",
                        "(const float* __restrict__ x, float* __restrict__ y, int64_t n) {")
        out.append((f"block {block}{' restrict' if restrict else ''}", new))
    return out


def _one_unit(text: str) -> list[tuple[str, str]]:
    """Row softmax, one thread per row: the launcher's block size, restrict, reciprocal."""
    out = []
    for threads, restrict, reciprocal in itertools.product(
            (32, 64, 96, 128, 192, 256, 512, 1024), (False, True), (False, True)):
        new = _edit(text, "const int threads = 128;", f"const int threads = {threads};")
        if restrict:
            new = _edit(new, "(const float* x, float* y, int rows, int cols)",
                        "(const float* __restrict__ x, float* __restrict__ y, int rows, "
                        "int cols)")
        if reciprocal:
            new = _edit(new, "for (int j = 0; j < cols; ++j) out[j] = expf(in[j] - peak) / "
                        "total;", "const float inv = 1.0f / total;\n    for (int j = 0; j < "
                        "cols; ++j) out[j] = expf(in[j] - peak) * inv;")
        label = f"threads {threads}" + " restrict" * restrict + " reciprocal" * reciprocal
        out.append((label, new))
    return out


_LOOP = "for (int j = threadIdx.x; j < cols; j += blockDim.x)"


def _torch_files(text: str) -> list[tuple[str, str]]:
    """Row softmax, a block per row: unrolling, restrict, reciprocal, launch bounds (the
    block size is the torch launcher's, in the host part)."""
    out = []
    for unroll, restrict, reciprocal, bounds in itertools.product(
            (0, 2, 4, 8), (False, True), (False, True), (False, True)):
        new = text
        if unroll:
            new = new.replace(_LOOP, f"\n#pragma unroll {unroll}\n    {_LOOP}")
        if restrict:
            new = _edit(new, "(const float* x, float* y, int cols)",
                        "(const float* __restrict__ x, float* __restrict__ y, int cols)")
        if reciprocal:
            new = _edit(new, "out[j] = expf(in[j] - peak) / total;",
                        "out[j] = expf(in[j] - peak) * inv;")
            new = _edit(new, "total = block_reduce(total, scratch, false);",
                        "total = block_reduce(total, scratch, false);\n    const float inv = "
                        "1.0f / total;")
        if bounds:
            new = _edit(new, "__global__ void softmax_kernel(",
                        "__global__ void __launch_bounds__(kThreads) softmax_kernel(")
        label = (f"unroll {unroll or 1}" + " restrict" * restrict + " reciprocal" * reciprocal
                 + " bounds" * bounds)
        out.append((label, new))
    return out


LAYOUTS = {
    "kernel-file": Layout("kernel-file", FIXTURES / "load_elementwise", "gelu_kernel",
                          "csrc/gelu_kernel.cu", _kernel_file),
    "torch-files": Layout("torch-files", FIXTURES / "torch_files_ops", "softmax_kernel",
                          "csrc/softmax.cu", _torch_files),
    "one-unit": Layout("one-unit", FIXTURES / "one_unit_ops", "naive_softmax_kernel",
                       "csrc/kernels/softmax.cuh", _one_unit),
}
