"""warp-per-row and block-per-row (kfbot/search/rewrites/rows.py): thread-per-row kernels
split across a warp or a block, with their launches; negative shapes left alone; every
output compiled with nvcc for sm_90."""

from __future__ import annotations

from pathlib import Path

import pytest
from cuda_compile import NVCC, compile_all

from kfbot.search.rewrites.rows import block_per_row, warp_per_row
from kfbot.search.rewrites.rowshape import row_kernel
from kfbot.search.rewrites.syntax import Target, kernels_named, parse

ROOT = Path(__file__).resolve().parents[2]
HEADER = "#include <cstdint>\n#include <cuda_runtime.h>\n#include <math.h>\n"
SOFTMAX = (ROOT / "fixtures/example/csrc/softmax.cu").read_text()

LOG_SOFTMAX = HEADER + """
__global__ void log_softmax_kernel(const float* x, float* y, int M, int N) {
    float x_max = -INFINITY;
    float total = 0;
    int row = blockDim.x * blockIdx.x + threadIdx.x;
    if (row < M) {
        for (int i = 0; i < N; i++) {
            int loc = row * N + i;
            x_max = max(x_max, x[loc]);
        }
        for (int i = 0; i < N; i++) {
            int loc = row * N + i;
            total += expf(x[loc] - x_max);
        }
        const float shift = x_max + logf(total);
        for (int i = 0; i < N; i++) {
            int loc = row * N + i;
            y[loc] = x[loc] - shift;
        }
    }
}

void log_softmax(const float* x, float* y, int M, int N, cudaStream_t stream) {
    int threads = 128;
    int blocks = (M + threads - 1) / threads;
    log_softmax_kernel<<<blocks, threads, 0, stream>>>(x, y, M, N);
}
"""

LAYER_NORM = HEADER + """
__global__ void __launch_bounds__(64) layer_norm_kernel(
        const float* x, const float* gamma, const float* beta, float* y, int64_t rows,
        int64_t cols, float eps) {
    const int64_t r = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (r >= rows) return;
    const float* xr = x + r * cols;
    float sum = 0.0f;
    for (int64_t c = 0; c < cols; ++c) sum += xr[c];
    const float mean = sum / cols;
    float var = 0.0f;
    for (int64_t c = 0; c < cols; ++c) {
        const float d = xr[c] - mean;
        var += d * d;
    }
    const float rstd = rsqrtf(var / cols + eps);
    for (int64_t c = 0; c < cols; ++c) y[r * cols + c] = (xr[c] - mean) * rstd * gamma[c] + beta[c];
}

void layer_norm(const float* x, const float* g, const float* b, float* y, int64_t rows,
                int64_t cols, float eps) {
    layer_norm_kernel<<<(rows + 63) / 64, 64>>>(x, g, b, y, rows, cols, eps);
}
"""

ROW_STATS = HEADER + """
#define THREADS 256

// sum, mean and max of each row; the max starts from the row's first element.
__global__ void row_stats_kernel(const float* x, float* sums, float* means, float* maxes,
                                 int rows, int cols) {
    int row = blockIdx.x * THREADS + threadIdx.x;
    if (row >= rows) return;
    float s = 0.0f;
    float m = x[row * cols];
    for (int j = 1; j < cols; ++j) {
        if (x[row * cols + j] > m) m = x[row * cols + j];
    }
    for (int j = 0; j < cols; ++j) s = s + x[row * cols + j];
    sums[row] = s;
    means[row] = s / cols;
    maxes[row] = m;
}

void row_stats(const float* x, float* s, float* mean, float* mx, int rows, int cols) {
    row_stats_kernel<<<(rows + THREADS - 1) / THREADS, THREADS>>>(x, s, mean, mx, rows, cols);
}
"""

IN_PLACE = HEADER + """
__global__ void softmax_inplace(float* A, int rows, int cols) {
    int r = blockIdx.x * blockDim.x + threadIdx.x;
    if (r < rows) {
        float maxVal = A[r * cols];
        for (int i = 1; i < cols; ++i) {
            if (A[r * cols + i] > maxVal) {
                maxVal = A[r * cols + i];
            }
        }
        float denom = 0.0f;
        for (int i = 0; i < cols; ++i) {
            A[r * cols + i] = expf(A[r * cols + i] - maxVal);
            denom += A[r * cols + i];
        }
        for (int i = 0; i < cols; ++i) {
            A[r * cols + i] /= denom;
        }
    }
}

void softmax_inplace_launch(float* A, int rows, int cols) {
    softmax_inplace<<<(rows + 31) / 32, 32>>>(A, rows, cols);
}
"""

TWO_KERNELS = SOFTMAX + """
__global__ void scale_kernel(const float* x, float* y, int64_t n, float a) {
    int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = a * x[i];
}

cudaError_t scale_launch(const float* x, float* y, int64_t n, float a) {
    scale_kernel<<<(unsigned)((n + 255) / 256), 256>>>(x, y, n, a);
    return cudaGetLastError();
}
"""

