"""The small rewrites of rules/rewrites.yaml (kfbot/search/rewrites/): loading, each
rewrite's positive and negative examples, and every output compiled with nvcc."""

from __future__ import annotations

from pathlib import Path

import pytest
from cuda_compile import NVCC, compile_all

from kfbot.datafiles import rules_dir
from kfbot.errors import KfbotError
from kfbot.evaluate.candidate import Candidate
from kfbot.search import rewrites as rw
from kfbot.search.rewrites.files import apply_to_file
from kfbot.search.rewrites.qualifiers import launch_bounds, restrict_pointers
from kfbot.search.rewrites.registry import IMPLEMENTATIONS, SOURCE_REWRITES
from kfbot.search.rewrites.syntax import Target

ROOT = Path(__file__).resolve().parents[2]
GELU = ROOT / "fixtures/load_elementwise/csrc/gelu_kernel.cu"
HEADER = "#include <cstdint>\n#include <cuda_runtime.h>\n"

ELEMENTWISE = HEADER + """
constexpr int kBlock = 256;

__global__ void scale_kernel(const float* x, float* y, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) {
        y[i] = 2.0f * x[i];
    }
}

void launch(const float* x, float* y, int n) {
    scale_kernel<<<(n + kBlock - 1) / kBlock, kBlock>>>(x, y, n);
}
"""

RESTRICT = HEADER + """
__global__ void add(float* a, const float* b, float* out, int n) {
    int i = threadIdx.x;
    if (i < n) out[i] = a[i] + b[i];
}
"""

LOOPS = HEADER + """
#define TILE 8
template <int N>
__device__ float dot(const float* a) {
    float s = 0.0f;
    for (int k = 0; k < N; ++k) s += a[k];
    return s;
}

__global__ void loops(float* y, int n) {
    float acc[TILE];
    for (int j = 0; j < TILE; ++j) acc[j] = 0.0f;
    for (int j = 0; j < n; ++j) acc[0] += 1.0f;
    #pragma unroll 2
    for (int j = 0; j < 4; ++j) acc[j] += 1.0f;
    y[threadIdx.x] = acc[0] + dot<4>(y);
}
"""

REDUCE = HEADER + """
__global__ void reduce_sum(const float* x, float* out, int n) {
    __shared__ float sdata[256];
    int tid = threadIdx.x;
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    sdata[tid] = i < n ? x[i] : 0.0f;
    __syncthreads();
    for (int s = blockDim.x / 2; s > 0; s >>= 1) {
        if (tid < s) sdata[tid] += sdata[tid + s];
        __syncthreads();
    }
    if (tid == 0) out[blockIdx.x] = sdata[0];
}

__global__ void reduce_max(const float* x, float* out, int n) {
    __shared__ float smax[256];
    unsigned int tid = threadIdx.x;
    smax[tid] = tid < n ? x[tid] : -1e30f;
    __syncthreads();
    for (unsigned int s = blockDim.x / 2; s > 0; s >>= 1) {
        if (tid < s) {
            smax[tid] = fmaxf(smax[tid], smax[tid + s]);
        }
        __syncthreads();
    }
    if (tid == 0) out[0] = smax[0];
}

void launch(const float* x, float* out, int n) {
    reduce_sum<<<(n + 255) / 256, 256>>>(x, out, n);
    reduce_max<<<1, 256>>>(x, out, n);
}
"""

# Comments and strings mention every trigger; no code has any of the shapes.
DECOYS = HEADER + """
// __global__ void k(float* x) { int i = blockIdx.x * blockDim.x + threadIdx.x;
// if (i < n) y[i] = x[i]; }
/* for (int s = blockDim.x / 2; s > 0; s >>= 1) { if (tid < s) sdata[tid] += sdata[tid + s]; } */
const char* kDoc = "__global__ void k(float* x) { for (int j = 0; j < 4; ++j) x[j] = 0; }";
__global__ void __launch_bounds__(64) k(const float* __restrict__ x, float* __restrict__ y,
                                        int n) {
    // y[i] = x[i]; for (int j = 0; j < 4; ++j) k<<<1, 64>>>(x, y, n);
    for (int i = threadIdx.x; i < n; i += blockDim.x) y[i] = x[i];  // "<<<1, 32>>>"
}
void launch(const float* x, float* y, int n) { k<<<1, 64>>>(x, y, n); }
"""

