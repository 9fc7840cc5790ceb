"""Cross-file linking on small synthetic repositories: exact kernels and facts."""

from __future__ import annotations

import _thread
from pathlib import Path
from typing import Any

import pytest

from kfbot.config import Config
from kfbot.scan.model import Kernel, ScanReport
from kfbot.scan.scanner import scan


def _repo(root: Path, files: dict[str, str]) -> Path:
    for rel, text in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return root


def _by_id(report: ScanReport) -> dict[str, Kernel]:
    return {k.id: k for k in report.kernels}


HEADER_REPO = {
    "include/scale.cuh": """\
#pragma once
namespace fwd {
template <typename T, int VEC>
__global__ void scale_kernel(T* x, T a, int n) { int i = threadIdx.x; if (i < n) x[i] *= a; }
}
namespace bwd {
template <typename T>
__global__ void scale_kernel(T* g, T a, int n) { int i = threadIdx.x; if (i < n) g[i] *= a; }
}
""",
    "csrc/forward.cu": """\
#include "../include/scale.cuh"
namespace fwd {
void scale_forward(float* x, float a, int n, bool wide) {
  if (wide) scale_kernel<float, 4><<<1, 256>>>(x, a, n);
  else scale_kernel<float, 1><<<1, 128>>>(x, a, n);
}
}
""",
    "csrc/backward.cu": """\
#include "scale.cuh"
void scale_backward(float* g, float a, int n) {
  bwd::scale_kernel<float><<<1, 256>>>(g, a, n);
}
""",
    "csrc/bind.cpp": """\
#include <torch/extension.h>
namespace fwd { void scale_forward(float*, float, int, bool); }
void scale_backward(float*, float, int);
torch::Tensor fwd_op(torch::Tensor x) { fwd::scale_forward(nullptr, 1.0f, 0, false); return x; }
torch::Tensor bwd_op(torch::Tensor g) { scale_backward(nullptr, 1.0f, 0); return g; }
PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("scale_forward", &fwd_op);
  m.def("scale_backward", &bwd_op);
}
""",
    "scale_ops.py": """\
from torch.utils.cpp_extension import load
ext = load(name="scale_ext", sources=["csrc/bind.cpp", "csrc/forward.cu", "csrc/backward.cu"],
           extra_include_paths=["include"], extra_cuda_cflags=["-O3", "-DUNUSED=3"])
""",
    "tests/test_scale.py": """\
import torch
from scale_ops import ext

def test_forward():
    x = torch.randn(1000, device="cuda")
    out = ext.scale_forward(x.clone())
    torch.testing.assert_close(out, x * 1.0)
""",
}


@pytest.fixture(scope="module")
def header_report(tmp_path_factory: pytest.TempPathFactory) -> ScanReport:
    return scan(_repo(tmp_path_factory.mktemp("hdr"), HEADER_REPO), Config())


def test_same_name_in_two_namespaces(header_report: ScanReport) -> None:
    kernels = _by_id(header_report)
    assert sorted(kernels) == ["include/scale.cuh::bwd::scale_kernel",
                               "include/scale.cuh::fwd::scale_kernel"]


def test_header_kernel_reached_through_launchers(header_report: ScanReport) -> None:
    fwd = _by_id(header_report)["include/scale.cuh::fwd::scale_kernel"]
    assert [(s.file, s.line, s.host_function, s.template_args) for s in fwd.launch_sites] == [
        ("csrc/forward.cu", 4, "fwd::scale_forward", ("float", "4")),
        ("csrc/forward.cu", 5, "fwd::scale_forward", ("float", "1")),
    ]
    bwd = _by_id(header_report)["include/scale.cuh::bwd::scale_kernel"]
    assert [(s.file, s.line) for s in bwd.launch_sites] == [("csrc/backward.cu", 3)]
    assert fwd.editable_files == ("csrc/forward.cu", "include/scale.cuh")


def test_bindings_follow_host_calls_and_take_the_build_name(header_report: ScanReport) -> None:
    kernels = _by_id(header_report)
    fwd = kernels["include/scale.cuh::fwd::scale_kernel"]
    bwd = kernels["include/scale.cuh::bwd::scale_kernel"]
    assert [(b.name, b.module, b.cpp_function) for b in fwd.bindings] == [
        ("scale_forward", "scale_ext", "fwd_op")]
    assert [(b.name, b.module) for b in bwd.bindings] == [("scale_backward", "scale_ext")]
    assert [(b.kind, b.name, b.file) for b in fwd.builds] == [("load", "scale_ext", "scale_ops.py")]


