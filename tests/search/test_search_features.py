"""Behaviour cells read off small, realistic CUDA kernels."""

from __future__ import annotations

import pytest

from kfbot.search.evolution.features import cell_of
from kfbot.search.model import Cell

ELEMENTWISE = """\
#include <torch/extension.h>
__global__ void relu(const float* __restrict__ x, float* __restrict__ y, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) y[i] = fmaxf(x[i], 0.0f);
}
torch::Tensor run(torch::Tensor x) {
  auto y = torch::empty_like(x);
  int n = x.numel();
  relu<<<(n + 255) / 256, 256>>>(x.data_ptr<float>(), y.data_ptr<float>(), n);
  return y;
}
"""

GRID_STRIDE = """\
__global__ void scale(const float* x, float* y, float a, size_t n) {
  size_t stride = (size_t)gridDim.x * blockDim.x;
  for (size_t i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) {
    y[i] = a * x[i];
  }
}
"""

GRID_STRIDE_INLINE = """\
__global__ void add(const float* x, float* y, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  while (i < n) { y[i] += x[i]; i += blockDim.x * gridDim.x; }
}
"""

VECTORIZED = """\
__global__ void copy4(const float* __restrict__ x, float* __restrict__ y, int n4) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n4) {
    float4 v = reinterpret_cast<const float4*>(x)[i];
    v.x *= 2.f; v.y *= 2.f; v.z *= 2.f; v.w *= 2.f;
    reinterpret_cast<float4*>(y)[i] = v;
  }
}
"""

TILED_MATMUL = """\
#define TILE 16
__global__ void matmul(const float* A, const float* B, float* C, int N) {
  __shared__ float As[TILE][TILE];
  __shared__ float Bs[TILE][TILE];
  int row = blockIdx.y * TILE + threadIdx.y;
  int col = blockIdx.x * TILE + threadIdx.x;
  float acc = 0.f;
  for (int t = 0; t < N / TILE; ++t) {
    As[threadIdx.y][threadIdx.x] = A[row * N + t * TILE + threadIdx.x];
    Bs[threadIdx.y][threadIdx.x] = B[(t * TILE + threadIdx.y) * N + col];
    __syncthreads();
    #pragma unroll
    for (int k = 0; k < TILE; ++k) acc += As[threadIdx.y][k] * Bs[k][threadIdx.x];
    __syncthreads();
  }
  C[row * N + col] = acc;
}
"""

WARP_SOFTMAX = """\
__device__ __forceinline__ float warp_max(float v) {
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffff, v, o));
  return v;
}
__device__ __forceinline__ float warp_sum(float v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffff, v, o);
  return v;
}
__global__ void softmax(const float* x, float* y, int rows, int cols) {
  int warp = threadIdx.x / 32;
  int lane = threadIdx.x % 32;
  int row = blockIdx.x * (blockDim.x / 32) + warp;
  if (row >= rows) return;
  const float* xr = x + (size_t)row * cols;
  float m = -INFINITY;
  for (int c = lane; c < cols; c += 32) m = fmaxf(m, xr[c]);
  m = warp_max(m);
  float s = 0.f;
  for (int c = lane; c < cols; c += 32) s += __expf(xr[c] - m);
  s = warp_sum(s);
  for (int c = lane; c < cols; c += 32) y[(size_t)row * cols + c] = __expf(xr[c] - m) / s;
}
"""

BLOCK_SOFTMAX = """\
__global__ void __launch_bounds__(512) softmax(const float* x, float* y, int cols) {
  extern __shared__ float red[];
  const int row = blockIdx.x;
  const float* xr = x + row * cols;
  float m = -INFINITY;
  for (int c = threadIdx.x; c < cols; c += blockDim.x) m = fmaxf(m, xr[c]);
  red[threadIdx.x] = m;
  __syncthreads();
  for (int s = blockDim.x / 2; s > 0; s >>= 1) {
    if (threadIdx.x < s) red[threadIdx.x] = fmaxf(red[threadIdx.x], red[threadIdx.x + s]);
    __syncthreads();
  }
  m = red[0];
  for (int c = threadIdx.x; c < cols; c += blockDim.x) y[row * cols + c] = __expf(xr[c] - m);
}
"""

HISTOGRAM = """\
__global__ void hist(const int* x, unsigned int* bins, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) atomicAdd(&bins[x[i]], 1u);
}
"""

