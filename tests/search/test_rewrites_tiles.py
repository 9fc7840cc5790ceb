"""Matmul register tiling and tiled transpose (kfbot/search/rewrites/matmul.py and
transpose.py): positive and negative shapes, the launches, and nvcc compiles for sm_90."""

from __future__ import annotations

from pathlib import Path

import pytest
from cuda_compile import NVCC, compile_all

from kfbot.search.rewrites.matmul import register_tiling, register_tiling_large
from kfbot.search.rewrites.syntax import Target
from kfbot.search.rewrites.transpose import tiled_transpose

ROOT = Path(__file__).resolve().parents[2]
HEADER = "#include <cstdint>\n#include <cuda_runtime.h>\n"

MATMUL = HEADER + """
// C = alpha * A @ B + bias, one thread per output element.
__global__ void matmul_kernel(const float* A, const float* B, const float* bias, float* C,
                              int M, int N, int K, float alpha) {
    int row = blockIdx.y * blockDim.y + threadIdx.y;
    int col = blockIdx.x * blockDim.x + threadIdx.x;
    if (row < M && col < N) {
        float acc = 0.0f;
        for (int k = 0; k < K; ++k) acc += A[(int64_t)row * K + k] * B[(int64_t)k * N + col];
        C[(int64_t)row * N + col] = alpha * acc + bias[col];
    }
}

void matmul(const float* A, const float* B, const float* bias, float* C, int M, int N, int K,
            float alpha, cudaStream_t stream) {
    dim3 block(16, 16);
    dim3 grid((N + 15) / 16, (M + 15) / 16);
    matmul_kernel<<<grid, block, 0, stream>>>(A, B, bias, C, M, N, K, alpha);
}
"""

# B transposed (its k is contiguous), rows from x, an early return.
MATMUL_NT = HEADER + """
__global__ void mm_nt(const double* A, const double* Bt, double* C, int M, int N, int K) {
    int r = threadIdx.x + blockIdx.x * blockDim.x;
    int c = threadIdx.y + blockIdx.y * blockDim.y;
    if (r >= M || c >= N) return;
    double sum = 0.0;
    for (int k = 0; k < K; k++) {
        sum += Bt[c * K + k] * A[r * K + k];
    }
    C[r * N + c] = sum;
}

void mm(const double* A, const double* Bt, double* C, int M, int N, int K) {
    mm_nt<<<dim3((M + 31) / 32, (N + 7) / 8), dim3(32, 8)>>>(A, Bt, C, M, N, K);
}
"""

TRANSPOSE = HEADER + """
__global__ void transpose_kernel(const float* in, float* out, int rows, int cols, float s) {
    int r = blockIdx.y * blockDim.y + threadIdx.y;
    int c = blockIdx.x * blockDim.x + threadIdx.x;
    if (r < rows && c < cols) {
        out[(int64_t)c * rows + r] = s * in[(int64_t)r * cols + c];
    }
}

void transpose(const float* in, float* out, int rows, int cols, float s) {
    dim3 block(32, 32);
    dim3 grid((cols + 31) / 32, (rows + 31) / 32);
    transpose_kernel<<<grid, block>>>(in, out, rows, cols, s);
}
"""


