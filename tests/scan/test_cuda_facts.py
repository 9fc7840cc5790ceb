"""The CUDA extractor on small sources: every kind of fact, exact values."""

from __future__ import annotations

import re

from kfbot.scan.cuda.facts import CPP_KEYWORDS, extract_cuda_facts

TEMPLATED = b"""\
#include "common.cuh"
#define BLOCK 256
namespace ns { namespace inner {
template <int TILE, typename T, int VEC = 4>
__global__ void __launch_bounds__(256, 2) mm(const T* __restrict__ a, T* b, int n) {
  __shared__ float s[TILE][TILE];
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) b[i] = a[i];
}
}}
void launch(float* a, float* b, int n, cudaStream_t st) {
  ns::inner::mm<16, float><<<(n + 255) / 256, BLOCK, 0, st>>>(a, b, n);
  void* args[] = {&a, &b, &n};
  cudaLaunchKernel((const void*)&ns::inner::mm<32, float>, dim3(1), dim3(256), args, 64, st);
}
"""


def test_kernel_definition_fields() -> None:
    facts = extract_cuda_facts("src/t.cu", TEMPLATED)
    (k,) = facts.kernels
    assert (k.name, k.namespace, k.qualified_name, k.line) == (
        "mm", "ns::inner", "ns::inner::mm", 5)
    assert [(t.kind, t.name, t.type, t.default) for t in k.template_params] == [
        ("value", "TILE", "int", None), ("type", "T", None, None), ("value", "VEC", "int", "4")]
    assert [(p.type, p.name) for p in k.params] == [
        ("const T* __restrict__", "a"), ("T*", "b"), ("int", "n")]
    assert k.launch_bounds == ("256", "2")
    assert "TILE" in k.uses and "blockIdx" in k.uses


def test_uses_are_the_words_of_the_kernel_as_a_regular_expression_finds_them() -> None:
    source = """// h\u00e9lper: 0.5f 1e-6f 0x1Fu
__global__ void k(float* __restrict__ o, int n2) {
  const float v = 0.5f * o[0] + 1e-6f + 2.0e+3 - 0x1Fu; int _a1 = n2 % 7;
  o[_a1] = v; /* caf\u00e9 3d_tile x9y */ }
""".encode()
    (k,) = extract_cuda_facts("k.cu", source).kernels
    text = source.decode()[source.decode().index("__global__"):]
    words = set(re.findall(r"[A-Za-z_][A-Za-z0-9_]*", text)) - CPP_KEYWORDS
    assert k.uses == tuple(sorted(words))
    assert {"f", "e", "x1Fu", "d_tile", "x9y", "caf", "n2", "_a1"} <= set(k.uses)


def test_chevron_and_launch_api_sites() -> None:
    facts = extract_cuda_facts("src/t.cu", TEMPLATED)
    chevron, api = facts.launches
    assert (chevron.kernel, chevron.style, chevron.line, chevron.host_function) == (
        "ns::inner::mm", "chevron", 12, "launch")
    assert chevron.template_args == ("16", "float")
    assert (chevron.grid, chevron.block, chevron.shared_mem, chevron.stream) == (
        "(n + 255) / 256", "BLOCK", "0", "st")
    assert chevron.args == ("a", "b", "n")
    assert (api.kernel, api.style, api.line, api.template_args) == (
        "ns::inner::mm", "cudaLaunchKernel", 14, ("32", "float"))
    assert (api.grid, api.block, api.shared_mem, api.stream) == ("dim3(1)", "dim3(256)", "64", "st")


def test_includes_and_host_calls() -> None:
    facts = extract_cuda_facts("src/t.cu", TEMPLATED)
    assert facts.includes == ("common.cuh",)
    # kernel launches are launch sites, not host calls
    assert {c.callee for c in facts.host_calls if not c.reference} == {"cudaLaunchKernel",
                                                                       "dim3"}
    # `args` is handed over as a value, but this file declares no function of that name
    assert {c.callee for c in facts.host_calls if c.reference} == set()


POINTERS = b"""\
namespace a::b { __global__ void nested(float* x) {} }
namespace { __global__ void hidden(float* x) {} }
struct Runner { void run(float* x, bool wide); };
void Runner::run(float* x, bool wide) {
  auto kern = wide ? k_wide<8> : k_narrow<2>;
  kern<<<1, 32>>>(x);
  void (*fp)(float*) = a::b::nested;
  fp<<<1, 1>>>(x);
}
"""


