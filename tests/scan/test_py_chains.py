"""Python call chains across modules, comparison helpers and script references, on
small repositories written here (the fixtures show the same at full size)."""

from __future__ import annotations

from pathlib import Path

from kfbot.config import Config
from kfbot.scan.model import Kernel, ScanReport
from kfbot.scan.python.facts import extract_python_facts
from kfbot.scan.scanner import scan

KERNELS = """\
__global__ void add_kernel(float* x) {}
__global__ void mul_kernel(float* x) {}
void add(float* x) { add_kernel<<<1, 1>>>(x); }
void mul(float* x) { mul_kernel<<<1, 1>>>(x); }
PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) { m.def("add_fwd", &add); m.def("mul_fwd", &mul); }
"""
SETUP = """\
from setuptools import setup
from torch.utils.cpp_extension import CUDAExtension
setup(ext_modules=[CUDAExtension("pkg._C", ["csrc/k.cu"])])
"""


def _write(root: Path, files: dict[str, str]) -> None:
    for rel, text in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)


def _kernels(report: ScanReport) -> dict[str, Kernel]:
    return {k.name: k for k in report.kernels}


def _paired(root: Path, files: dict[str, str]) -> tuple[ScanReport, dict[str, list[str]]]:
    _write(root, {"csrc/k.cu": KERNELS, "setup.py": SETUP, **files})
    report = scan(root, Config())
    return report, {name: [f"{r.file}:{r.line}" for r in k.references]
                    for name, k in _kernels(report).items()}


def test_a_chain_across_modules_reaches_only_its_own_op(tmp_path: Path) -> None:
    report, paired = _paired(tmp_path, {
        "pkg/__init__.py": "from pkg.api import add\nfrom pkg import api as _api\n",
        "pkg/_fn.py": """\
import torch
from pkg import _C as ops
class AddFn(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        return ops.add_fwd(x)
""",
        "pkg/api.py": "from pkg._fn import AddFn\ndef add(x):\n    return AddFn.apply(x)\n",
        "tests/test_add.py": """\
import torch
from pkg import add
def test_add():
    x = torch.randn(4)
    torch.testing.assert_close(add(x).float(), x + 1)
""",
    })
    assert paired == {"add_kernel": ["tests/test_add.py:5"], "mul_kernel": []}
    (ref,) = _kernels(report)["add_kernel"].references
    assert (ref.op_name, ref.module_hint, ref.target) == ("add_fwd", "pkg._C", "pkg.add")
    assert [(s.kind, s.name, s.file, s.line) for s in ref.chain[:3]] == [
        ("test", "test_add calls add", "tests/test_add.py", 5),
        ("python", "pkg.api.add", "pkg/api.py", 2),
        ("python", "pkg._fn.AddFn.forward", "pkg/_fn.py", 5)]
    assert [s.kind for s in ref.chain[3:]] == ["binding", "launch", "kernel"]
    mul = _kernels(report)["mul_kernel"]
    assert mul.unpaired and "no test or script compares it" in mul.unpaired[0]


def test_a_loop_of_wrappers_is_a_warning(tmp_path: Path) -> None:
    report, paired = _paired(tmp_path, {
        "pkg/__init__.py": "",
        "pkg/a.py": "from pkg.b import g\ndef f(x):\n    return g(x)\n",
        "pkg/b.py": "from pkg.a import f\ndef g(x):\n    return f(x)\n",
        "tests/test_f.py": """\
import torch
from pkg.a import f
def test_f():
    x = torch.randn(4)
    torch.testing.assert_close(f(x), x + 1)
""",
    })
    assert paired == {"add_kernel": [], "mul_kernel": []}
    (loop,) = [p for p in report.problems if "loop" in p.message]
    assert loop.severity == "warning" and loop.file.startswith("pkg/")
    assert "pkg.a.f" in loop.message or "pkg.b.g" in loop.message


def test_partial_method_and_kernel_hub_names(tmp_path: Path) -> None:
    _, paired = _paired(tmp_path, {
        "pkg/__init__.py": "from pkg.ops import Ops, mul\n",
        "pkg/ops.py": """\
import functools
from pkg import _C
def mul(x, k=2):
    return _C.mul_fwd(x)
class Ops:
    def add(self, x):
        return _C.add_fwd(x)
""",
        "tests/test_ops.py": """\
import functools
import torch
import pkg
def test_partial():
    triple = functools.partial(pkg.mul, k=3)
    x = torch.randn(4)
    torch.testing.assert_close(triple(x), x * 3)
def test_method():
    ops = pkg.Ops()
    x = torch.randn(4)
    torch.testing.assert_close(ops.add(x).cpu(), x + 1)
""",
    })
    assert paired == {"add_kernel": ["tests/test_ops.py:11"],
                      "mul_kernel": ["tests/test_ops.py:7"]}


