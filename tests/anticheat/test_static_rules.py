"""Static anti-cheating rules: each rule catches what it names and lets honest code be."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path

import pytest

from kfbot.anticheat import static_builtin
from kfbot.anticheat.findings import Finding
from kfbot.anticheat.rules import BUILTIN_CHECKS, Rule, load_rules, rules_dir
from kfbot.anticheat.static import static_findings
from kfbot.anticheat.units import Source, StaticInput
from kfbot.errors import KfbotError

KERNEL = "csrc/gelu_kernel.cu"
# A kernel, its launcher and the Torch binding, as a small extension writes them. The
# `// @device`, `// @host` and `// @top` lines are where the tests put their code.
ORIGINAL = """\
#include <torch/extension.h>
#include <cuda_runtime.h>
// @top

__global__ void gelu_kernel(const float* x, float* y, int64_t n) {
    int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) {
        float v = x[i];
        // @device
        y[i] = 0.5f * v * (1.0f + tanhf(0.7978845608f * (v + 0.044715f * v * v * v)));
    }
}

torch::Tensor gelu(torch::Tensor x) {
    TORCH_CHECK(x.is_cuda(), "gelu: x must be a CUDA tensor");
    TORCH_CHECK(x.scalar_type() == torch::kFloat32, "gelu: x must be float32");
    const at::cuda::OptionalCUDAGuard guard(x.device());
    auto xc = x.contiguous();
    auto y = torch::empty_like(xc);
    const int64_t n = xc.numel();
    const int threads = 256;
    const int blocks = (int)((n + threads - 1) / threads);
    auto stream = at::cuda::getCurrentCUDAStream();
    // @host
    gelu_kernel<<<blocks, threads, 0, stream>>>(xc.data_ptr<float>(), y.data_ptr<float>(), n);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
    return y;
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
    m.def("gelu", &gelu, "tanh-approximate GELU");
}
"""


def edit(where: str, code: str, base: str = ORIGINAL) -> str:
    """The original with `code` on the line after the `// @where` marker."""
    marker = f"// @{where}\n"
    assert marker in base
    indent = base.split(marker)[0].rsplit("\n", 1)[-1]
    return base.replace(marker, f"{marker}{indent}{code}\n")


def run(candidate: str, original: str = ORIGINAL, *, rules: tuple[Rule, ...] | None = None,
        changed: Mapping[str, tuple[str | None, str]] | None = None,
        allowed: tuple[str, ...] = (KERNEL,), original_flags: tuple[str, ...] = (),
        candidate_flags: tuple[str, ...] = (),
        op_dtypes: tuple[str, ...] = ("float32",)) -> list[Finding]:
    """Static findings for one edited unit, csrc/gelu_kernel.cu."""
    inp = StaticInput(original=(Source(KERNEL, original),), candidate=(Source(KERNEL, candidate),),
                      changed={KERNEL: (original, candidate)} if changed is None else changed,
                      allowed=allowed, original_flags=original_flags,
                      candidate_flags=candidate_flags, op_dtypes=op_dtypes)
    return static_findings(inp, rules)


def ids(findings: list[Finding]) -> set[str]:
    return {f.check for f in findings}


def line_of(text: str, needle: str) -> int:
    return next(i for i, line in enumerate(text.split("\n"), 1) if needle in line)


POSITIVE = [
    ("library-call", "host", "y = at::gelu(x);"),
    ("library-call", "host", "auto z = xc.matmul(y);"),
    ("library-call", "host", "y.copy_(xc);"),
    ("library-call", "host", "auto f = &::at::gelu;"),
    ("library-call", "host", "cublasSgemm(h, CUBLAS_OP_N, CUBLAS_OP_T, m, n, k, a, p, m, q, k);"),
    ("library-call", "host", "thrust::transform(thrust::device, p, p + n, q, op);"),
    ("library-call", "host", "cub::DeviceReduce::Sum(tmp, bytes, p, q, n);"),
    ("library-call", "host", "auto g = cutlass::gemm::device::Gemm<float, L, float, L>();"),
    ("library-call", "host", "TORCH_CHECK(at::allclose(y, xc));"),  # inside a macro's arguments
    ("library-call", "top", "#define GELU(t) at::gelu(t)"),  # inside a macro's body
    ("library-call", "top", "namespace A = at;"),
    ("library-call", "top", "using namespace at;"),
    ("concurrency", "host", "cudaStream_t side; cudaStreamCreate(&side);"),
    ("concurrency", "host", "cudaDeviceSynchronize();"),
    ("concurrency", "host", "if (cudaStreamQuery(stream) == cudaErrorNotReady) return y;"),
    ("concurrency", "host", "std::thread worker([] {});"),
    ("concurrency", "host", "auto side = at::cuda::getStreamFromPool();"),
    ("concurrency", "host", "at::cuda::CUDAStreamGuard sg(side);"),
    ("persistent-state", "host", "static int calls = 0;"),
    ("persistent-state", "host", "static float* last_y = nullptr;"),
    ("persistent-state", "host", "thread_local int seen = 0;"),
    ("persistent-state", "host", "static const torch::Tensor cached = xc.clone();"),
    ("persistent-state", "top", "__device__ float cache[16];"),
    ("persistent-state", "top", "__managed__ int hits = 0;"),
    ("persistent-state", "top", "static torch::Tensor last_out;"),
    ("persistent-state", "top", "namespace { const float* last_x = nullptr; }"),
    ("persistent-state", "top", "struct Memo { static torch::Tensor out; };"),
    ("file-or-env-access", "host", 'const char* v = std::getenv("PYTEST_CURRENT_TEST");'),
    ("file-or-env-access", "host", 'FILE* f = fopen("/tmp/y.bin", "rb");'),
    ("file-or-env-access", "host", 'std::ifstream in("y.bin");'),
    ("device-printf", "device", 'printf("%f\\n", v);'),
    ("precision-downcast", "device", "__half h = __float2half(v);"),
    ("precision-downcast", "device", "__nv_bfloat16 b = __float2bfloat16_rn(v);"),
    ("precision-downcast", "host", "auto opts = xc.options().dtype(at::kHalf);"),
    ("exception-fallback", "host",
     "try { TORCH_CHECK(n % 4 == 0); } catch (const std::exception&) { return y; }"),
    ("timer-or-grader-access", "host", "auto t0 = std::chrono::steady_clock::now();"),
    ("timer-or-grader-access", "host", "cudaEventElapsedTime(&ms, start, stop);"),
    ("timer-or-grader-access", "host", 'py::module_::import("torch");'),
    ("timer-or-grader-access", "host", 'void* sym = dlsym(RTLD_DEFAULT, "cudaLaunchKernel");'),
    ("l2-persistence", "host",
     "cudaStreamSetAttribute(stream, cudaStreamAttributeAccessPolicyWindow, &attr);"),
    ("l2-persistence", "host", "cudaDeviceSetLimit(cudaLimitPersistingL2CacheSize, bytes);"),
]

NEGATIVE = [
    ("library-call", "host", "auto z = torch::empty_like(x);"),
    ("library-call", "host", "auto w = torch::zeros({n}, xc.options().dtype(torch::kFloat32));"),
    ("library-call", "host", "auto d = x.size(0) + x.stride(0) + x.dim() + x.numel();"),
    ("library-call", "host", "TORCH_CHECK(x.is_contiguous() && x.device().is_cuda());"),
    ("library-call", "host", "float* p = xc.data_ptr<float>(); auto t = x.scalar_type();"),
    ("library-call", "host", "auto raw = c10::cuda::getCurrentCUDAStream().stream();"),
    ("library-call", "host", "std::vector<at::Tensor> outs; at::Tensor t2;"),
    ("library-call", "host", "// return at::gelu(x);"),
    ("library-call", "host", 'const char* msg = "at::gelu(x) is the reference";'),
    ("library-call", "device", "v = acc.add(v);"),  # a device struct's method, not a tensor's
    ("library-call", "device", "typedef cub::BlockReduce<float, 256> BlockReduce;"),
    ("concurrency", "host", "cudaError_t err = cudaGetLastError();"),
    ("concurrency", "host", "cudaStream_t raw = at::cuda::getCurrentCUDAStream().stream();"),
    ("persistent-state", "host", "static const int kThreads = 256;"),
    ("persistent-state", "host", "static constexpr float kAlpha = 0.5f;"),
    ("persistent-state", "host", "static const float kTable[] = {1.0f, 2.0f};"),
    ("persistent-state", "device", "static __shared__ float tile[256];"),
    ("persistent-state", "top", "__constant__ float kCoeffs[4];"),
    ("persistent-state", "top", "constexpr int kBlock = 256;"),
    ("persistent-state", "top", "const float kScale = 0.5f;"),
    ("persistent-state", "top", "extern __shared__ float smem[];"),
    ("persistent-state", "top", "torch::Tensor gelu_fast(torch::Tensor x);"),
    ("persistent-state", "top", "float* make_buffer(int n);"),
    ("persistent-state", "top", "static __device__ float sq(float v) { return v; }"),
    ("persistent-state", "top", "struct Cfg { static constexpr int kB = 256; static int f(); };"),
    ("file-or-env-access", "host", "bool open = blocks > 0;"),
    ("device-printf", "host", 'printf("launching %d blocks\\n", blocks);'),
    ("precision-downcast", "device", "const float half = 0.5f * v;"),
    ("exception-fallback", "host", "/* try { } catch (...) { } */"),
    ("timer-or-grader-access", "device", "long long t0 = clock();"),  # device clock: host rule
    ("l2-persistence", "host",
     "cudaFuncSetAttribute(gelu_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, 0);"),
]


@pytest.mark.parametrize(("rule", "where", "code"), POSITIVE)
def test_rule_catches(rule: str, where: str, code: str) -> None:
    candidate = edit(where, code)
    found = [f for f in run(candidate) if f.check == rule]
    assert found, f"{rule} missed: {code}"
    first = found[0]
    assert first.layer == "static" and first.severity == "strict"
    line = line_of(candidate, code.split("\n")[0])
    assert first.evidence.startswith(f"{KERNEL}:{line}: ")
    assert "new in the candidate" in first.reason


@pytest.mark.parametrize(("rule", "where", "code"), NEGATIVE)
def test_rule_lets_honest_code_be(rule: str, where: str, code: str) -> None:
    found = [f for f in run(edit(where, code)) if f.check == rule]
    assert not found, [f.line() for f in found]


def test_unchanged_candidate_has_no_findings() -> None:
    assert run(ORIGINAL) == []


def test_a_call_the_original_had_may_stay_but_not_multiply() -> None:
    original = edit("host", "auto ref = at::gelu(x);")
    moved = edit("host", "auto   ref = at :: gelu( x ); // moved and reformatted", ORIGINAL)
    assert "library-call" not in ids(run(moved, original))
    twice = edit("host", "auto again = at::gelu(xc);", original)
    found = [f for f in run(twice, original) if f.check == "library-call"]
    assert len(found) == 1
    assert "`at::gelu` is new in the candidate" in found[0].reason
    assert found[0].evidence == f"{KERNEL}:{line_of(twice, 'again')}: auto again = at::gelu(xc);"


def test_comments_and_strings_neither_hide_nor_fake() -> None:
    fake = edit("host", '/* cudaStreamCreate(&s); */ const char* s = "std::getenv(\\"X\\")";')
    assert run(fake) == []
    hidden = edit("host", "y = at::/* harmless */gelu(x);")
    assert "library-call" in ids(run(hidden))


def test_each_text_is_reported_once_with_its_first_location() -> None:
    candidate = edit("host", "y = at::gelu(x);\n    y = at::gelu(y);")
    found = [f for f in run(candidate) if f.check == "library-call"]
    assert len(found) == 1
    assert found[0].evidence.startswith(f"{KERNEL}:{line_of(candidate, 'at::gelu(x)')}:")


def test_nested_names_are_one_hit() -> None:
    found = run(edit("host", "auto side = at::cuda::getStreamFromPool(true);"))
    assert [(f.check, f.reason.split("`")[1]) for f in found] == [
        ("concurrency", "at::cuda::getStreamFromPool")]
    found = run(edit("host", "auto s = at::cuda::blas::gemm<float>(a, b);"))
    assert [(f.check, f.reason.split("`")[1]) for f in found] == [
        ("library-call", "at::cuda::blas::gemm<float>")]


def test_inline_source_lines_are_shifted_into_the_python_file() -> None:
    path = "softmax_inline.py#cuda_sources"
    candidate = edit("host", "y = at::gelu(x);")
    inp = StaticInput(original=(Source(path, ORIGINAL, 7),),
                      candidate=(Source(path, candidate, 7),), changed={}, allowed=())
    (shifted,) = static_findings(inp)
    assert shifted.evidence.startswith(f"{path}:{line_of(candidate, 'at::gelu') + 7}:")


def test_a_candidate_that_does_not_parse_is_still_checked() -> None:
    broken = edit("host", "y = at::gelu(x) +;\n    if (n > {") + "\n}}}"
    assert "library-call" in ids(run(broken))


def test_precision_rule_only_for_float32_ops() -> None:
    candidate = edit("device", "__half h = __float2half(v);")
    assert "precision-downcast" in ids(run(candidate, op_dtypes=("torch.float32", "float64")))
    assert "precision-downcast" not in ids(run(candidate, op_dtypes=("float16",)))
    # Without dtypes the original decides: one that already uses half is not a float32 op.
    assert "precision-downcast" in ids(run(candidate, op_dtypes=()))
    half_original = edit("top", "__device__ __half one() { return __float2half(1.0f); }")
    half_candidate = edit("device", "__half h = __float2half(v);", half_original)
    assert "precision-downcast" not in ids(run(half_candidate, half_original, op_dtypes=()))


# --- built-in checks ---------------------------------------------------------------------

COPY_KERNEL = """
__global__ void copy_kernel(const float* x, float* y, int64_t n) {
    int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = x[i];
}
"""


def test_unlaunched_kernel() -> None:
    cheat = edit("top", COPY_KERNEL).replace("gelu_kernel<<<", "copy_kernel<<<")
    found = [f for f in run(cheat) if f.check == "unlaunched-kernel"]
    assert len(found) == 1 and "`gelu_kernel`" in found[0].reason
    assert found[0].evidence.startswith(f"{KERNEL}:{line_of(cheat, '__global__ void gelu')}:")
    # Renamed, or launched through a pointer, or templated: the kernel is still launched.
    renamed = ORIGINAL.replace("gelu_kernel", "gelu_vec_kernel")
    pointer = ORIGINAL.replace("gelu_kernel<<<", "auto k = gelu_kernel;\n    k<<<")
    templated = ORIGINAL.replace("__global__", "template <int U>\n__global__").replace(
        "gelu_kernel<<<", "gelu_kernel<4><<<")
    for honest in (renamed, pointer, templated):
        assert "unlaunched-kernel" not in ids(run(honest))
    # Only taking its address for an attribute does not launch it.
    attr_only = cheat.replace("// @host", "cudaFuncSetAttribute(gelu_kernel, a, 0);")
    assert "unlaunched-kernel" in ids(run(attr_only))


def test_no_kernel_launch() -> None:
    launch = "gelu_kernel<<<blocks, threads, 0, stream>>>"
    cheat = ORIGINAL.replace(launch, "cudaMemcpyAsync").replace(
        "(xc.data_ptr<float>(), y.data_ptr<float>(), n);",
        "(y.data_ptr<float>(), xc.data_ptr<float>(), n * 4, cudaMemcpyDeviceToDevice, stream);")
    found = [f for f in run(cheat) if f.check == "no-kernel-launch"]
    assert len(found) == 1 and found[0].evidence == KERNEL
    api = cheat.replace("// @host", "void* args[] = {&n}; cudaLaunchKernel((void*)gelu_kernel, "
                        "blocks, threads, args, 0, stream);")
    assert not {"no-kernel-launch", "unlaunched-kernel"} & ids(run(api))


def test_fast_math_is_a_warning_for_new_flags_only() -> None:
    found = [f for f in run(ORIGINAL, original_flags=("-O3",),
                            candidate_flags=("-O3", "--use_fast_math", "-Xcompiler=-ffast-math"))
             if f.check == "fast-math"]
    assert len(found) == 1 and found[0].severity == "warn"
    assert "`--use_fast_math -ffast-math`" in found[0].reason
    assert "task's own tolerance" in found[0].reason
    assert run(ORIGINAL, original_flags=("-use_fast_math",),
               candidate_flags=("--use_fast_math",)) == []


def test_edit_outside_task() -> None:
    changed = {KERNEL: (ORIGINAL, ORIGINAL), "tests/test_gelu.py": ("atol=1e-4", "atol=1e3"),
               "setup.py": (None, "import os")}
    found = [f for f in run(ORIGINAL, changed=changed) if f.check == "edit-outside-task"]
    assert len(found) == 1 and found[0].evidence == "setup.py, tests/test_gelu.py"
    same = {KERNEL: (ORIGINAL, ORIGINAL), "tests/test_gelu.py": ("x", "x")}
    assert run(ORIGINAL, changed=same) == []


PY = '''\
from torch.utils.cpp_extension import load_inline

cuda_src = r"""
__global__ void k(float* y) { y[0] = 1.0f; }
"""


def load_ext(name):
    return load_inline(name=f"ext_{name}", cuda_sources=cuda_src, extra_cuda_cflags=["-O3"])
'''


def python_run(candidate: str) -> list[Finding]:
    path = "softmax_inline.py"
    return [f for f in run(ORIGINAL, changed={path: (PY, candidate)}, allowed=(path,))
            if f.check == "python-edit"]


def test_python_edit_allows_string_contents_only() -> None:
    strings = PY.replace("y[0] = 1.0f;", "y[0] = 2.0f;").replace("ext_", "fast_").replace(
        '"-O3"', '"-O2"')
    assert python_run(strings) == []
    code = PY.replace("    return load_inline", "    if name == 'x':\n        return None\n"
                      "    return load_inline")
    (found,) = python_run(code)
    assert found.severity == "strict"
    assert found.evidence.startswith(f"softmax_inline.py:{line_of(code, 'if name')}:")
    bad = PY + "\ndef oops(:\n"
    (broken,) = python_run(bad)
    assert "does not parse" in broken.reason
    assert broken.evidence == f"softmax_inline.py:{line_of(bad, 'oops')}: def oops(:"


def test_large_fresh_units_are_read_whole() -> None:
    """Three 200-line units, original and candidate, none from the cache: the one library
    call the candidate adds is found. (What this costs is printed by
    `bench/static_checks.py`: performance is a bench's figure, not a test's.)"""
    def units(tag: str) -> tuple[Source, ...]:
        body = "".join(ORIGINAL.replace("gelu", f"gelu{i}") for i in range(6))  # ~200 lines
        return tuple(Source(f"csrc/u{i}.cu", f"// {tag}\n{body}") for i in range(3))

    original = units("fresh")
    candidate = tuple(Source(s.path, edit("host", "y = at::gelu(x);", s.text))
                      for s in original)
    fresh = StaticInput(original=original, candidate=candidate, changed={}, allowed=())
    found = static_findings(fresh)
    assert [f.check for f in found] == ["library-call"]
    assert sum(s.text.count("\n") for s in fresh.original) >= 550


# --- the rule file -----------------------------------------------------------------------

RULE_IDS = {
    "library-call", "concurrency", "persistent-state", "file-or-env-access", "device-printf",
    "precision-downcast", "exception-fallback", "timer-or-grader-access", "l2-persistence",
    "unlaunched-kernel", "no-kernel-launch", "fast-math", "edit-outside-task", "python-edit",
    "size-special-case", "size-literal",
}


def test_shipped_rules_load() -> None:
    rules = load_rules()
    assert {r.id for r in rules} == RULE_IDS
    assert rules_dir().joinpath("anticheat.yaml").is_file()
    assert {r.id: r.severity for r in rules}["fast-math"] == "warn"
    assert all(r.pattern_scopes for r in rules if r.query is not None)
    assert set(static_builtin.CHECKS) == BUILTIN_CHECKS
    assert load_rules() is load_rules()  # read once per process


GOOD = """\
- id: my-rule
  severity: strict
  what: catches x
  why: x is bad
  query: |
    ((identifier) @hit (#eq? @hit "forbidden"))
"""


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "anticheat.yaml"
    path.write_text(text)
    return path


@pytest.mark.parametrize(("change", "problem"), [
    (lambda t: t + "  colour: red\n", "unknown key(s) colour"),
    (lambda t: t.replace("  why: x is bad\n", ""), "missing why"),
    (lambda t: t.replace("severity: strict", "severity: fatal"), "`severity` is 'fatal'"),
    (lambda t: t.replace('(#eq? @hit "forbidden"))', '(#eq? @hit "forbidden")'),
     "does not compile"),
    (lambda t: t.replace("(identifier) @hit (#eq? @hit", "(no_such_node) @hit (#eq? @hit"),
     "does not compile"),
    (lambda t: t.replace("@hit", "@other"), "no @hit capture"),
    (lambda t: t.replace('(#eq? @hit "forbidden")', '(#set! scope "host")'), "#set!"),
    (lambda t: t + "  scope: kernel\n", "`scope` is 'kernel'"),
    (lambda t: t + "  mode: sometimes\n", "`mode` is 'sometimes'"),
    (lambda t: t + "  check: no-kernel-launch\n", "exactly one of `query` and `check`"),
    (lambda t: t.replace("  query: |\n    ((identifier) @hit (#eq? @hit \"forbidden\"))\n",
                         "  check: no-such-check\n"), "unknown built-in check 'no-such-check'"),
])
def test_rule_file_errors_name_file_and_rule(tmp_path: Path, change: Callable[[str], str],
                                             problem: str) -> None:
    path = write(tmp_path, change(GOOD))
    with pytest.raises(KfbotError) as err:
        load_rules(path)
    message = str(err.value)
    assert message.startswith(f"{path}: rule my-rule: "), message
    assert problem in message


def test_rule_file_errors_without_an_id_name_the_index(tmp_path: Path) -> None:
    path = write(tmp_path, GOOD + GOOD.replace("- id: my-rule\n", "- ids: x\n"))
    with pytest.raises(KfbotError, match=r"rule #2: unknown key\(s\) ids"):
        load_rules(path)
    with pytest.raises(KfbotError, match="the id is used twice"):
        load_rules(write(tmp_path, GOOD + GOOD))
    with pytest.raises(KfbotError, match="expected a list of rules"):
        load_rules(write(tmp_path, "id: x\n"))


def test_custom_rules_scope_and_mode(tmp_path: Path) -> None:
    text = GOOD.replace('"forbidden"', '"v"') + "  scope: device\n  mode: always\n"
    rules = load_rules(write(tmp_path, text))
    found = run(ORIGINAL, rules=rules)  # unchanged code: `always` reports what is there
    assert [f.check for f in found] == ["my-rule"]
    assert found[0].evidence.startswith(f"{KERNEL}:{line_of(ORIGINAL, 'float v = x[i]')}:")
    host_only = load_rules(write(tmp_path, text.replace("scope: device", "scope: host")))
    assert run(ORIGINAL, rules=host_only) == []


# --- sizes compared with literals -----------------------------------------------------


def test_a_size_changed_at_a_literal_size_is_rejected_with_its_line() -> None:
    candidate = edit("device", "if (n == 4096 && i == 0) n /= 2;")
    found = [f for f in run(candidate) if f.check.startswith("size-")]
    assert [(f.check, f.severity) for f in found] == [("size-special-case", "strict")]
    line = line_of(candidate, "n /= 2")
    assert found[0].evidence == f"{KERNEL}:{line}: if (n == 4096 && i == 0) n /= 2;"
    assert found[0].reason.startswith("`if (n == 4096 && i == 0) n /= 2;` changes n when it "
                                      "is == 4096")
    also = run(edit("host", "int64_t m = xc.numel(); m = (m == 8192) ? 4096 : m;"))
    assert "size-special-case" in ids(also)


@pytest.mark.parametrize(("where", "code", "said"), [
    ("host", "if (n <= 1024) { /* one block */ }", "`n <= 1024` is new in the candidate"),
    ("host", "if (xc.size(0) == 8192) return xc;", "`xc.size(0) == 8192` is new"),
    ("top", "#define BIG 65536\nbool big(int64_t rows) { return rows >= BIG; }",
     "`rows >= 65536` is new"),
])
def test_a_new_size_literal_is_a_warning(where: str, code: str, said: str) -> None:
    found = [f for f in run(edit(where, code)) if f.check.startswith("size-")]
    assert [(f.check, f.severity) for f in found] == [("size-literal", "warn")]
    assert said in found[0].reason


@pytest.mark.parametrize("code", [
    "if (threadIdx.x < 32) { v = v * 1.0f; }",  # a thread index, not a size
    "if (n == 1) { v = v * 1.0f; }",  # 0 and 1: the degenerate cases
    "for (int offset = 16; offset > 0; offset >>= 1) { v = v + 0.0f; }",
    "if (i < n) { v = v * 1.0f; }",  # a size against a size
])
def test_comparisons_that_are_not_size_literals_pass(code: str) -> None:
    assert not {f.check for f in run(edit("device", code))} & {"size-literal",
                                                                "size-special-case"}


def test_a_size_literal_the_original_had_is_not_new() -> None:
    original = edit("host", "if (n <= 1024) { /* one block */ }")
    moved = edit("host", "if (n<=1024) {}\n    // moved", ORIGINAL)
    assert "size-literal" not in ids(run(moved, original))
    twice = edit("host", "if (n <= 1024) { /* again */ }", original)
    assert [f.check for f in run(twice, original) if f.check == "size-literal"] == \
        ["size-literal"]