def test_template_tunables_carry_the_values_used(header_report: ScanReport) -> None:
    fwd = _by_id(header_report)["include/scale.cuh::fwd::scale_kernel"]
    tunables = {(t.name, t.kind): t for t in fwd.tunables}
    assert tunables[("VEC", "template_arg")].values_seen == ("1", "4")
    assert ("UNUSED", "build_flag") not in tunables  # not used by the kernel
    assert {t.value for t in fwd.tunables if t.kind == "launch_config"} == {"128", "256"}


def test_reference_pairs_with_the_bound_kernel_only(header_report: ScanReport) -> None:
    kernels = _by_id(header_report)
    (ref,) = kernels["include/scale.cuh::fwd::scale_kernel"].references
    assert (ref.file, ref.test, ref.op_name, ref.reference) == (
        "tests/test_scale.py", "test_forward", "scale_forward", "x * 1.0")
    assert ref.confidence >= 0.7
    assert kernels["include/scale.cuh::bwd::scale_kernel"].references == ()


TWO_EXTENSIONS = {
    "ext_a/k.cu": "__global__ void kernel(float* x) { x[0] = 1; }\n"
                  "void run_a(float* x) { kernel<<<1, 1>>>(x); }\n",
    "ext_b/k.cu": "#define WIDTH 64\n__global__ void kernel(float* x) { x[0] = WIDTH; }\n"
                  "void run_b(float* x) { kernel<<<1, 1>>>(x); }\n",
}


def test_same_kernel_name_in_unrelated_files_links_locally(tmp_path: Path) -> None:
    kernels = _by_id(scan(_repo(tmp_path, TWO_EXTENSIONS), Config()))
    a, b = kernels["ext_a/k.cu::kernel"], kernels["ext_b/k.cu::kernel"]
    assert [s.host_function for s in a.launch_sites] == ["run_a"]
    assert [s.host_function for s in b.launch_sites] == ["run_b"]
    assert [(t.name, t.value, t.kind) for t in b.tunables] == [
        ("WIDTH", "64", "define"), ("run_b:block", "1", "launch_config")]
    assert [(t.name, t.kind) for t in a.tunables] == [("run_a:block", "launch_config")]


TORCH_LIBRARY_REPO = {
    "csrc/rowsum.cu": """\
#include <torch/extension.h>
__global__ void rowsum_kernel(const float* x, float* y, int cols) { }
torch::Tensor rowsum_cuda(torch::Tensor x) {
  auto y = torch::empty({x.size(0)}, x.options());
  rowsum_kernel<<<x.size(0), 128>>>(x.data_ptr<float>(), y.data_ptr<float>(), x.size(1));
  return y;
}
TORCH_LIBRARY(myops, m) { m.def("rowsum(Tensor x) -> Tensor"); }
TORCH_LIBRARY_IMPL(myops, CUDA, m) { m.impl("rowsum", &rowsum_cuda); }
""",
    "build_ops.py": """\
import torch.utils.cpp_extension
torch.utils.cpp_extension.load(name="myops_lib", sources=["csrc/rowsum.cu"],
                               is_python_module=False)
""",
    "test_rowsum.py": """\
import torch
import build_ops

def test_rowsum():
    x = torch.randn(64, 33, device="cuda")
    torch.testing.assert_close(torch.ops.myops.rowsum(x), x.sum(dim=1))
""",
}


def test_torch_library_ops_and_references(tmp_path: Path) -> None:
    (k,) = scan(_repo(tmp_path, TORCH_LIBRARY_REPO), Config()).kernels
    assert [(b.kind, b.name, b.module, b.dispatch_key) for b in k.bindings] == [
        ("torch_library", "rowsum", "myops", None),
        ("torch_library_impl", "rowsum", "myops", "CUDA")]
    (ref,) = k.references
    assert (ref.op_name, ref.module_hint, ref.reference) == ("rowsum", "myops", "x.sum(dim=1)")


INLINE_REPO = {
    "softmax_inline.py": '''\
from torch.utils.cpp_extension import load_inline

cuda_src = """
__global__ void softmax_kernel(const float* x, float* y, int cols) {
  int row = blockIdx.x;
}
torch::Tensor softmax(torch::Tensor x) {
  auto y = torch::empty_like(x);
  softmax_kernel<<<x.size(0), 1>>>(x.data_ptr<float>(), y.data_ptr<float>(), x.size(1));
  return y;
}
"""
cpp_src = "torch::Tensor softmax(torch::Tensor x);"
ext = load_inline(name="inline_softmax", cpp_sources=cpp_src, cuda_sources=cuda_src,
                  functions=["softmax"])
''',
    "tests/test_softmax.py": """\
import torch
from softmax_inline import ext

def test_softmax():
    x = torch.randn(7, 33, device="cuda")
    torch.testing.assert_close(ext.softmax(x), torch.softmax(x, dim=-1))

def test_shape_only():
    assert ext.softmax(torch.randn(2, 2, device="cuda")).shape == (2, 2)
""",
}