WMMA = """\
#include <mma.h>
using namespace nvcuda;
__global__ void gemm(const half* a, const half* b, float* c, int M, int N, int K) {
  int warpM = (blockIdx.x * blockDim.x + threadIdx.x) / warpSize;
  int warpN = blockIdx.y * blockDim.y + threadIdx.y;
  wmma::fragment<wmma::matrix_a, 16, 16, 16, half, wmma::row_major> fa;
  wmma::fragment<wmma::matrix_b, 16, 16, 16, half, wmma::col_major> fb;
  wmma::fragment<wmma::accumulator, 16, 16, 16, float> acc;
  wmma::fill_fragment(acc, 0.0f);
  for (int k = 0; k < K; k += 16) {
    wmma::load_matrix_sync(fa, a + warpM * 16 * K + k, K);
    wmma::load_matrix_sync(fb, b + warpN * 16 * K + k, K);
    wmma::mma_sync(acc, fa, fb, acc);
  }
  wmma::store_matrix_sync(c + warpM * 16 * N + warpN * 16, acc, N, wmma::mem_row_major);
}
"""


@pytest.mark.parametrize(("source", "expected"), [
    (ELEMENTWISE, Cell("global", "none", "thread-per-element", "?")),
    (GRID_STRIDE, Cell("global", "none", "grid-stride", "?")),
    (GRID_STRIDE_INLINE, Cell("global", "none", "grid-stride", "?")),
    (VECTORIZED, Cell("vectorized", "none", "thread-per-element", "?")),
    (TILED_MATMUL, Cell("shared-tiling", "barriers", "block-per-tile", "?")),
    (WARP_SOFTMAX, Cell("global", "warp-shuffle", "warp-per-row", "?")),
    (BLOCK_SOFTMAX, Cell("shared-tiling", "barriers", "block-per-row", "512")),
    (HISTOGRAM, Cell("global", "atomics", "thread-per-element", "?")),
    (WMMA, Cell("tensor-core", "none", "warp-per-row", "?")),
], ids=["elementwise", "grid-stride", "grid-stride-while", "float4", "tiled-matmul",
        "warp-softmax", "block-softmax", "histogram", "wmma"])
def test_kernel_cells(source: str, expected: Cell) -> None:
    assert cell_of([source]) == expected


def test_empty_candidate() -> None:
    assert cell_of([]) == Cell("global", "none", "other", "?")
    assert cell_of([""]) == Cell("global", "none", "other", "?")


@pytest.mark.parametrize(("size", "bucket"), [
    (32, "<=64"), (64, "<=64"), (65, "128"), (128, "128"), (192, "256"), (256, "256"),
    (512, "512"), (1024, "1024"), (2048, "?"), (0, "?"),
])
def test_block_bucket_from_argument(size: int, bucket: str) -> None:
    assert cell_of([ELEMENTWISE], block_size=size).block == bucket


def test_block_argument_wins_over_launch_bounds() -> None:
    assert cell_of([BLOCK_SOFTMAX], block_size=128).block == "128"


@pytest.mark.parametrize(("bounds", "bucket"), [
    ("__launch_bounds__(256, 2)", "256"), ("__launch_bounds__(64)", "<=64"),
    ("__launch_bounds__(1024u)", "1024"), ("__launch_bounds__(BLOCK)", "?"), ("", "?"),
])
def test_block_bucket_from_launch_bounds(bounds: str, bucket: str) -> None:
    source = f"__global__ void {bounds} k(float* y) {{ y[threadIdx.x] = 0.f; }}"
    assert cell_of([source]).block == bucket


def test_launch_bounds_of_the_first_kernel_only() -> None:
    first = "__global__ void a(float* y) { y[0] = 1.f; }"
    second = "__global__ void __launch_bounds__(128) b(float* y) { y[0] = 2.f; }"
    assert cell_of([first, second]).block == "?"
    assert cell_of([second, first]).block == "128"


def test_shuffle_in_comment_or_string_does_not_count() -> None:
    source = """\
__global__ void k(const float* x, float* y, int n) {
  // a faster version would use __shfl_xor_sync(0xffffffff, v, 16) here
  /* atomicAdd(&y[0], v); __syncthreads(); */
  const char* note = "__shfl_xor_sync and atomicAdd";
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) y[i] = x[i];
}
"""
    assert cell_of([source]) == Cell("global", "none", "thread-per-element", "?")