PARENT = Candidate()


def only(rewrite_id: str) -> tuple[rw.Rewrite, ...]:
    return tuple(r for r in rw.load_rewrites() if r.id == rewrite_id)


def apply(rewrite_id: str, source: str, kernel: str = "scale_kernel") -> str | None:
    impl = only(rewrite_id)[0].rewrite
    return SOURCE_REWRITES[impl](source, Target(kernel))


# --- loading and validation -------------------------------------------------------------

SMALL = ["restrict-pointers", "launch-bounds", "occupancy-2-blocks", "occupancy-4-blocks",
         "unroll-constant-loops", "grid-stride-loop", "warp-shuffle-reduction", "online-softmax",
         "fast-math-intrinsics", "fast-math-flags", "vectorize-row-loads", "cache-row-in-shared"]
SMALL_SOURCE = [r.rewrite for r in rw.load_rewrites(rules_dir() / "rewrites.yaml")
                if r.rewrite in SOURCE_REWRITES]


def test_shipped_rewrites_load_and_are_implemented() -> None:
    small = rw.load_rewrites(rules_dir() / "rewrites.yaml")
    assert [r.id for r in small] == SMALL
    experts = [e.id for e in rw.load_library().experts]
    assert [r.id for r in rw.load_rewrites()] == experts + SMALL  # structural ones first
    for r in rw.load_rewrites():
        assert r.rewrite in IMPLEMENTATIONS
        assert r.what and r.why and r.applies_when
    assert "#define" in only("launch-bounds")[0].applies_when  # not cut by a YAML comment
    assert "verification passes at the task's tolerance" in only("fast-math-flags")[0].why


@pytest.mark.parametrize(("body", "line", "problem"), [
    ("  what: w\n  why: y\n  applies-when: a\n  rewrite: nope\n", 5,
     "rewrite my-rewrite.rewrite: unknown rewrite 'nope'; known: "),
    ("  what: w\n  why: y\n  applies-when: a\n  rewrite: launch_bounds\n  extra: 1\n", 6,
     "rewrite my-rewrite.extra: unknown key"),
    ("  what: w\n  applies-when: a\n  rewrite: launch_bounds\n", 1,
     "rewrite my-rewrite: missing required key 'why'"),
    ("  what: w\n  why: ''\n  applies-when: a\n  rewrite: launch_bounds\n", 3,
     "rewrite my-rewrite.why: must be one line of text"),
    ("  what: w\n  why: [y]\n  applies-when: a\n  rewrite: launch_bounds\n", 3,
     "rewrite my-rewrite.why: expected a string, got a list"),
])
def test_validation_names_file_line_and_id(tmp_path: Path, body: str, line: int,
                                           problem: str) -> None:
    path = tmp_path / "rewrites.yaml"
    path.write_text("- id: my-rewrite\n" + body)
    with pytest.raises(KfbotError) as err:
        rw.load_rewrites(path)
    assert str(err.value).startswith(f"{path}:{line}: {problem}")


def test_validation_rejects_bad_and_duplicate_ids_and_non_lists(tmp_path: Path) -> None:
    entry = "- id: a\n  what: w\n  why: y\n  applies-when: a\n  rewrite: launch_bounds\n"
    path = tmp_path / "rewrites.yaml"
    path.write_text(entry + entry)
    with pytest.raises(KfbotError, match=r"rewrites.yaml:6: rewrite a: the id is used twice "
                                         r"\(first at line 1\)"):
        rw.load_rewrites(path)
    path.write_text(entry.replace("id: a", "id: Not_Kebab"))
    with pytest.raises(KfbotError, match=r"rewrite Not_Kebab\.id: 'Not_Kebab' is not kebab-case"):
        rw.load_rewrites(path)
    path.write_text("id: a\n")
    with pytest.raises(KfbotError, match="expected a list of rewrites, got mapping"):
        rw.load_rewrites(path)
    path.write_text("- id: a\n  what: [\n")
    with pytest.raises(KfbotError, match=r"rewrites\.yaml:3: invalid YAML"):
        rw.load_rewrites(path)


