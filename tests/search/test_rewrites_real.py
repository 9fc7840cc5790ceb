"""Rewrites on kernels written as real repositories write them (fixtures/naive_real):
seen through helper device functions and templates, the occupancy sweep, online softmax,
the warp-shuffle finish through helpers under a conditional block, the plan's reasons;
every output compiled with nvcc for sm_90."""

from __future__ import annotations

import math
import random
from pathlib import Path

import pytest
from cuda_compile import NVCC, compile_all

from kfbot.search.rewrites import load_rewrites
from kfbot.search.rewrites.explain import explain
from kfbot.search.rewrites.inline import inline_helpers
from kfbot.search.rewrites.registry import SOURCE_REWRITES
from kfbot.search.rewrites.syntax import Target

ROOT = Path(__file__).resolve().parents[2]
REAL = ROOT / "fixtures" / "naive_real" / "csrc"
ROWS = ROOT / "fixtures" / "naive_rows" / "csrc"


def _src(name: str) -> str:
    return (REAL / name).read_text()


def _apply(rewrite: str, source: str, kernel: str) -> str | None:
    return SOURCE_REWRITES[rewrite](source, Target(kernel))


def test_helpers_are_inlined_with_their_own_names() -> None:
    found = inline_helpers(_src("layernorm.cu"), "layernorm_kernel")
    assert found is not None and found.helpers == ("row_mean", "row_variance")
    kernel = found.source[found.source.index("__global__"):]
    assert "row_mean(in" not in kernel and "row_variance(in" not in kernel
    # Each helper's `acc` and `j` renamed apart; the arguments bound by name.
    assert kernel.count("float acc_kfbot") == 2
    assert "+= in[j_kfbot" in kernel


def test_row_rewrites_see_through_helpers_and_templates() -> None:
    layer = _apply("warp_per_row", _src("layernorm.cu"), "layernorm_kernel")
    assert layer is not None
    kernel = layer[layer.index("__global__ void layernorm_kernel"):]
    assert kernel.count("= kfbot_warp_sum(acc_kfbot") == 2  # both statistics, reduced
    assert "layernorm_kernel<<<(unsigned)(((rows) + 7) / 8), 256>>>" in layer
    templ = _apply("block_per_row", _src("reduce.cu"), "row_sum_kernel")
    assert templ is not None
    assert "row_sum_kernel<T, kBlock><<<(unsigned)(rows), 256>>>" in templ
    assert "row_absmax_kernel<T, 128><<<(rows + 127) / 128, 128>>>" in templ  # untouched
    blur = _apply("row_map_per_block", _src("stencil.cu"), "blur_rows_kernel")
    assert blur is not None and "for (int j = kfbot_tid; j < width; j += (int)blockDim.x)" in blur


def test_occupancy_sweep_takes_the_largest_block_of_a_conditional() -> None:
    two = _apply("occupancy_2", _src("softmax.cu"), "softmax_block_kernel")
    four = _apply("occupancy_4", _src("stencil.cu"), "blur_rows_kernel")
    assert two is not None and "__launch_bounds__(1024, 2) softmax_block_kernel" in two
    assert four is not None and "__launch_bounds__(256, 4) blur_rows_kernel" in four
    # 1024 threads x 4 blocks is more than a multiprocessor holds: not proposed.
    assert _apply("occupancy_4", _src("softmax.cu"), "softmax_block_kernel") is None
    assert _apply("occupancy_2", two, "softmax_block_kernel") is None  # idempotent


def test_warp_shuffle_finish_reaches_the_tree_inside_helpers() -> None:
    out = _apply("warp_shuffle_reduction", _src("softmax.cu"), "softmax_block_kernel")
    assert out is not None
    kernel = out[out.index("__global__ void softmax_block_kernel"):]
    assert kernel.count("__shfl_down_sync") == 2 and "> 32;" in kernel
    assert out.count("__global__ void dropout_scale_kernel") == 1