def test_matmul_register_tiling_keeps_the_users_expressions() -> None:
    out = register_tiling(MATMUL, Target("matmul_kernel"))
    assert out is not None
    assert "__shared__ __align__(16) float kfbot_As[8][68];" in out
    # X and Y evaluated with the user's names bound, zero past the edges
    assert "kfbot_As[kfbot_kk][kfbot_o] = (row < M && k < K) ? " \
           "(float)(A[(int64_t)row * K + k]) : (float)0;" in out
    assert "kfbot_Bs[kfbot_kk][kfbot_o] = (col < N && k < K) ? " \
           "(float)(B[(int64_t)k * N + col]) : (float)0;" in out
    # A's k is contiguous: consecutive threads take consecutive k; B's column
    assert "const int kfbot_kk = kfbot_e % 8, kfbot_o = kfbot_e / 8;" in out
    assert "const int kfbot_o = kfbot_e % 64, kfbot_kk = kfbot_e / 64;" in out
    # a fixed number of loads per thread (unrolled), and up to 255 registers a thread
    assert "for (int kfbot_e0 = 0; kfbot_e0 < 512; kfbot_e0 += 256) {" in out
    assert "__global__ void __launch_bounds__(256) matmul_kernel(" in out
    # a thread's outputs are 4 x 4 neighbours, read from shared memory 16 bytes at a time
    assert "*reinterpret_cast<const float4*>(&kfbot_As[kk][threadIdx.y * 4 + 64 * g]);" in out
    assert "const int row = kfbot_row0 + threadIdx.y * 4 + 64 * (kfbot_i / 4) + " \
           "kfbot_i % 4;" in out
    assert "float acc = kfbot_acc[kfbot_i][kfbot_j];\n" \
           "                C[(int64_t)row * N + col] = alpha * acc + bias[col];" in out
    assert register_tiling(out, Target("matmul_kernel")) is None


def test_small_problems_keep_the_original_kernel() -> None:
    out = register_tiling(MATMUL, Target("matmul_kernel"))
    assert out is not None
    # the original, verbatim but for its name, before the tiled kernel
    original = MATMUL[MATMUL.index("__global__"):MATMUL.index("void matmul(")].strip()
    copy = original.replace("void matmul_kernel(", "void matmul_kernel_small(")
    assert copy in out and out.index(copy) < out.index("__launch_bounds__(256) matmul_kernel(")
    # the launch chooses by the work, in the launcher's own sizes; the small path keeps
    # the launch as written, so its grid and block stay
    assert "const long long kfbot_work = (long long)(M) * (N) * (K);" in out
    assert "if (kfbot_work <= 2097152) {" in out
    assert "matmul_kernel_small<<<grid, block, 0, stream>>>(A, B, bias, C, M, N, K, alpha);" \
        in out
    assert "} else {\n            matmul_kernel<<<dim3((unsigned)((N) + 63) / 64, " \
           "(unsigned)((M) + 63) / 64), dim3(16, 16), 0, stream>>>" in out
    assert "dim3 block(16, 16);" in out and "dim3 grid(" in out


def test_matmul_large_tiles_and_transposed_operands() -> None:
    out = register_tiling_large(MATMUL, Target("matmul_kernel"))
    assert out is not None and "kfbot_As[8][132]" in out and "kfbot_acc[8][8]" in out
    assert "for (int g = 0; g < 2; ++g) {" in out  # two groups of 4, 64 apart
    nt = register_tiling(MATMUL_NT, Target("mm_nt"))
    assert nt is not None
    # X (the row's operand) is A even though the source writes Bt first
    assert "(r < M && k < K) ? (double)(A[r * K + k]) : (double)0;" in nt
    assert "(c < N && k < K) ? (double)(Bt[c * K + k]) : (double)0;" in nt
    assert nt.count("const int kfbot_kk = kfbot_e % 8, kfbot_o = kfbot_e / 8;") == 2
    assert "a[i] = kfbot_As[kk][threadIdx.y * 4 + 64 * (i / 4) + i % 4];" in nt  # no double4
    assert "mm_nt<<<dim3((unsigned)((N) + 63) / 64, (unsigned)((M) + 63) / 64), " \
           "dim3(16, 16)>>>" in nt
    assert "mm_nt_small<<<dim3((M + 31) / 32, (N + 7) / 8), dim3(32, 8)>>>" in nt