# --- positive and negative examples ---------------------------------------------------------


def test_restrict_pointers() -> None:
    out = apply("restrict-pointers", RESTRICT, "add")
    assert out is not None
    assert ("__global__ void add(const float* __restrict__ a, const float* __restrict__ b, "
            "float* __restrict__ out, int n)") in out
    # written through, as p[i] =, *p = or p[i] +=: never made const
    for write in ("a[0] = 1.0f;", "*a = 1.0f;", "a[i] += 1.0f;", "float* q = a;"):
        src = RESTRICT.replace("int i = threadIdx.x;", f"int i = threadIdx.x; {write}")
        changed = apply("restrict-pointers", src, "add")
        assert changed is not None and "float* __restrict__ a" in changed
        assert "const float* __restrict__ a" not in changed


def test_restrict_pointers_negative() -> None:
    done = HEADER + "__global__ void k(const float* __restrict__ x, int n) { }\n" \
        "__device__ void d(float* x) { }\nvoid host(float* x) { }\n"
    assert apply("restrict-pointers", done, "k") is None
    assert apply("restrict-pointers", RESTRICT, "other") is None  # not the target


def test_launch_bounds() -> None:
    out = apply("launch-bounds", ELEMENTWISE)
    assert out is not None
    assert "__global__ void __launch_bounds__(256) scale_kernel(" in out
    define = ELEMENTWISE.replace("constexpr int kBlock = 256;", "#define kBlock 64")
    out = apply("launch-bounds", define)
    assert out is not None and "__launch_bounds__(64) scale_kernel" in out
    # Launches with different constant blocks: bounded by the largest.
    two = ELEMENTWISE.replace(
        "scale_kernel<<<(n + kBlock - 1) / kBlock, kBlock>>>(x, y, n);",
        "scale_kernel<<<1, 128>>>(x, y, n); scale_kernel<<<1, 256>>>(x, y, n);")
    out = apply("launch-bounds", two)
    assert out is not None and "__launch_bounds__(256) scale_kernel" in out


@pytest.mark.parametrize("launches", [
    "",  # no launch in the file
    "scale_kernel<<<1, 128>>>(x, y, n); scale_kernel<<<1, 2048>>>(x, y, n);",  # too many
    "scale_kernel<<<1, threads>>>(x, y, n);",  # runtime block size
    "scale_kernel<<<1, dim3(16, 16)>>>(x, y, n);",
])
def test_launch_bounds_negative(launches: str) -> None:
    src = ELEMENTWISE.replace(
        "scale_kernel<<<(n + kBlock - 1) / kBlock, kBlock>>>(x, y, n);", launches)
    src = src.replace("void launch(", "void launch(int threads, ")
    assert apply("launch-bounds", src) is None


def test_unroll_constant_loops() -> None:
    out = apply("unroll-constant-loops", LOOPS, "loops")
    assert out is not None
    assert "    #pragma unroll\n    for (int k = 0; k < N; ++k)" in out
    assert "    #pragma unroll\n    for (int j = 0; j < TILE; ++j)" in out
    assert "#pragma unroll\n    for (int j = 0; j < n; ++j)" not in out  # runtime bound
    assert out.count("#pragma unroll") == 3  # two added, `#pragma unroll 2` kept alone


