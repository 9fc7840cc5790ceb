"""C++/CUDA facts real repositories need: kernel attributes the grammar does not know,
registration forms, calls resolved by namespace, launches inside macros, and the
conditions under which an op runs one kernel or another."""

from __future__ import annotations

from pathlib import Path

from kfbot.config import Config
from kfbot.scan.cuda.facts import extract_cuda_facts
from kfbot.scan.cuda.macros import split_args, substitute
from kfbot.scan.model import Kernel, MacroDef, ScanReport
from kfbot.scan.scanner import scan

ATTRIBUTES = b"""\
namespace ops {
struct P { const float* x; float* y; };
__global__ void __launch_bounds__(256) bounded(const float* x) {}
__global__ void __cluster_dims__(2, 1, 1) clustered(const float* x) {}
__global__ void __maxnreg__(64) capped(const float* x) {}
__global__ void __launch_bounds__(128) __maxnreg__(32) both(int n) {}
__global__ void constant(const __grid_constant__ P p) {}
}
extern "C" __global__ void plain_c(int n) {}
#if USE_FAST
__global__ void __cluster_dims__(CX, 1, 1) fast(int n) {}
#else
__global__ void slow(int n) {}
#endif
"""


def test_kernel_attributes_never_hide_the_name() -> None:
    facts = extract_cuda_facts("k.cu", ATTRIBUTES)
    kernels = {k.name: k for k in facts.kernels}
    assert list(kernels) == ["bounded", "clustered", "capped", "both", "constant", "plain_c",
                             "fast", "slow"]
    assert facts.problems == ()  # the attributes were set aside, not parsed as errors
    assert kernels["bounded"].launch_bounds == ("256",)
    assert kernels["clustered"].attributes == ("__cluster_dims__(2, 1, 1)",)
    assert kernels["capped"].attributes == ("__maxnreg__(64)",)
    assert (kernels["both"].launch_bounds, kernels["both"].attributes) == (
        ("128",), ("__maxnreg__(32)",))
    assert kernels["constant"].params[0].type == "const __grid_constant__ P"
    assert kernels["plain_c"].extern_c and not kernels["bounded"].extern_c
    assert kernels["fast"].preprocessor == ("#if USE_FAST",)
    assert kernels["fast"].attributes == ("__cluster_dims__(CX, 1, 1)",)
    assert kernels["slow"].preprocessor == ("#else of #if USE_FAST",)
    assert kernels["clustered"].line == 4 and kernels["fast"].line == 11


REGISTRATIONS = b"""\
#define MY_NS myops
TORCH_LIBRARY_EXPAND(MY_NS, m) {
  m.def("a(Tensor x) -> Tensor");
  m.impl("a", torch::kCUDA, &ns::a_forward);
}
TORCH_LIBRARY_FRAGMENT(myops, m) { m.def("b(Tensor x) -> Tensor"); }
TORCH_LIBRARY_IMPL_EXPAND(MY_NS, CUDA, m) {
  m.impl("b", &adapter<ns::b_launch, 4>);
  m.impl("c", torch::dispatch(c10::DispatchKey::CUDA, TORCH_FN(ns::c_forward)));
}
STABLE_TORCH_LIBRARY_IMPL_EXPAND(MY_NS, CUDA, ops) {
  ops.impl("d", TORCH_BOX(&d_forward));
}
"""


def test_registration_forms() -> None:
    facts = extract_cuda_facts("reg.cpp", REGISTRATIONS)
    found = [(b.kind, b.module, b.name, b.cpp_function, b.dispatch_key, b.reaches)
             for b in facts.bindings]
    assert found == [
        ("torch_library", "MY_NS", "a", None, None, ()),
        ("torch_library", "MY_NS", "a", "ns::a_forward", "CUDA", ()),
        ("torch_library", "myops", "b", None, None, ()),
        ("torch_library_impl", "MY_NS", "b", "adapter", "CUDA", ("ns::b_launch",)),
        ("torch_library_impl", "MY_NS", "c", "ns::c_forward", "CUDA", ()),
        ("torch_library_impl", "MY_NS", "d", "d_forward", "CUDA", ()),
    ]
    assert ("MY_NS", "myops") in facts.aliases


def _write(root: Path, files: dict[str, str]) -> None:
    for rel, text in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)


def _kernels(report: ScanReport) -> dict[str, Kernel]:
    return {k.name: k for k in report.kernels}