def test_function_pointer_launches_follow_local_variables() -> None:
    facts = extract_cuda_facts("p.cu", POINTERS)
    got = [(s.kernel, s.style, s.template_args, s.host_function) for s in facts.launches]
    assert got == [
        ("k_wide", "function_pointer", ("8",), "Runner::run"),
        ("k_narrow", "function_pointer", ("2",), "Runner::run"),
        ("a::b::nested", "function_pointer", (), "Runner::run"),
    ]


def test_nested_and_anonymous_namespaces() -> None:
    facts = extract_cuda_facts("p.cu", POINTERS)
    assert [(k.name, k.namespace) for k in facts.kernels] == [("nested", "a::b"), ("hidden", "")]


BINDINGS = b"""\
#include <torch/extension.h>
torch::Tensor softmax_cuda(torch::Tensor x);
PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("softmax", &softmax_cuda, "softmax (CUDA)");
  m.def("twice", [](torch::Tensor x) { return ops::twice_launch(x); });
  m.def("scaled", py::overload_cast<torch::Tensor, double>(&scaled<float>));
}
TORCH_LIBRARY(myops, m) { m.def("rowsum(Tensor x) -> Tensor"); }
TORCH_LIBRARY_IMPL(myops, CUDA, m) { m.impl("rowsum", &rowsum_cuda); }
"""


def test_pybind_and_torch_library_bindings() -> None:
    got = [(b.kind, b.name, b.cpp_function, b.module, b.line, b.dispatch_key)
           for b in extract_cuda_facts("b.cpp", BINDINGS).bindings]
    assert got == [
        ("pybind11", "softmax", "softmax_cuda", "TORCH_EXTENSION_NAME", 4, None),
        ("pybind11", "twice", "ops::twice_launch", "TORCH_EXTENSION_NAME", 5, None),
        ("pybind11", "scaled", "scaled", "TORCH_EXTENSION_NAME", 6, None),
        ("torch_library", "rowsum", None, "myops", 8, None),
        ("torch_library_impl", "rowsum", "rowsum_cuda", "myops", 9, "CUDA"),
    ]


TUNABLES = b"""\
#ifndef TILE
#define TILE 16
#endif
#define BLOCK_SIZE (256)
#define NAME_STR "x"
#define SCALE 1.5f
constexpr int kUnroll = 4;
static const int kMinBlocks = 2;
const float kAlpha = 0.5f;
int mutable_count = 3;
__global__ void k(float* x) { constexpr unsigned kVec = 4u; x[0] = TILE; }
"""


def test_tunables_are_numeric_integer_constants() -> None:
    got = [(t.name, t.value, t.kind, t.line)
           for t in extract_cuda_facts("k.cu", TUNABLES).tunables]
    assert got == [
        ("TILE", "16", "ifndef_default", 2),
        ("BLOCK_SIZE", "256", "define", 4),
        ("kUnroll", "4", "constexpr", 7),
        ("kMinBlocks", "2", "const", 8),
        ("kVec", "4u", "constexpr", 11),
    ]


def test_line_offset_shifts_every_line() -> None:
    facts = extract_cuda_facts("ops.py", b"\n__global__ void k(float* x) { }\n"
                               b"void go(float* x) { k<<<1, 1>>>(x); }\n", line_offset=10)
    assert facts.kernels[0].line == 12
    assert facts.launches[0].line == 13


def test_syntax_errors_keep_the_valid_parts() -> None:
    src = b"__global__ void ok_kernel(float* x) { x[0] = 1.0f; }\nvoid broken( { int = ; }}\n"
    facts = extract_cuda_facts("broken.cu", src)
    assert [k.name for k in facts.kernels] == ["ok_kernel"]
    (problem,) = facts.problems
    assert problem.file == "broken.cu" and problem.line == 2
    assert problem.message.startswith("tree-sitter did not understand ")
    assert problem.severity == "info" and "syntax error" not in problem.message


def test_calls_from_device_functions_are_not_host_calls() -> None:
    src = b"__device__ float sq(float v) { return both(v) * v; }\n" \
          b"__host__ __device__ float both(float v) { return fabsf(v); }\n" \
          b"void host() { both(1.0f); }\n"
    facts = extract_cuda_facts("d.cu", src)
    assert [(c.caller, c.callee) for c in facts.host_calls] == [
        ("both", "fabsf"), ("host", "both")]