def _online(split: str) -> str:
    src = (ROWS / "softmax.cu").read_text()
    split_src = _apply(split, src, "softmax_kernel")
    assert split_src is not None
    out = _apply("online_softmax", split_src, "softmax_kernel")
    assert out is not None
    return out


def test_online_softmax_fuses_the_split_max_and_sum_passes() -> None:
    for split, prefix in (("warp_per_row", "kfbot_warp"), ("block_per_row", "kfbot_block")):
        out = _online(split)
        kernel = out[out.index("__global__ void softmax_kernel"):out.index("// y = alpha")]
        assert "const float kfbot_m = fmaxf(m, kfbot_v);" in kernel
        assert "sum = sum * expf(m - kfbot_m) + expf(kfbot_v - kfbot_m);" in kernel
        assert f"{prefix}_online(m, sum);" in kernel
        assert kernel.count("for (") == 2  # two passes over the row where there were three
        assert _apply("online_softmax", out, "softmax_kernel") is None  # idempotent
    # Not on the thread-per-row kernel: its split would no longer see plain accumulators.
    assert _apply("online_softmax", (ROWS / "softmax.cu").read_text(), "softmax_kernel") is None


def _serial(xs: list[float]) -> tuple[float, float]:
    """The fused loop of the output, one lane."""
    m, s = -math.inf, 0.0
    for v in xs:
        nm = max(m, v)
        if nm != -math.inf:
            s = s * math.exp(m - nm) + math.exp(v - nm)
            m = nm
    return m, s


def _combine(a: tuple[float, float], b: tuple[float, float]) -> tuple[float, float]:
    """kfbot_warp_online's step."""
    nm = max(a[0], b[0])
    return nm, 0.0 if nm == -math.inf else a[1] * math.exp(a[0] - nm) + b[1] * math.exp(b[0] - nm)


def test_online_pairs_give_the_softmax_denominator_masked_elements_included() -> None:
    rng = random.Random(3)
    for cols in (1, 5, 33, 100):
        row = [rng.gauss(0, 3) if rng.random() > 0.3 else -math.inf for _ in range(cols)]
        row[rng.randrange(cols)] = rng.gauss(0, 3)  # at least one finite element
        lanes = [_serial(row[lane::32]) for lane in range(32)]
        width = 1
        while width < 32:  # the butterfly: lane i with lane i ^ width
            lanes = [_combine(lanes[i], lanes[i ^ width]) for i in range(32)]
            width *= 2
        m = max(row)
        expected = sum(math.exp(v - m) for v in row)
        assert all(lane == lanes[0] for lane in lanes)  # every lane the same pair
        assert lanes[0][0] == m and math.isclose(lanes[0][1], expected, rel_tol=1e-12)


def test_the_plan_says_why_each_rule_does_or_does_not_apply() -> None:
    files = {"csrc/softmax.cu": _src("softmax.cu")}
    lines = explain(files, list(files), "softmax_block_kernel", load_rewrites())
    by_id = {line.split(":", 1)[0]: line for line in lines}
    assert by_id["warp-per-row"].endswith(
        "does not apply: it synchronises, shuffles, uses atomics or shared memory, or loops "
        "with while/do/switch: not one thread per row")
    assert by_id["warp-shuffle-reduction"] == (
        "warp-shuffle-reduction: applies with the helpers inlined (thread_max, "
        "thread_sum_exp, block_reduce_max, block_reduce_sum)")
    assert by_id["occupancy-2-blocks"] == "occupancy-2-blocks: applies"
    files = {"csrc/layernorm.cu": _src("layernorm.cu")}
    lines = explain(files, list(files), "layernorm_kernel", load_rewrites())
    assert "warp-per-row: applies with the helpers inlined (row_mean, row_variance)" in lines
    assert "grid-stride-loop: does not apply: it looks for: the kernel body is exactly" \
        in "\n".join(lines)