def test_unroll_constant_loops_negative() -> None:
    host = HEADER + "void f(float* y) { for (int j = 0; j < 4; ++j) y[j] = 0; }\n" \
        "__global__ void k(float* y, int n) {\n" \
        "    for (int j = threadIdx.x; j < 256; j += blockDim.x) y[j] = 0;\n" \
        "    for (int j = 0; j < 100000; ++j) y[0] += 1;\n" \
        "    for (int j = 0; j < 8; ++j) { y[j] = 0; j += 1; }\n}\n"
    assert apply("unroll-constant-loops", host, "k") is None


def test_unroll_leaves_device_functions_other_kernels_call() -> None:
    shared = LOOPS + "__global__ void other(float* y) { y[0] = dot<4>(y); }\n"
    out = apply("unroll-constant-loops", shared, "loops")
    assert out is not None and "#pragma unroll\n    for (int k = 0; k < N; ++k)" not in out
    assert "    #pragma unroll\n    for (int j = 0; j < TILE; ++j)" in out


def test_grid_stride_loop() -> None:
    out = apply("grid-stride-loop", ELEMENTWISE)
    assert out is not None
    assert ("    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; "
            "i += (int)blockDim.x * gridDim.x) {\n        y[i] = 2.0f * x[i];\n    }\n}") in out
    out = apply("grid-stride-loop", GELU.read_text(), "gelu_kernel")
    assert out is not None
    assert "i < n; i += (int64_t)blockDim.x * gridDim.x) {" in out


@pytest.mark.parametrize(("old", "new"), [
    ("if (i < n) {", "if (i < n) { if (x[i] < 0) return;"),  # early return
    ("if (i < n) {", "if (i <= n) {"),
    ("int i = blockIdx.x * blockDim.x + threadIdx.x;", "int i = threadIdx.x;"),
    ("    }\n}", "    } else { }\n}"),
    ("    }\n}", "    }\n    __syncthreads();\n}"),  # more than the two statements
])
def test_grid_stride_loop_negative(old: str, new: str) -> None:
    src = ELEMENTWISE.replace(old, new, 1)
    assert src != ELEMENTWISE
    assert apply("grid-stride-loop", src) is None


def test_vectorize_float4() -> None:
    out = apply("vectorize-float4", ELEMENTWISE)
    assert out is not None
    assert "const float4 x_v4 = reinterpret_cast<const float4*>(x)[i];" in out
    for lane in "xyzw":
        assert f"y_v4.{lane} = 2.0f * x_v4.{lane};" in out
    assert "reinterpret_cast<float4*>(y)[i] = y_v4;" in out
    assert "if (i < n % 4) {" in out and "const int i_s = n / 4 * 4 + i;" in out
    assert "y[i_s] = 2.0f * x[i_s];" in out  # scalar tail and unaligned fallback
    assert "& 15ull) == 0)" in out
    assert "scale_kernel<<<((n + 3) / 4 + kBlock - 1) / kBlock, kBlock>>>(x, y, n);" in out


@pytest.mark.parametrize(("old", "new"), [
    ("(n + kBlock - 1) / kBlock, kBlock", "n / kBlock + 1, kBlock"),  # grid not recognised
    ("y[i] = 2.0f * x[i];", "y[i] = 2.0f * x[i + 1];"),  # not x[i]
    ("y[i] = 2.0f * x[i];", "if (x[i] > 0) y[i] = 2.0f * x[i];"),  # conditional store
    ("const float* x, float* y", "const double* x, float* y"),
    ("scale_kernel<<<", "void other(const float* x, float* y, int n) { "
     "scale_kernel<<<1, 32>>>(x, y, n); }\nvoid launch2(const float* x, float* y, int n) { "
     "scale_kernel<<<"),  # two launch sites
])
def test_vectorize_float4_negative(old: str, new: str) -> None:
    src = ELEMENTWISE.replace(old, new, 1)
    assert src != ELEMENTWISE
    assert apply("vectorize-float4", src) is None


def test_vectorize_float4_needs_the_launch_in_the_same_file() -> None:
    impl = SOURCE_REWRITES["vectorize_float4"]
    assert impl(ELEMENTWISE, Target("scale_kernel", launched_elsewhere=True)) is None


