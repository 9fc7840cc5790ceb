// Softmax over the last dimension: one block per row with warp-shuffle reductions for
// long rows; one thread per row for short ones.
#include <cstdint>
#include <cuda_runtime.h>

#define BLOCK 128

__device__ __forceinline__ float warp_max(float v) {
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}

__device__ __forceinline__ float warp_sum(float v) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

// Reduce across the block; every thread gets the result.
template <bool IS_MAX>
__device__ float block_reduce(float v, float* scratch) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    v = IS_MAX ? warp_max(v) : warp_sum(v);
    if (lane == 0) scratch[warp] = v;
    __syncthreads();
    const int warps = (blockDim.x + 31) >> 5;
    float w = threadIdx.x < warps ? scratch[threadIdx.x] : (IS_MAX ? -INFINITY : 0.0f);
    if (warp == 0) w = IS_MAX ? warp_max(w) : warp_sum(w);
    if (threadIdx.x == 0) scratch[0] = w;
    __syncthreads();
    const float out = scratch[0];
    __syncthreads();
    return out;
}

__global__ void softmax_kernel(const float* x, float* y, int64_t rows, int64_t cols) {
    __shared__ float scratch[32];
    const int64_t row = blockIdx.x;
    const float* in = x + row * cols;
    float* out = y + row * cols;
    float m = -INFINITY;
    for (int64_t j = threadIdx.x; j < cols; j += blockDim.x) m = fmaxf(m, in[j]);
    m = block_reduce<true>(m, scratch);
    float sum = 0.0f;
    for (int64_t j = threadIdx.x; j < cols; j += blockDim.x) sum += expf(in[j] - m);
    sum = block_reduce<false>(sum, scratch);
    const float inv = 1.0f / sum;
    for (int64_t j = threadIdx.x; j < cols; j += blockDim.x) out[j] = expf(in[j] - m) * inv;
}

// Short rows: one thread per row, as before; a block's reductions would cost more there.
__global__ void softmax_short_rows(const float* x, float* y, int64_t rows, int64_t cols) {
    int64_t row = (int64_t)blockIdx.x * BLOCK + threadIdx.x;
    if (row >= rows) return;
    const float* in = x + row * cols;
    float* out = y + row * cols;
    float m = -INFINITY;
    for (int64_t j = 0; j < cols; ++j) m = fmaxf(m, in[j]);
    float sum = 0.0f;
    for (int64_t j = 0; j < cols; ++j) sum += expf(in[j] - m);
    for (int64_t j = 0; j < cols; ++j) out[j] = expf(in[j] - m) / sum;
}

cudaError_t softmax_launch(const float* x, float* y, int64_t rows, int64_t cols) {
    if (rows == 0 || cols == 0) return cudaSuccess;
    if (cols <= 32) {
        softmax_short_rows<<<(unsigned)((rows + BLOCK - 1) / BLOCK), BLOCK>>>(x, y, rows, cols);
    } else {
        softmax_kernel<<<(unsigned)rows, BLOCK>>>(x, y, rows, cols);
    }
    return cudaGetLastError();
}