def test_inline_kernel_lines_bindings_and_reference(tmp_path: Path) -> None:
    (k,) = scan(_repo(tmp_path, INLINE_REPO), Config()).kernels
    assert (k.id, k.definition.line) == ("softmax_inline.py::softmax_kernel", 4)
    assert [(s.line, s.host_function) for s in k.launch_sites] == [(9, "softmax")]
    assert [(b.name, b.module) for b in k.bindings] == [("softmax", "inline_softmax")]
    assert [(b.kind, b.name, b.inline) for b in k.builds] == [
        ("load_inline", "inline_softmax", True)]
    assert [(r.test, r.reference) for r in k.references] == [
        ("test_softmax", "torch.softmax(x, dim=-1)")]


def test_kernel_without_reference_is_reported_as_such(tmp_path: Path) -> None:
    repo = dict(INLINE_REPO)
    repo["tests/test_softmax.py"] = "from softmax_inline import ext\n\ndef test_runs():\n" \
                                    "    assert ext.softmax is not None\n"
    (k,) = scan(_repo(tmp_path, repo), Config()).kernels
    assert k.references == ()


def _many_files(count: int) -> dict[str, str]:
    """`count` extensions: a kernel, its launcher and binding, and a test of the op."""
    files = {}
    for i in range(count):
        files[f"pkg{i % 7}/csrc/op{i}.cu"] = f"""\
#define BLOCK_{i} {32 * (1 + i % 4)}
__global__ void op{i}_kernel(float* x, int n) {{ if (threadIdx.x < n) x[threadIdx.x] = 0; }}
void op{i}_cuda(float* x, int n) {{ op{i}_kernel<<<1, BLOCK_{i}>>>(x, n); }}
PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {{ m.def("op{i}", &op{i}_cuda); }}
"""
        files[f"pkg{i % 7}/tests/test_op{i}.py"] = f"""\
import torch
from torch.utils.cpp_extension import load
ext = load(name="ext{i}", sources=["pkg{i % 7}/csrc/op{i}.cu"])
def test_op{i}():
    x = torch.randn({i + 1}, 8, device="cuda")
    torch.testing.assert_close(ext.op{i}(x), torch.zeros_like(x))
"""
    return files


def test_a_pool_of_workers_reports_what_one_process_does(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from kfbot.scan import scanner

    pools: list[int] = []
    start_pool = scanner._start_pool

    def counted(jobs: int) -> Any:
        pools.append(jobs)
        return start_pool(jobs)

    monkeypatch.setattr(scanner, "_start_pool", counted)
    count = scanner.PARALLEL_THRESHOLD  # twice as many files: a pool is started
    root = _repo(tmp_path, _many_files(count))
    seen: list[tuple[int, int]] = []
    pooled = scan(root, Config(), jobs=2, progress=lambda done, total: seen.append((done, total)))
    assert pools == [2]
    assert pooled == scan(root, Config(), jobs=1)
    assert pools == [2]  # none for one job
    assert pooled.files_scanned == 2 * count and len(pooled.kernels) == count
    assert all(k.bindings and k.references for k in pooled.kernels)
    assert seen[-1] == (2 * count, 2 * count)
    assert [done for done, _ in seen] == sorted(done for done, _ in seen)


@pytest.mark.skipif(not Path("/proc/self/task").is_dir(), reason="threads counted by /proc")
def test_beside_a_thread_threading_does_not_list_the_pool_spawns(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # A library's native thread (a cluster client's) may hold a lock at a fork, and a
    # forked worker would wait on it for ever. One `_thread` starts is as unlisted.
    from kfbot.scan import scanner
    from kfbot.scan.forked import fork_safe

    kinds: list[str] = []
    start_pool = scanner._start_pool

    def recorded(jobs: int) -> Any:
        pool = start_pool(jobs)
        kinds.extend(type(worker).__name__ for worker in pool._pool)  # type: ignore[attr-defined]
        return pool

    monkeypatch.setattr(scanner, "_start_pool", recorded)
    root = _repo(tmp_path, _many_files(scanner.PARALLEL_THRESHOLD // 2))
    held = _thread.allocate_lock()
    held.acquire()
    _thread.start_new_thread(held.acquire, ())  # waits until released, then ends
    try:
        assert not fork_safe()
        pooled = scan(root, Config(), jobs=2)
    finally:
        held.release()
    assert kinds == ["SpawnProcess", "SpawnProcess"]  # fresh workers import the scan anew
    assert pooled == scan(root, Config(), jobs=1)