def test_warp_shuffle_reduction() -> None:
    out = apply("warp-shuffle-reduction", REDUCE, "reduce_sum")
    assert out is not None
    assert out.count("s > 32;") == 1 and out.count("s > 0;") == 1  # reduce_max untouched
    assert "v += __shfl_down_sync(0xffffffffu, v, offset);" in out
    assert "if (blockDim.x >= 64) v += sdata[tid + 32];" in out
    out = apply("warp-shuffle-reduction", REDUCE, "reduce_max")
    assert out is not None and out.count("s > 32;") == 1
    assert "v = fmaxf(v, __shfl_down_sync(0xffffffffu, v, offset));" in out
    assert "if (tid == 0) smax[0] = v;" in out


@pytest.mark.parametrize(("old", "new"), [
    ("reduce_sum<<<(n + 255) / 256, 256>>>", "reduce_sum<<<(n + 255) / 256, 16>>>"),
    ("sdata[tid] += sdata[tid + s];", "sdata[tid] *= sdata[tid + s];"),
    ("for (int s = blockDim.x / 2; s > 0; s >>= 1)", "for (int s = 128; s > 0; s >>= 1)"),
    ("int tid = threadIdx.x;", "int tid = threadIdx.x + 1;"),
])
def test_warp_shuffle_reduction_negative(old: str, new: str) -> None:
    src = REDUCE.replace(old, new, 1)
    assert apply("warp-shuffle-reduction", src, "reduce_sum") is None


def test_fast_math_flags() -> None:
    files = {"k.cu": ELEMENTWISE}
    parent = Candidate(files=files, params={"BLOCK": "128"})
    [cand] = rw.propose_rewrites(files, ["k.cu"], parent, "scale_kernel", only("fast-math-flags"))
    assert cand.params == {"BLOCK": "128", "KFBOT_NVCC_FLAGS": "--use_fast_math"}
    assert cand.files == files and cand.origin == "rules" and cand.parent == parent.hash
    assert cand.rationale.startswith("fast-math-flags: ")
    # already used, by the param or by a Python build string: nothing
    again = Candidate(files=files, params=cand.params)
    assert rw.propose_rewrites(files, ["k.cu"], again, "scale_kernel",
                               only("fast-math-flags")) == []
    py = 'cflags = ["--use_fast_math"]\nsrc = r"""__global__ void k() {}"""\n'
    assert rw.propose_rewrites({"m.py": py}, ["m.py"], PARENT, "k",
                               only("fast-math-flags")) == []
    # no kernel at all: nothing
    assert rw.propose_rewrites({"b.cpp": "int f();\n"}, ["b.cpp"], PARENT, "k",
                               only("fast-math-flags")) == []


# --- comments and strings, idempotence, files --------------------------------------------------

SOURCES = {"elementwise": (ELEMENTWISE, "scale_kernel"), "restrict": (RESTRICT, "add"),
           "loops": (LOOPS, "loops"), "reduce": (REDUCE, "reduce_sum"),
           "gelu": (GELU.read_text(), "gelu_kernel")}


@pytest.mark.parametrize("impl", SMALL_SOURCE)
def test_comments_and_strings_do_not_trigger(impl: str) -> None:
    found = SOURCE_REWRITES[impl](DECOYS, Target("k"))
    if impl.startswith("occupancy_"):  # the real kernel's own bound is what it changes
        assert found == DECOYS.replace("__launch_bounds__(64)",
                                       f"__launch_bounds__(64, {impl[-1]})")
    elif impl == "vectorize_row_loads":  # the real block-stride copy loop, nothing else
        assert found is not None and found.count("kfbot_aligned16(x) && kfbot_aligned16(y)") == 1
        for decoy in DECOYS.splitlines()[:6]:
            assert decoy in found
    else:
        assert found is None


