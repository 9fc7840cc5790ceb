"""fast-math-intrinsics (kfbot/search/rewrites/fastmath.py): --use_fast_math written as
source, only on floats, only in the target's scope and only where the tolerance holds."""

from __future__ import annotations

import pytest
from cuda_compile import NVCC, compile_all

from kfbot.search.rewrites.fastmath import DEFAULT_RTOL, fast_math_intrinsics
from kfbot.search.rewrites.syntax import Target

HEADER = "#include <cstdint>\n#include <cuda_runtime.h>\n#include <math.h>\n"
SOURCE = HEADER + """
__device__ float squash(float v) { return 1.0f / (1.0f + expf(-v)); }
__device__ float shared_helper(float v) { return expf(v); }

__global__ void k(const float* x, float* y, const double* d, double* e, int* q, int n,
                  float scale) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    const float v = x[i];
    float r = 1.0f / sqrtf(v * v + 1.0f);
    y[i] = squash(v) * r + logf(v + 2.0f) / scale + exp(v) + shared_helper(v);
    e[i] = exp(d[i]) / d[i];
    q[i] = q[i] / n;
    y[i] += v / sqrtf(scale);
}

__global__ void other(float* y) { y[0] = shared_helper(y[1]) / y[2]; }
"""


def test_intrinsics_in_the_kernel_and_the_device_functions_only_it_calls() -> None:
    out = fast_math_intrinsics(SOURCE, Target("k"))
    assert out is not None
    assert "return __frcp_rn((1.0f + __expf(-v)));" in out  # squash: only k calls it
    assert "float r = rsqrtf(v * v + 1.0f);" in out
    assert "__logf(v + 2.0f)" in out and "__expf(v)" in out  # exp of a float: __expf
    assert "__fdividef(__logf(v + 2.0f), scale)" in out
    assert "y[i] += v * rsqrtf(scale);" in out
    # doubles and integers keep their precise arithmetic
    assert "e[i] = exp(d[i]) / d[i];" in out and "q[i] = q[i] / n;" in out
    # a device function another kernel calls, and that kernel, are left alone
    assert "__device__ float shared_helper(float v) { return expf(v); }" in out
    assert "__global__ void other(float* y) { y[0] = shared_helper(y[1]) / y[2]; }" in out
    assert fast_math_intrinsics(out, Target("k")) is None  # idempotent


def test_the_tolerance_decides_which_intrinsics() -> None:
    tight = fast_math_intrinsics(SOURCE, Target("k", rtol=1e-5))
    assert tight is not None
    assert "__expf" not in tight  # 20 ulp * 8 is more than 1e-5
    assert "rsqrtf(v * v + 1.0f)" in tight and "__fdividef" in tight  # 2 ulp * 8: fits
    exact = fast_math_intrinsics(SOURCE, Target("k", rtol=1e-7))
    assert exact is not None
    assert "__frcp_rn" in exact  # correctly rounded: always
    assert "rsqrtf" not in exact and "__fdividef" not in exact and "__logf" not in exact
    assert fast_math_intrinsics(HEADER + "__global__ void k(float* y) { y[0] = 2.0f; }\n",
                                Target("k")) is None


def test_default_tolerance_matches_the_verifier() -> None:
    compare = pytest.importorskip("kfbot.evaluate.verdict.compare")
    assert compare.DEFAULT_TOLERANCES["float32"].rtol == DEFAULT_RTOL


@pytest.mark.skipif(NVCC is None, reason="nvcc not on PATH")
def test_output_compiles_for_sm90(tmp_path_factory: pytest.TempPathFactory) -> None:
    out = fast_math_intrinsics(SOURCE, Target("k"))
    assert out is not None
    assert compile_all({"fastmath": out}, tmp_path_factory.mktemp("fastmath")) == {"fastmath": ""}