def test_a_lambda_in_the_kernel_is_inlined_and_its_declaration_dropped() -> None:
    found = inline_helpers(_src("rmsnorm.cu"), "rmsnorm_kernel")
    assert found is not None and found.helpers == ("sum_of_squares",)
    kernel = found.source[found.source.index("__global__"):]
    assert "[&]" not in kernel and "auto sum_of_squares" not in kernel
    assert "sum_of_squares(in)" not in kernel and "// inlined from sum_of_squares()" in kernel
    assert "acc_kfbot" in kernel and "in[j_kfbot" in kernel
    # A by-value capture that changes between the lambda and its call is not inlined.
    changed = _src("rmsnorm.cu").replace("[&]", "[=]").replace(
        "    const float inv", "    cols += 0;\n    const float inv")
    assert inline_helpers(changed, "rmsnorm_kernel") is None


def test_float4_row_loads_are_guarded_and_keep_the_tail() -> None:
    out = _apply("vectorize_row_loads", _src("softmax_warp.cu"), "softmax_warp_kernel")
    assert out is not None
    kernel = out[out.index("__global__ void softmax_warp_kernel"):]
    assert kernel.count("if (kfbot_aligned16(in)) {") == 2  # the max and the sum passes
    assert "if (kfbot_aligned16(in) && kfbot_aligned16(out)) {" in kernel
    assert "for (int kfbot_q = lane; kfbot_q < kfbot_n4; kfbot_q += 32) {" in kernel
    assert "for (int j = kfbot_n4_2 * 4 + lane; j < cols; j += 32) { out[j] = " in kernel
    assert "reinterpret_cast<float4*>(out)[kfbot_q_2] = kfbot_w0_2;" in kernel
    assert "warp_max(m)" in kernel  # its own shuffle helpers needed no inlining
    assert _apply("vectorize_row_loads", out, "softmax_warp_kernel") is None  # idempotent
    # Loops in helpers are reached by inlining them; the offset row of a templated
    # kernel's `x[(size_t)r * cols + j]` is not a float pointer: left alone.
    block = _apply("vectorize_row_loads", _src("softmax.cu"), "softmax_block_kernel")
    assert block is not None and block.count("kfbot_aligned16(row)") == 3
    assert _apply("vectorize_row_loads", _src("reduce.cu"), "row_sum_kernel") is None


def test_the_row_length_picks_a_warp_or_a_block_per_row() -> None:
    out = _apply("row_split_by_length", _src("layernorm.cu"), "layernorm_kernel")
    assert out is not None
    launcher = out[out.index("cudaError_t launch_layernorm"):]
    assert "if ((cols) <= 1024) {  // short rows: a warp each" in launcher
    assert "layernorm_kernel<<<(unsigned)(((rows) + 7) / 8), 256>>>" in launcher
    assert "layernorm_kernel_kfbot_long<<<(unsigned)(rows), 256>>>" in launcher
    assert "kfbot_warp_sum(acc_kfbot" in out and "kfbot_block_sum(acc_kfbot" in out
    assert _apply("row_split_by_length", out, "layernorm_kernel") is None
    templ = _apply("row_split_by_length", _src("reduce.cu"), "row_absmax_kernel")
    assert templ is not None and "row_absmax_kernel_kfbot_long<T, 128><<<" in templ


def test_a_row_read_in_several_passes_is_cached_in_shared_memory() -> None:
    out = _apply("cache_row_in_shared", _src("softmax.cu"), "softmax_block_kernel")
    assert out is not None
    kernel = out[out.index("__global__ void softmax_block_kernel"):]
    assert "__shared__ __align__(16) float kfbot_row[2048];" in kernel
    assert "const float* kfbot_row_p = kfbot_cached ? kfbot_row : row;" in kernel
    assert kernel.count("kfbot_row_p[j") == 3  # max, sum and output passes
    assert _apply("cache_row_in_shared", out, "softmax_block_kernel") is None
    # A thread per row has no block to share a cache with.
    assert _apply("cache_row_in_shared", _src("layernorm.cu"), "layernorm_kernel") is None
    # A pass behind a branch on the thread could skip the barrier: not rewritten.
    guarded = _src("softmax.cu").replace(
        "    const float m = block_reduce_max", "    if (threadIdx.x > 1024) return;\n"
        "    const float m = block_reduce_max")
    assert _apply("cache_row_in_shared", guarded, "softmax_block_kernel") is None