@pytest.mark.parametrize("impl", SMALL_SOURCE)
@pytest.mark.parametrize("name", list(SOURCES))
def test_idempotent(impl: str, name: str) -> None:
    source, kernel = SOURCES[name]
    once = SOURCE_REWRITES[impl](source, Target(kernel))
    if once is not None:
        assert SOURCE_REWRITES[impl](once, Target(kernel)) is None


def test_propose_on_gelu_fixture() -> None:
    path = "csrc/gelu_kernel.cu"
    files = {path: GELU.read_text(), "csrc/gelu.cpp": "// host binding\n"}
    parent = Candidate(files=files)
    cands = rw.propose_rewrites(files, [path], parent, "gelu_kernel")
    ids = [c.rationale.split(":")[0] for c in cands]
    assert ids == ["vectorize-float4", "restrict-pointers", "launch-bounds",
                   "occupancy-2-blocks", "occupancy-4-blocks", "grid-stride-loop",
                   "fast-math-flags"]
    for cand in cands:
        assert cand.origin == "rules" and cand.parent == parent.hash
        assert cand.files["csrc/gelu.cpp"] == "// host binding\n"
    assert "((n + 3) / 4 + kBlockSize - 1) / kBlockSize" in cands[0].files[path]
    assert "float* __restrict__ y" in cands[1].files[path]
    assert "__launch_bounds__(128) gelu_kernel" in cands[2].files[path]


def test_python_load_inline_string() -> None:
    text = (ROOT / "fixtures/inline_softmax/softmax_inline.py").read_text()
    target = Target("softmax_kernel")
    out = apply_to_file(lambda s: restrict_pointers(s, target), "softmax_inline.py", text)
    assert out is not None
    assert "const float* __restrict__ x, float* __restrict__ y, int64_t rows" in out
    assert out.replace(" __restrict__", "") == text
    compile(out, "softmax_inline.py", "exec")
    bounds = apply_to_file(lambda s: launch_bounds(s, target), "softmax_inline.py", text)
    assert bounds is not None and "__launch_bounds__(128) softmax_kernel" in bounds
    escaped = 'src = "__global__ void k(float* x) { }\\n"\n'  # escapes: left alone
    assert apply_to_file(lambda s: restrict_pointers(s, Target("k")), "m.py", escaped) is None


def test_files_other_than_sources_are_left_alone() -> None:
    assert apply_to_file(lambda s: restrict_pointers(s, Target("add")), "notes.txt",
                         RESTRICT) is None
    assert rw.propose_rewrites({"k.cu": RESTRICT}, [], PARENT, "add") == []


# --- every rewritten output compiles --------------------------------------------------------------


def _outputs() -> dict[str, str]:
    out = {}
    for name, (source, kernel) in SOURCES.items():
        for impl in SMALL_SOURCE:
            new = SOURCE_REWRITES[impl](source, Target(kernel))
            if new is not None:
                out[f"{name}-{impl}"] = new
    out["reducemax-warp_shuffle_reduction"] = SOURCE_REWRITES["warp_shuffle_reduction"](
        REDUCE, Target("reduce_max")) or ""
    return out


OUTPUTS = _outputs()


def test_every_rewrite_has_a_compiled_example() -> None:
    done = {case.split("-", 1)[1] for case in OUTPUTS} | {
        "fast_math_intrinsics", "online_softmax", "vectorize_row_loads", "cache_row_in_shared"}
    # fast math has its own file (test_rewrites_fastmath); online softmax applies to the
    # row rewrites' output, and the row loads and row cache to real kernels' rows: they
    # are compiled in test_rewrites_real.
    assert done == set(SMALL_SOURCE)


@pytest.fixture(scope="module")
def compiled(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    if NVCC is None:
        pytest.skip("nvcc not on PATH")
    return compile_all(OUTPUTS, tmp_path_factory.mktemp("rewrites"))


@pytest.mark.parametrize("case", list(OUTPUTS))
def test_rewritten_output_compiles(compiled: dict[str, str], case: str) -> None:
    assert compiled[case] == ""