CASES = {  # name -> (source, kernel)
    "softmax": (SOFTMAX, "softmax_kernel"),
    "log_softmax": (LOG_SOFTMAX, "log_softmax_kernel"),
    "layer_norm": (LAYER_NORM, "layer_norm_kernel"),
    "row_stats": (ROW_STATS, "row_stats_kernel"),
    "in_place": (IN_PLACE, "softmax_inplace"),
    "two_kernels": (TWO_KERNELS, "softmax_kernel"),
}
SPLITS = {"warp": warp_per_row, "block": block_per_row}


def test_softmax_warp_per_row() -> None:
    out = warp_per_row(SOFTMAX, Target("softmax_kernel"))
    assert out is not None
    assert "const int kfbot_lane = threadIdx.x % 32;" in out
    assert "int64_t row = (int64_t)blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32;" in out
    assert "for (int64_t j = kfbot_lane; j < cols; j += 32) m = fmaxf(m, in[j]);\n" \
           "    m = kfbot_warp_max(m);" in out
    assert "for (int64_t j = kfbot_lane; j < cols; j += 32) sum += expf(in[j] - m);\n" \
           "    sum = kfbot_warp_sum(sum);" in out  # declared as 0 just before: no start
    assert "out[j] = expf(in[j] - m) / sum;\n}" in out  # the last loop: no barrier after
    assert "softmax_kernel<<<(unsigned)(((rows) + 7) / 8), 256>>>(x, y, rows, cols);" in out
    assert out.count("__device__ __forceinline__ T kfbot_warp_sum(T v)") == 1
    assert "kfbot_block" not in out


def test_softmax_block_per_row() -> None:
    out = block_per_row(SOFTMAX, Target("softmax_kernel"))
    assert out is not None
    assert "int64_t row = (int64_t)blockIdx.x;" in out
    assert "for (int64_t j = kfbot_tid; j < cols; j += (int)blockDim.x)" in out
    assert "m = kfbot_block_max(m);" in out and "sum = kfbot_block_sum(sum);" in out
    assert "softmax_kernel<<<(unsigned)(rows), 256>>>(x, y, rows, cols);" in out
    assert "__shared__ T partials[32];" in out
    assert "v = lane < (int)((blockDim.x + 31) / 32) ? partials[lane] : T(0);" in out
    assert "v = lane < (int)((blockDim.x + 31) / 32) ? partials[lane] : partials[0];" in out


def test_accumulators_that_do_not_start_at_zero_are_added_back_once() -> None:
    out = warp_per_row(LOG_SOFTMAX.replace("float total = 0;", "float total = 1.0f;"),
                       Target("log_softmax_kernel"))
    assert out is not None
    assert "const auto kfbot_total_start = total;\n        total = 0;\n        for" in out
    assert "total = kfbot_total_start + kfbot_warp_sum(total);" in out


def test_log_softmax_inside_the_guard_with_loop_local_indices() -> None:
    out = warp_per_row(LOG_SOFTMAX, Target("log_softmax_kernel"))
    assert out is not None
    assert "for (int i = kfbot_lane; i < N; i += 32) {" in out
    assert "x_max = kfbot_warp_max(x_max);" in out and "kfbot_warp_sum(total)" in out
    assert "int row = (int)blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32;" in out
    # the grid and block variables only that launch read are gone with it
    assert "int threads = 128;" not in out and "int blocks =" not in out
    assert "log_softmax_kernel<<<(unsigned)(((M) + 7) / 8), 256, 0, stream>>>" in out


def test_layer_norm_replaces_launch_bounds() -> None:
    for split in SPLITS.values():
        out = split(LAYER_NORM, Target("layer_norm_kernel"))
        assert out is not None
        assert "__launch_bounds__(256) layer_norm_kernel" in out
        assert "__launch_bounds__(64)" not in out
    out = warp_per_row(LAYER_NORM, Target("layer_norm_kernel"))
    assert out is not None and "var = kfbot_warp_sum(var);" in out


def test_single_writes_are_done_by_one_thread() -> None:
    out = block_per_row(ROW_STATS, Target("row_stats_kernel"))
    assert out is not None
    assert "if (kfbot_tid == 0) sums[row] = s;" in out
    assert "if (kfbot_tid == 0) maxes[row] = m;" in out
    assert "for (int j = (1) + kfbot_tid; j < cols; j += (int)blockDim.x) {" in out
    assert "m = kfbot_block_max(m);" in out
    assert "s = kfbot_s_start + kfbot_block_sum(s);" in out  # m's loop sits between
    assert "row_stats_kernel<<<(unsigned)(rows), 256>>>" in out
    kernel = out[out.index("__global__ void row_stats_kernel"):]
    assert "__syncthreads();" not in kernel  # thread 0 alone writes, in order