def test_the_plan_says_why_the_new_rewrites_do_not_apply() -> None:
    files = {"csrc/reduce.cu": _src("reduce.cu")}
    lines = explain(files, list(files), "row_sum_kernel", load_rewrites())
    by_id = {line.split(":", 1)[0]: line for line in lines}
    assert by_id["vectorize-row-loads"].startswith("vectorize-row-loads: does not apply: it "
                                                   "looks for: a loop in the kernel")
    assert by_id["row-split-by-length"] == "row-split-by-length: applies"


def _chain(source: str, kernel: str, *rewrites: str) -> str | None:
    for rewrite in rewrites:
        out = _apply(rewrite, source, kernel)
        if out is None:
            return None
        source = out
    return source


def _outputs() -> dict[str, str]:
    cases = {
        "layernorm-warp": _apply("warp_per_row", _src("layernorm.cu"), "layernorm_kernel"),
        "layernorm-block": _apply("block_per_row", _src("layernorm.cu"), "layernorm_kernel"),
        "rowsum-warp": _apply("warp_per_row", _src("reduce.cu"), "row_sum_kernel"),
        "absmax-block": _apply("block_per_row", _src("reduce.cu"), "row_absmax_kernel"),
        "blur-map": _apply("row_map_per_block", _src("stencil.cu"), "blur_rows_kernel"),
        "softmax-shuffle": _apply("warp_shuffle_reduction", _src("softmax.cu"),
                                  "softmax_block_kernel"),
        "softmax-occupancy": _apply("occupancy_2", _src("softmax.cu"), "softmax_block_kernel"),
        "blur-occupancy": _apply("occupancy_4", _src("stencil.cu"), "blur_rows_kernel"),
        "online-warp": _online("warp_per_row"),
        "online-block": _online("block_per_row"),
        # The rewrites real row kernels called for: float4 row loads, the row-length
        # choice, the row cached in shared memory, and a lambda seen through.
        "softmax-warp-float4": _apply("vectorize_row_loads", _src("softmax_warp.cu"),
                                      "softmax_warp_kernel"),
        "softmax-block-float4": _apply("vectorize_row_loads", _src("softmax.cu"),
                                       "softmax_block_kernel"),
        "blur-float4": _apply("vectorize_row_loads", _src("stencil.cu"), "blur_rows_kernel"),
        "layernorm-by-length": _apply("row_split_by_length", _src("layernorm.cu"),
                                      "layernorm_kernel"),
        "absmax-by-length": _apply("row_split_by_length", _src("reduce.cu"),
                                   "row_absmax_kernel"),
        "softmax-block-cached": _apply("cache_row_in_shared", _src("softmax.cu"),
                                       "softmax_block_kernel"),
        "layernorm-block-cached": _chain(_src("layernorm.cu"), "layernorm_kernel",
                                         "block_per_row", "cache_row_in_shared",
                                         "vectorize_row_loads"),
        "rmsnorm-lambda-warp": _apply("warp_per_row", _src("rmsnorm.cu"), "rmsnorm_kernel"),
        "rmsnorm-warp-float4": _chain(_src("rmsnorm.cu"), "rmsnorm_kernel", "warp_per_row",
                                      "vectorize_row_loads"),
    }
    return {k: v for k, v in cases.items() if v is not None}


OUTPUTS = _outputs()


@pytest.fixture(scope="module")
def compiled(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    if NVCC is None:
        pytest.skip("nvcc not on PATH")
    return compile_all(OUTPUTS, tmp_path_factory.mktemp("real"), ["-Werror=all-warnings"])


def test_every_case_made_an_output() -> None:
    assert len(OUTPUTS) == 19


@pytest.mark.parametrize("case", list(OUTPUTS))
def test_outputs_compile_for_sm90(compiled: dict[str, str], case: str) -> None:
    assert compiled[case] == "", compiled[case]
