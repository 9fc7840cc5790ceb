"""Matmul register tiling and tiled transpose (kfbot/search/rewrites/matmul.py and
transpose.py): positive and negative shapes, the launches, and nvcc compiles for sm_90."""

from __future__ import annotations

from pathlib import Path

import pytest
from cuda_compile import NVCC, compile_all

from kfbot.search.rewrites.matmul import register_tiling, register_tiling_large
from kfbot.search.rewrites.syntax import Target
from kfbot.search.rewrites.transpose import tiled_transpose

ROOT = Path(__file__).resolve().parents[1]
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
    assert "__shared__ float kfbot_As[16][65];" in out
    # X and Y evaluated with the user's names bound, zero past the edges
    assert "kfbot_As[kfbot_kk][kfbot_o] = (row < M && k < K) ? " \
           "(float)(A[(int64_t)row * K + k]) : (float)0;" in out
    assert "kfbot_Bs[kfbot_kk][kfbot_o] = (col < N && k < K) ? " \
           "(float)(B[(int64_t)k * N + col]) : (float)0;" in out
    # A's k is contiguous: consecutive threads take consecutive k; B's column
    assert "const int kfbot_kk = kfbot_e % 16, kfbot_o = kfbot_e / 16;" in out
    assert "const int kfbot_o = kfbot_e % 64, kfbot_kk = kfbot_e / 64;" in out
    assert "float acc = kfbot_acc[kfbot_i][kfbot_j];\n" \
           "                C[(int64_t)row * N + col] = alpha * acc + bias[col];" in out
    assert "matmul_kernel<<<dim3((unsigned)((N) + 63) / 64, (unsigned)((M) + 63) / 64), " \
           "dim3(16, 16), 0, stream>>>" in out
    assert "dim3 block(16, 16);" not in out and "dim3 grid(" not in out
    assert register_tiling(out, Target("matmul_kernel")) is None


def test_matmul_large_tiles_and_transposed_operands() -> None:
    out = register_tiling_large(MATMUL, Target("matmul_kernel"))
    assert out is not None and "kfbot_As[8][129]" in out and "kfbot_acc[8][8]" in out
    nt = register_tiling(MATMUL_NT, Target("mm_nt"))
    assert nt is not None
    # X (the row's operand) is A even though the source writes Bt first
    assert "(r < M && k < K) ? (double)(A[r * K + k]) : (double)0;" in nt
    assert "(c < N && k < K) ? (double)(Bt[c * K + k]) : (double)0;" in nt
    assert nt.count("const int kfbot_kk = kfbot_e % 16, kfbot_o = kfbot_e / 16;") == 2
    assert "mm_nt<<<dim3((unsigned)((N) + 63) / 64, (unsigned)((M) + 63) / 64), " \
           "dim3(16, 16)>>>" in nt


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