def test_in_place_softmax_gets_a_barrier_between_writing_and_reading_loops() -> None:
    out = warp_per_row(IN_PLACE, Target("softmax_inplace"))
    assert out is not None
    assert "denom = kfbot_warp_sum(denom);" in out  # the shuffle orders the two loops
    assert "maxVal = kfbot_warp_max(maxVal);" in out
    out = warp_per_row(IN_PLACE.replace("            denom += A[r * cols + i];\n", ""),
                       Target("softmax_inplace"))
    assert out is not None and out.count("__syncwarp();") == 1  # write loop, then a read


def test_only_the_target_kernel_and_its_launch_change() -> None:
    for split in SPLITS.values():
        out = split(TWO_KERNELS, Target("softmax_kernel"))
        assert out is not None
        tail = TWO_KERNELS[TWO_KERNELS.index("__global__ void scale_kernel"):]
        assert out.endswith(tail)
        assert split(TWO_KERNELS, Target("scale_kernel")) is None  # not a row kernel


def test_idempotent_and_shapes_recognised() -> None:
    for name, (source, kernel) in CASES.items():
        [fn] = kernels_named(parse(source), kernel)
        assert row_kernel(fn) is not None, name
        for split in SPLITS.values():
            once = split(source, Target(kernel))
            assert once is not None, name
            assert split(once, Target(kernel)) is None, name
            assert warp_per_row(once, Target(kernel)) is None, name


@pytest.mark.parametrize(("old", "new"), [
    ("for (int64_t j = 0; j < cols; ++j) sum += expf(in[j] - m);",
     "for (int64_t j = 0; j < cols; ++j) { out[j] = sum; sum += expf(in[j] - m); }"),
    ("out[j] = expf(in[j] - m) / sum;", "out[j] = out[j - 1] + in[j];"),  # loop-carried
    ("out[j] = expf(in[j] - m) / sum;", "out[0] = in[j];"),  # one element, every iteration
    ("out[j] = expf(in[j] - m) / sum;",
     "for (int k = 0; k < 2; ++k) out[j] = in[j];"),  # a nested loop
    ("out[j] = expf(in[j] - m) / sum;", "{ if (in[j] > 9.0f) break; out[j] = in[j]; }"),
    ("out[j] = expf(in[j] - m) / sum;", "out[j] = threadIdx.x;"),
    ("float sum = 0.0f;", "float sum = 0.0f; __syncthreads();"),
    ("float sum = 0.0f;", "float sum = 0.0f; row += 1;"),
    ("for (int64_t j = 0; j < cols; ++j) m = fmaxf(m, in[j]);",
     "for (int64_t j = 0; j < cols; j += 2) m = fmaxf(m, in[j]);"),
    ("for (int64_t j = 0; j < cols; ++j) m = fmaxf(m, in[j]);",
     "for (int64_t j = 0; j < cols; ++j) { m = fmaxf(m, in[j]); m = fminf(m, 1.0f); }"),
    ("if (row >= rows) return;", ""),  # no guard
    ("if (row >= rows) return;", "if (row >= rows) return; if (cols == 0) return;"),
    ("int64_t row = (int64_t)blockIdx.x * BLOCK + threadIdx.x;", "int64_t row = blockIdx.x;"),
    ("softmax_kernel<<<", "void* kfbot_ptr = (void*)softmax_kernel;\n    softmax_kernel<<<"),
    ("softmax_kernel<<<", "softmax_kernel<<<1, 1>>>(x, y, rows++, cols);\n    softmax_kernel<<<"),
    ("cudaError_t softmax_launch(",
     "#define LAUNCH(g) softmax_kernel<<<g, BLOCK>>>(x, y, rows, cols)\n"
     "cudaError_t softmax_launch("),
])
def test_not_a_thread_per_row_kernel(old: str, new: str) -> None:
    src = SOFTMAX.replace(old, new, 1)
    assert src != SOFTMAX
    for split in SPLITS.values():
        assert split(src, Target("softmax_kernel")) is None


def test_a_launch_in_another_file_or_none_at_all_stops_it() -> None:
    for split in SPLITS.values():
        assert split(SOFTMAX, Target("softmax_kernel", launched_elsewhere=True)) is None
        no_launch = SOFTMAX[:SOFTMAX.index("cudaError_t softmax_launch")]
        assert split(no_launch, Target("softmax_kernel")) is None


def _outputs() -> dict[str, str]:
    out = {}
    for name, (source, kernel) in CASES.items():
        for split_name, split in SPLITS.items():
            new = split(source, Target(kernel))
            assert new is not None, name
            out[f"{name}-{split_name}"] = new
    return out


OUTPUTS = _outputs()


@pytest.fixture(scope="module")
def compiled(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    if NVCC is None:
        pytest.skip("nvcc not on PATH")
    return compile_all(OUTPUTS, tmp_path_factory.mktemp("rows"), ["-Werror=all-warnings"])


@pytest.mark.parametrize("case", list(OUTPUTS))
def test_rewritten_rows_compile_for_sm90(compiled: dict[str, str], case: str) -> None:
    assert compiled[case] == ""
