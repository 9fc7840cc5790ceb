"""What a candidate may change (kfbot/evaluate/scope.py): its kernel, the device functions
only it calls and the host code that launches it; anything another kernel uses is
rejected with what changed and where. The rules mutator on a two-kernel file touches
only its target."""

from __future__ import annotations

import pytest

from kfbot.evaluate.candidate import ORIGINAL
from kfbot.evaluate.scope import definitions, in_scope, out_of_scope
from kfbot.search.rewrites import propose_rewrites

SOURCE = """#include <cuda_runtime.h>
#define SCALE 2.0f
#define ROWS_PER_BLOCK 128

__device__ float square(float v) { return v * v; }
__device__ float twice(float v) { return SCALE * v; }
__device__ float both(float v) { return square(v) + twice(v); }

__global__ void row_sum_kernel(const float* x, float* out, int rows, int cols) {
    int row = blockIdx.x * blockDim.x + threadIdx.x;
    if (row >= rows) return;
    float s = 0.0f;
    for (int j = 0; j < cols; ++j) s += both(x[row * cols + j]);
    out[row] = s;
}

__global__ void scale_kernel(const float* x, float* y, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) {
        y[i] = twice(x[i]);
    }
}

void launch_all(const float* x, float* out, float* y, int rows, int cols) {
    row_sum_kernel<<<(rows + ROWS_PER_BLOCK - 1) / ROWS_PER_BLOCK, ROWS_PER_BLOCK>>>(
        x, out, rows, cols);
    scale_kernel<<<(rows * cols + 255) / 256, 256>>>(x, y, rows * cols);
}
"""


def findings(new: str, kernel: str = "row_sum_kernel") -> list[str]:
    before = definitions([("k.cu", SOURCE)])
    after = definitions([("k.cu", new)])
    return [f.line() for f in out_of_scope(before, after, kernel)]


def test_the_call_graph_decides_what_is_in_scope() -> None:
    defs = definitions([("k.cu", SOURCE)])
    assert defs.kernels == {"row_sum_kernel", "scale_kernel"}
    assert defs.reachable("row_sum_kernel") == {"row_sum_kernel", "both", "square", "twice"}
    assert in_scope(defs, "row_sum_kernel") == {"row_sum_kernel", "both", "square"}
    assert in_scope(defs, "scale_kernel") == {"scale_kernel"}  # twice is shared


@pytest.mark.parametrize(("old", "new"), [
    ("s += both(x[row * cols + j]);", "s += both(x[row * cols + j]) * 1.0f;"),  # the target
    ("return v * v;", "return v * v * 1.0f;"),  # a device function only the target calls
    ("row_sum_kernel<<<(rows + ROWS_PER_BLOCK - 1) / ROWS_PER_BLOCK, ROWS_PER_BLOCK>>>",
     "row_sum_kernel<<<(rows + 7) / 8, 256>>>"),  # its launch, in a shared host function
    ("#define ROWS_PER_BLOCK 128", "#define ROWS_PER_BLOCK 256"),  # only its launch reads it
    ("        y[i] = twice(x[i]);", "        // doubled\n        y[i] = twice( x[i] );"),
    ("void launch_all(", "__device__ float unused(float v) { return v; }\nvoid launch_all("),
])
def test_in_scope(old: str, new: str) -> None:
    changed = SOURCE.replace(old, new, 1)
    assert changed != SOURCE
    assert findings(changed) == []


@pytest.mark.parametrize(("old", "new", "expected"), [
    ("y[i] = twice(x[i]);", "y[i] = 2.0f * x[i];",
     "[edit-scope] changes kernel scale_kernel, which only scale_kernel uses; this task "
     "verifies row_sum_kernel (k.cu:17)"),
    ("return SCALE * v;", "return v + v;",
     "[edit-scope] changes device function twice, which scale_kernel uses too: only "
     "row_sum_kernel is verified, so code it shares with another kernel must stay as it is "
     "(k.cu:6)"),
    ("#define SCALE 2.0f", "#define SCALE 2.5f",
     "[edit-scope] changes definition SCALE, which scale_kernel uses too: only "
     "row_sum_kernel is verified, so code it shares with another kernel must stay as it is "
     "(k.cu:2)"),
    ("scale_kernel<<<(rows * cols + 255) / 256, 256>>>", "scale_kernel<<<1, 256>>>",
     "[edit-scope] changes the launch of scale_kernel, which only scale_kernel uses; this "
     "task verifies row_sum_kernel (k.cu:27)"),
])
def test_out_of_scope(old: str, new: str, expected: str) -> None:
    assert findings(SOURCE.replace(old, new, 1)) == [expected]


def test_a_removed_neighbour_is_out_of_scope() -> None:
    start = SOURCE.index("__global__ void scale_kernel")
    end = SOURCE.index("void launch_all")
    gone = SOURCE[:start] + SOURCE[end:].replace(
        "    scale_kernel<<<(rows * cols + 255) / 256, 256>>>(x, y, rows * cols);\n", "")
    assert "[edit-scope] changes kernel scale_kernel, which only scale_kernel uses; this task " \
           "verifies row_sum_kernel (removed)" in findings(gone)


def test_the_rules_mutator_on_a_two_kernel_file_touches_one() -> None:
    files = {"k.cu": SOURCE}
    for kernel, other in (("row_sum_kernel", "scale_kernel"), ("scale_kernel", "row_sum_kernel")):
        cands = propose_rewrites(files, ["k.cu"], ORIGINAL, kernel)
        assert [c for c in cands if c.files]  # something is proposed for each
        before = definitions([("k.cu", SOURCE)])
        for cand in cands:
            assert findings(cand.files.get("k.cu", SOURCE), kernel) == [], cand.rationale
            after = definitions([("k.cu", cand.files.get("k.cu", SOURCE))])
            new_other = after.functions[other][0][1].text
            assert new_other == before.functions[other][0][1].text, cand.rationale


def test_file_level_constants_belong_to_their_file() -> None:
    # Two .cu files of one build each define kBlock: two constants. A header's constant
    # is one, seen by every file that includes it.
    silu = ("constexpr int kBlock = 128;\n"
            "__global__ void silu_kernel(float* y, int n) {\n"
            "    int i = blockIdx.x * kBlock + threadIdx.x;\n"
            "    if (i < n) y[i] = TILE * y[i];\n}\n")
    gelu = ("__global__ void gelu_kernel(float* y, int n) {\n"
            "    int i = blockIdx.x * blockDim.x + threadIdx.x;\n"
            "    if (i < n) y[i] = TILE * y[i] + 1.0f;\n}\n")
    header = "#define TILE 2\n"
    before = definitions([("silu.cu", silu), ("gelu.cu", gelu), ("common.cuh", header)])
    mine = gelu.replace("__global__", "constexpr int kBlock = 256;\n__global__")
    after = definitions([("silu.cu", silu), ("gelu.cu", mine), ("common.cuh", header)])
    assert out_of_scope(before, after, "gelu_kernel") == []
    shared = definitions([("silu.cu", silu), ("gelu.cu", gelu), ("common.cuh", "#define TILE 4\n")])
    assert [f.line() for f in out_of_scope(before, shared, "gelu_kernel")] == [
        "[edit-scope] changes definition TILE, which silu_kernel uses too: only gelu_kernel "
        "is verified, so code it shares with another kernel must stay as it is "
        "(common.cuh:1)"]