def test_host_code_does_not_count() -> None:
    host = """\
#include <vector>
void accumulate(std::vector<float>& v) {
  // like atomicAdd, but on the host
  float4 unused;
  for (size_t i = 0; i < v.size(); i += 1) v[i] += 1.f;
  __syncthreads_emulation();
}
"""
    assert cell_of([host]) == Cell("global", "none", "other", "?")


def test_features_from_all_sources_count() -> None:
    helpers = """\
__device__ float block_sum(float v) {
  v += __shfl_down_sync(0xffffffff, v, 16);
  return v;
}
"""
    assert cell_of([ELEMENTWISE, helpers]).sync == "warp-shuffle"


def test_cooperative_groups_calls() -> None:
    source = """\
#include <cooperative_groups.h>
#include <cooperative_groups/reduce.h>
namespace cg = cooperative_groups;
__global__ void k(const float* x, float* y) {
  auto block = cg::this_thread_block();
  cg::sync(block);
  auto tile = cg::tiled_partition<32>(block);
  y[blockIdx.x] = cg::reduce(tile, x[threadIdx.x], cg::plus<float>());
}
"""
    assert cell_of([source]).sync == "warp-shuffle"
    assert cell_of([source]).decomposition == "block-per-row"
    assert cell_of([source.replace("cg::reduce", "my_reduce")]).sync == "barriers"


def test_shared_memory_without_loop_is_not_tiling() -> None:
    source = """\
__global__ void k(const float* x, float* y) {
  __shared__ float s[256];
  s[threadIdx.x] = x[blockIdx.x * blockDim.x + threadIdx.x];
  __syncthreads();
  y[blockIdx.x * blockDim.x + threadIdx.x] = s[255 - threadIdx.x];
}
"""
    assert cell_of([source]).memory == "global"


def test_shared_memory_through_a_pointer_in_a_loop() -> None:
    source = """\
__global__ void k(const float* x, float* y, int n) {
  extern __shared__ unsigned char raw[];
  float* buf = reinterpret_cast<float*>(raw);
  for (int i = threadIdx.x; i < n; i += blockDim.x) buf[i] = x[i];
}
"""
    assert cell_of([source]).memory == "shared-tiling"


def test_inline_asm_mma_is_tensor_core() -> None:
    source = """\
__device__ void mma(unsigned* d, const unsigned* a, const unsigned* b) {
  asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, ...;"
               : "=r"(d[0]), "=r"(d[1]), "=r"(d[2]), "=r"(d[3]) : "r"(a[0]), "r"(b[0]));
}
"""
    assert cell_of([source]).memory == "tensor-core"


def test_precedence_between_signs() -> None:
    source = """\
__global__ void k(const float* x, float* y, int n) {
  __shared__ float s[32];
  int stride = blockDim.x * gridDim.x;
  for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) {
    float v = __shfl_down_sync(0xffffffff, x[i], 1);
    s[threadIdx.x % 32] = v;
    __syncthreads();
    atomicAdd(&y[0], s[0]);
    float4 unused;
  }
}
"""
    assert cell_of([source]) == Cell("shared-tiling", "warp-shuffle", "grid-stride", "?")


def test_block_per_row_with_warp_level_reduction_stays_block_per_row() -> None:
    source = """\
__global__ void rownorm(const float* x, float* y, int cols) {
  __shared__ float partial[32];
  int warp = threadIdx.x / 32, lane = threadIdx.x & 31;
  const float* xr = x + blockIdx.x * cols;
  float s = 0.f;
  for (int c = threadIdx.x; c < cols; c += blockDim.x) s += xr[c] * xr[c];
  for (int o = 16; o > 0; o >>= 1) s += __shfl_xor_sync(0xffffffff, s, o);
  if (lane == 0) partial[warp] = s;
  __syncthreads();
  s = threadIdx.x < blockDim.x / 32 ? partial[lane] : 0.f;
  y[blockIdx.x] = s;
}
"""
    assert cell_of([source]) == Cell("global", "warp-shuffle", "block-per-row", "?")


def test_two_dimensional_elementwise_is_thread_per_element() -> None:
    source = """\
__global__ void add2d(const float* a, float* b, int h, int w) {
  int x = blockIdx.x * blockDim.x + threadIdx.x;
  int y = blockIdx.y * blockDim.y + threadIdx.y;
  if (x < w && y < h) b[y * w + x] += a[y * w + x];
}
"""
    assert cell_of([source]).decomposition == "thread-per-element"


def test_no_index_arithmetic_is_other() -> None:
    source = "__global__ void k(float* y) { y[threadIdx.x] = 0.f; }"
    assert cell_of([source]).decomposition == "other"