@pytest.mark.parametrize(("old", "new"), [
    ("float acc = 0.0f;", "float acc = 1.0f;"),  # a start other than zero
    ("acc += A[(int64_t)row * K + k] * B[(int64_t)k * N + col];",
     "acc += A[(int64_t)row * K + k] * B[(int64_t)k * N + row];"),  # Y reads the row
    ("acc += A[(int64_t)row * K + k] * B[(int64_t)k * N + col];",
     "acc += A[(int64_t)row * K + k] + B[(int64_t)k * N + col];"),
    ("for (int k = 0; k < K; ++k)", "for (int k = 0; k < K; k += 2)"),
    ("if (row < M && col < N) {", "if (row < M) {"),
    ("C[(int64_t)row * N + col] = alpha * acc + bias[col];",
     "C[(int64_t)row * N + col] = alpha * acc + bias[k];"),  # k after the loop
    ("int col = blockIdx.x * blockDim.x + threadIdx.x;", "int col = threadIdx.x;"),
    ("matmul_kernel<<<", "cudaLaunchKernel((void*)matmul_kernel, grid, block, nullptr, 0, "
     "stream);\n    matmul_kernel<<<"),
    # a launch inside an expression cannot become a choice of two launches
    ("    matmul_kernel<<<grid, block, 0, stream>>>(A, B, bias, C, M, N, K, alpha);",
     "    (void)(matmul_kernel<<<grid, block, 0, stream>>>(A, B, bias, C, M, N, K, alpha), 0);"),
    # the copy's name is taken
    ("void matmul(", "__global__ void matmul_kernel_small() {}\n\nvoid matmul("),
])
def test_matmul_negative(old: str, new: str) -> None:
    src = MATMUL.replace(old, new, 1)
    assert src != MATMUL
    assert register_tiling(src, Target("matmul_kernel")) is None


def test_tiled_transpose() -> None:
    out = tiled_transpose(TRANSPOSE, Target("transpose_kernel"))
    assert out is not None
    assert "__shared__ float kfbot_tile[32][33];" in out
    assert "kfbot_tile[kfbot_i][threadIdx.x] = in[(int64_t)r * cols + c];" in out
    assert "out[(int64_t)c * rows + r] = s * kfbot_tile[threadIdx.x][kfbot_i];" in out
    assert "const int c = kfbot_c0 + threadIdx.x;" in out  # the read follows the input
    assert "const int r = kfbot_r0 + threadIdx.x;" in out  # the write follows the output
    assert "transpose_kernel<<<dim3((unsigned)((cols) + 31) / 32, " \
           "(unsigned)((rows) + 31) / 32), dim3(32, 8)>>>" in out
    assert tiled_transpose(out, Target("transpose_kernel")) is None


@pytest.mark.parametrize(("old", "new"), [
    ("out[(int64_t)c * rows + r]", "out[(int64_t)r * cols + c]"),  # a copy: coalesced already
    ("s * in[(int64_t)r * cols + c]", "s * in[(int64_t)r * cols + c] + in[0]"),
    ("s * in[(int64_t)r * cols + c]", "s * r"),
    ("out[(int64_t)c * rows + r] = s", "out[(int64_t)c * rows + r] += s"),
])
def test_tiled_transpose_negative(old: str, new: str) -> None:
    src = TRANSPOSE.replace(old, new, 1)
    assert src != TRANSPOSE
    assert tiled_transpose(src, Target("transpose_kernel")) is None


OUTPUTS = {
    "matmul": register_tiling(MATMUL, Target("matmul_kernel")) or "",
    "matmul-large": register_tiling_large(MATMUL, Target("matmul_kernel")) or "",
    "matmul-nt": register_tiling(MATMUL_NT, Target("mm_nt")) or "",
    "matmul-nt-large": register_tiling_large(MATMUL_NT, Target("mm_nt")) or "",
    "transpose": tiled_transpose(TRANSPOSE, Target("transpose_kernel")) or "",
}


@pytest.fixture(scope="module")
def compiled(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    if NVCC is None:
        pytest.skip("nvcc not on PATH")
    return compile_all(OUTPUTS, tmp_path_factory.mktemp("tiles"), ["-Werror=all-warnings"])


@pytest.mark.parametrize("case", list(OUTPUTS))
def test_tiled_outputs_compile_for_sm90(compiled: dict[str, str], case: str) -> None:
    assert OUTPUTS[case]
    assert compiled[case] == ""