def test_helpers_compare_their_arguments(tmp_path: Path) -> None:
    report, paired = _paired(tmp_path, {
        "pkg/__init__.py": "from pkg import _C\ndef add(x):\n    return _C.add_fwd(x)\n"
                           "def mul(x):\n    return _C.mul_fwd(x)\n",
        "tests/conftest.py": """\
import pytest
import torch
def _check(out, ref):
    torch.testing.assert_close(out.cpu(), ref.cpu())
@pytest.fixture
def check():
    return _check
""",
        "tests/test_h.py": """\
import torch
import pkg
def allclose(a, b, tol=1e-5):
    return (a - b).abs().max().item() <= tol
def test_add(check):
    x = torch.randn(4)
    check(pkg.add(x), x + 1)
def test_mul():
    x = torch.randn(4)
    assert allclose(pkg.mul(x), x * 2)
""",
    })
    assert paired == {"add_kernel": ["tests/test_h.py:7"], "mul_kernel": ["tests/test_h.py:10"]}
    kernels = _kernels(report)
    assert kernels["add_kernel"].references[0].helper == "check (tests/conftest.py:6)"
    assert kernels["mul_kernel"].references[0].helper == "allclose (tests/test_h.py:3)"


def test_scripts_signal_a_mismatch_by_exit_status_or_only_print() -> None:
    checked = extract_python_facts("check.py", b"""\
import sys
import torch
import ext
if __name__ == "__main__":
    x = torch.randn(8)
    ok = torch.allclose(ext.add(x), x + 1)
    sys.exit(0 if ok else 1)
""")
    printed = extract_python_facts("bench.py", b"""\
import torch
import ext
if __name__ == "__main__":
    x = torch.randn(8)
    print("kernel   :", ext.mul(x))
    print("reference:", x * 2)
""")
    (exits,) = checked.references
    (prints,) = printed.references
    assert (exits.kind, exits.test, exits.mismatch_signal) == ("script", "<module>", "exit_status")
    assert (prints.op_name, prints.comparison, prints.mismatch_signal) == (
        "mul", "print", "printed")
    assert prints.confidence <= 0.4 and "compares by printing" in prints.why


def test_gradient_checks_pair_with_the_backward_pass(tmp_path: Path) -> None:
    report, paired = _paired(tmp_path, {
        "pkg/__init__.py": """\
import torch
from pkg import _C
class Fn(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        return _C.add_fwd(x)
    @staticmethod
    def backward(ctx, g):
        return _C.mul_fwd(g)
def op(x):
    return Fn.apply(x)
""",
        "tests/test_grad.py": """\
import torch
from pkg import op
def test_grad():
    x = torch.randn(4, requires_grad=True)
    op(x).sum().backward()
    torch.testing.assert_close(x.grad, torch.full_like(x, 2.0))
""",
    })
    assert paired == {"add_kernel": [], "mul_kernel": ["tests/test_grad.py:6"]}
    assert _kernels(report)["mul_kernel"].references[0].backward


def test_unittest_relative_error_and_an_output_buffer(tmp_path: Path) -> None:
    """marlin's test: `op(A, B, C, ...)` writes C, compared by assertLess on a relative
    mean error; the reference side calls a helper that makes a `pkg.Layer` (a class)."""
    _, paired = _paired(tmp_path, {
        "pkg/__init__.py": "from pkg import _C\nclass Layer:\n    pass\n"
                           "def mul(a, c):\n    _C.mul_fwd(a, c)\n",
        "test.py": """\
import unittest
import torch
import pkg
def weights():
    layer = pkg.Layer()
    return torch.randn(4)
class Test(unittest.TestCase):
    def check(self):
        a = torch.randn(4)
        c = torch.zeros(4)
        ref = a * weights()
        pkg.mul(a, c)
        self.assertLess(torch.mean(torch.abs(c - ref)) / torch.mean(torch.abs(ref)), 1e-3)
    def test_mul(self):
        self.check()
""",
    })
    assert paired == {"add_kernel": [], "mul_kernel": ["test.py:13"]}