SAME_NAMES = {
    "ops.h": "\n".join(
        f"namespace ops {{ namespace {op} {{ void launch(float* x, int n); "
        f"void launch_naive(float* x, int n); }} }}" for op in ("a", "b", "c")),
    **{f"{op}.cu": f"""#include "ops.h"
namespace ops {{ namespace {op} {{
__global__ void {op}_kernel(float* x, int n) {{}}
__global__ void {op}_naive_kernel(float* x, int n) {{}}
void launch(float* x, int n) {{ {op}_kernel<<<1, 32>>>(x, n); }}
void launch_naive(float* x, int n) {{ {op}_naive_kernel<<<1, 32>>>(x, n); }}
}} }}
""" for op in ("a", "b", "c")},
    "bind.cpp": """#include "ops.h"
namespace ops {
namespace a {
void forward(float* x, int n) { if (n > 1024) launch(x, n); else launch_naive(x, n); }
}
namespace b {
using Fn = void (*)(float*, int);
void forward(float* x, int n, long algo) { Fn f = algo == 0 ? &launch_naive : &launch; f(x, n); }
}
template <void (*L)(float*, int)> void adapter(float* x, int n) { L(x, n); }
}
PYBIND11_MODULE(ops_ext, m) {
  m.def("a", &ops::a::forward);
  m.def("b", &ops::b::forward);
  m.def("c", &ops::adapter<ops::c::launch>);
}
""",
}


def test_calls_resolve_by_namespace_and_reach_their_own_kernels(tmp_path: Path) -> None:
    _write(tmp_path, SAME_NAMES)
    kernels = _kernels(scan(tmp_path, Config()))
    ops = {name: sorted(b.name for b in k.bindings) for name, k in kernels.items()}
    assert ops == {"a_kernel": ["a"], "a_naive_kernel": ["a"], "b_kernel": ["b"],
                   "b_naive_kernel": ["b"], "c_kernel": ["c"], "c_naive_kernel": []}
    (size,) = kernels["a_kernel"].dispatch
    assert (size.op, size.conditions, size.by) == ("ops_ext.a", ("if (n > 1024)",), ("size",))
    assert sorted(size.kernels) == ["a.cu::ops::a::a_kernel", "a.cu::ops::a::a_naive_kernel"]
    (algo,) = kernels["b_naive_kernel"].dispatch
    assert (algo.conditions, algo.arguments, algo.by) == (
        ("if (algo == 0)",), ("algo",), ("argument",))
    assert kernels["c_kernel"].dispatch == ()  # one kernel per op: nothing to choose


MACROS = {
    "launch.cuh": """#pragma once
#define LAUNCH_1D(K, N, ...) K<<<((N) + 255) / 256, 256>>>(__VA_ARGS__)
#define TWICE(K, N, ...) LAUNCH_1D(K, N, __VA_ARGS__); LAUNCH_1D(K, N, __VA_ARGS__)
#define NAMED(SUFFIX) void run_##SUFFIX(float* x, int n)
#define LOOP(K) LOOP(K)
""",
    "k.cu": """#include "launch.cuh"
namespace m {
__global__ void add_kernel(float* x, int n) {}
__global__ void mul_kernel(float* x, int n) {}
void add(float* x, int n) { LAUNCH_1D(add_kernel, n, x, n); }
void mul(float* x, int n) { TWICE(mul_kernel, n, x, n); }
void spin(float* x) { LOOP(add_kernel); }
}
PYBIND11_MODULE(m_ext, mod) { mod.def("add", &m::add); mod.def("mul", &m::mul); }
""",
}


def test_launches_inside_macros_defined_in_a_header(tmp_path: Path) -> None:
    _write(tmp_path, MACROS)
    report = scan(tmp_path, Config())
    kernels = _kernels(report)
    (add,) = kernels["add_kernel"].launch_sites
    assert (add.file, add.line, add.host_function, add.grid, add.block) == (
        "k.cu", 5, "m::add", "((n) + 255) / 256", "256")
    assert add.macro == "LAUNCH_1D (launch.cuh:2)"
    assert [s.line for s in kernels["mul_kernel"].launch_sites] == [6, 6]  # nested, twice
    assert [b.name for b in kernels["add_kernel"].bindings] == ["add"]
    assert [b.name for b in kernels["mul_kernel"].bindings] == ["mul"]
    (loop,) = [p for p in report.problems if "LOOP" in p.message]
    assert (loop.file, loop.line) == ("k.cu", 7)
    assert "expands to itself (LOOP -> LOOP)" in loop.message


def test_macro_substitution_follows_the_preprocessor() -> None:
    named = MacroDef("NAMED", ("A", "B"), "void f_##A(int B) { g(#A, B); }", "h.h", 1)
    assert substitute(named, ["x", "n"]) == 'void f_x(int n) { g("x", n); }'
    variadic = MacroDef("V", ("K", "..."), "K(__VA_ARGS__)", "h.h", 2)
    assert substitute(variadic, ["k", "a", "f(b, c)"]) == "k(a, f(b, c))"
    # `##` pastes with the blanks around it gone, each one, in a row too.
    pasted = MacroDef("P", ("A", "B"), "A ## _\t##  B + A##B ## ## A", "h.h", 3)
    assert substitute(pasted, ["x", "n"]) == "x_n + xnx"
    assert split_args(' a, f(b, c), "x,y", d ') == ["a", "f(b, c)", '"x,y"', "d"]
