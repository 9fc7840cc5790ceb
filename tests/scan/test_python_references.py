"""The Python extractor's reference tests: which op a test compares with what, on which
shapes and dtypes, through wrappers, helpers, fixtures and imported modules."""

from __future__ import annotations

import pytest
from test_python_facts import _build, _facts

from kfbot.scan.model import PyFileFacts, ReferenceTest
from kfbot.scan.python.facts import extract_python_facts


def _ref(facts: PyFileFacts, test: str) -> ReferenceTest:
    (found,) = [r for r in facts.references if r.test == test]
    return found


# --- reference tests ---------------------------------------------------------------------

PYTEST_FILE = """\
import pytest
import torch
import torch.nn.functional as F
from torch.utils.cpp_extension import load

ext = load(name="softmax_ext", sources=["softmax.cu"])
SHAPES = [(128, 1000), (7, 33)]


def my_softmax(x):
    return ext.softmax(x)


def ref_softmax(x):
    return torch.softmax(x.float(), dim=-1)


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("dtype", [torch.float16, torch.float32])
def test_softmax(shape, dtype):
    x = torch.randn(shape, device="cuda", dtype=dtype)
    out = ext.softmax(x)
    ref = torch.softmax(x, dim=-1)
    torch.testing.assert_close(out, ref, atol=1e-3, rtol=1e-3)


def test_wrapper_and_local_reference():
    x = torch.randn(4, 5, device="cuda").half()
    assert torch.allclose(my_softmax(x), ref_softmax(x))


@pytest.mark.parametrize("M,N", [(16, 32), (64, 128)])
def test_abs_max(M, N):
    x = torch.rand((M, N), device="cuda")
    y = ext.relu(x)
    err = (y - F.relu(x)).abs().max().item()
    assert err < 1e-5


def test_torch_max_abs():
    x = torch.randn(2, 2)
    if torch.max(torch.abs(ext.softmax(x) - torch.softmax(x, 1))) <= 1e-4:
        pass


def test_out_param():
    x = torch.randn(8, device="cuda")
    out = torch.empty_like(x)
    ext.exp_out(x, out)
    torch.testing.assert_close(out, torch.exp(x))


def test_library_op():
    x = torch.randn(3, 3)
    torch.testing.assert_close(torch.ops.myns.gelu(x), F.gelu(x))


def test_runs_without_comparison():
    out = ext.softmax(torch.randn(8, device="cuda"))
    assert out.shape == (8,)


class TestSoftmax:
    def test_method(self):
        x = torch.randn(3, 4)
        torch.testing.assert_close(x.softmax(-1), ext.softmax(x))
"""


def test_pytest_reference_with_parametrized_shapes_and_dtypes() -> None:
    r = _ref(_facts(PYTEST_FILE, "tests/test_softmax.py"), "test_softmax")
    assert (r.file, r.line, r.kind) == ("tests/test_softmax.py", 24, "pytest")
    assert (r.op, r.op_name, r.module_hint) == ("ext.softmax", "softmax", "softmax_ext")
    assert (r.reference, r.comparison) == ("torch.softmax(x, dim=-1)",
                                           "torch.testing.assert_close")
    assert r.shapes == ("(128, 1000)", "(7, 33)")
    assert r.dtypes == ("float16", "float32")
    assert r.confidence == pytest.approx(0.9)
    assert r.why == ("test_softmax compares ext.softmax with torch.softmax(x, dim=-1) "
                     "via torch.testing.assert_close")


def test_wrapper_resolves_to_the_op_and_local_reference_to_its_name() -> None:
    r = _ref(_facts(PYTEST_FILE, "tests/test_softmax.py"), "test_wrapper_and_local_reference")
    assert (r.op, r.op_name, r.module_hint, r.reference, r.comparison) == (
        "ext.softmax", "softmax", "softmax_ext", "ref_softmax", "torch.allclose")
    assert (r.shapes, r.dtypes) == (("(4, 5)",), ("float16",))
    assert r.confidence >= 0.9


def test_abs_max_diff_forms() -> None:
    facts = _facts(PYTEST_FILE, "tests/test_softmax.py")
    r = _ref(facts, "test_abs_max")
    assert (r.op, r.reference, r.comparison) == ("ext.relu", "F.relu(x)", "abs-max-diff")
    assert r.shapes == ("(16, 32)", "(64, 128)")  # M and N come from the same rows
    assert r.line == 37
    r = _ref(facts, "test_torch_max_abs")
    assert (r.op, r.reference, r.comparison, r.shapes) == (
        "ext.softmax", "torch.softmax(x, 1)", "abs-max-diff", ("(2, 2)",))


def test_inputs_are_traced_through_arithmetic_not_every_tensor_in_the_test() -> None:
    source = """\
import torch, kern
def test_scaled():
    w = torch.ones(3, 3)
    x = torch.randn(64, 513, dtype=torch.float16) * 50.0
    torch.testing.assert_close(kern.f(x), x.relu())
"""
    r = _ref(_facts(source, "tests/test_k.py"), "test_scaled")
    assert (r.shapes, r.dtypes) == (("(64, 513)",), ("float16",))


def test_output_argument_and_library_op() -> None:
    facts = _facts(PYTEST_FILE, "tests/test_softmax.py")
    r = _ref(facts, "test_out_param")
    assert (r.op, r.reference, r.shapes) == ("ext.exp_out", "torch.exp(x)", ("(8,)",))
    assert 0.7 <= r.confidence < 0.9
    r = _ref(facts, "test_library_op")
    assert (r.op, r.op_name, r.module_hint, r.reference) == (
        "torch.ops.myns.gelu", "gelu", "myns", "F.gelu(x)")
    assert r.confidence == pytest.approx(0.9)


def test_method_of_test_class_and_operand_order() -> None:
    r = _ref(_facts(PYTEST_FILE, "tests/test_softmax.py"), "TestSoftmax.test_method")
    assert (r.kind, r.op, r.reference) == ("pytest", "ext.softmax", "x.softmax(-1)")


def test_a_test_without_comparison_has_no_reference() -> None:
    tests = {r.test for r in _facts(PYTEST_FILE, "tests/test_softmax.py").references}
    assert "test_runs_without_comparison" not in tests
    assert tests == {"test_softmax", "test_wrapper_and_local_reference", "test_abs_max",
                     "test_torch_max_abs", "test_out_param", "test_library_op",
                     "TestSoftmax.test_method"}


def test_comparison_without_an_op_is_not_a_reference() -> None:
    source = "import torch\ndef test_x():\n    x = torch.ones(2)\n" \
             "    torch.testing.assert_close(x * 2, x + x)\n"
    assert _facts(source, "tests/test_x.py").references == ()


IMPORTS_FILE = """\
import torch
import my_kernels
import softmax_inline
from kernels_demo import ops
from my_pkg import fused_add
from mamba_ops import scan_fn, scan_ref
from torch.testing import assert_close


def test_module_import():
    x = torch.randn(16, 16, device="cuda", dtype=torch.bfloat16)
    assert_close(my_kernels.gemm(x, x), x @ x)


def test_helper_factory():
    ext = softmax_inline.get_ext()
    x = torch.randn(4, 8, device="cuda")
    assert_close(ext.softmax(x), torch.softmax(x, -1))


def test_name_from_local_module():
    x = torch.randn(4, 8, device="cuda")
    assert_close(ops.softmax(x), torch.softmax(x, -1))


def test_imported_function():
    x = torch.randn(32)
    assert torch.equal(fused_add(x, x), x + x)


def test_imported_reference_function():
    u = torch.randn(2, 3)
    assert_close(scan_fn(u), scan_ref(u))
"""
LOCAL_MODULES = {"tests/softmax_inline.py", "kernels_demo.py"}


def test_imported_extension_module() -> None:
    r = _ref(_facts(IMPORTS_FILE, "tests/test_imports.py", LOCAL_MODULES), "test_module_import")
    assert (r.op, r.op_name, r.module_hint, r.reference, r.comparison) == (
        "my_kernels.gemm", "gemm", "my_kernels", "x @ x", "torch.testing.assert_close")
    assert (r.shapes, r.dtypes, r.confidence) == (("(16, 16)",), ("bfloat16",), 0.9)


def test_ops_through_local_helper_modules_have_lower_confidence() -> None:
    facts = _facts(IMPORTS_FILE, "tests/test_imports.py", LOCAL_MODULES)
    r = _ref(facts, "test_helper_factory")
    assert (r.op, r.op_name, r.module_hint, r.confidence) == (
        "ext.softmax", "softmax", "softmax_inline", 0.7)
    r = _ref(facts, "test_name_from_local_module")
    assert (r.op, r.op_name, r.module_hint, r.confidence) == ("ops.softmax", "softmax", "ops",
                                                              0.7)


def test_imported_function_and_imported_reference() -> None:
    facts = _facts(IMPORTS_FILE, "tests/test_imports.py", LOCAL_MODULES)
    r = _ref(facts, "test_imported_function")
    assert (r.op, r.op_name, r.module_hint, r.reference, r.comparison) == (
        "fused_add", "fused_add", "my_pkg", "x + x", "torch.equal")
    assert 0.7 <= r.confidence < 0.9
    r = _ref(facts, "test_imported_reference_function")
    assert (r.op, r.reference) == ("scan_fn", "scan_ref")


def test_unclear_reference_and_two_ops_are_low_confidence() -> None:
    source = """\
import torch
import ext_mod
def test_tie():
    x = torch.randn(3)
    torch.testing.assert_close(ext_mod.fast(x), ext_mod.slow(x))
def test_unclear(expected):
    torch.testing.assert_close(ext_mod.fast(torch.randn(3)), expected)
"""
    facts = _facts(source, "tests/test_low.py")
    tie, unclear = _ref(facts, "test_tie"), _ref(facts, "test_unclear")
    assert (tie.op, tie.reference, tie.confidence) == ("ext_mod.fast", "ext_mod.slow(x)", 0.5)
    assert (unclear.op, unclear.reference, unclear.confidence) == (
        "ext_mod.fast", "expected", 0.5)


UNIT_FILE = """\
import unittest
import numpy as np
import pytest
import torch
import ext_mod
from torch.utils.cpp_extension import load_inline


@pytest.fixture(scope="module")
def ext():
    return load_inline(name="fx", cpp_sources="", cuda_sources="", functions=["add"])


def test_fixture(ext):
    a = torch.ones(3)
    torch.testing.assert_close(ext.add(a, a), a + a)


class Exp(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        return ext_mod.exp_fwd(x)


class TestAdd(unittest.TestCase):
    def setUp(self):
        self.ext = load_inline(name="ut", cpp_sources="", cuda_sources="", functions=["add"])

    def test_add(self):
        a = torch.ones(3)
        self.assertTrue(torch.allclose(self.ext.add(a, a), 2 * a))

    def test_apply(self):
        x = torch.randn(5, 6)
        np.testing.assert_allclose(Exp.apply(x).cpu().numpy(), torch.exp(x).numpy())


def _check(x):
    torch.testing.assert_close(ext_mod.exp_fwd(x), x.exp())


def test_a():
    _check(torch.randn(9))


def test_b():
    _check(torch.randn(10))
"""


def test_fixture_self_attribute_and_autograd_function() -> None:
    facts = _facts(UNIT_FILE, "tests/test_unit.py")
    r = _ref(facts, "test_fixture")
    assert (r.op, r.module_hint, r.reference, r.confidence) == ("ext.add", "fx", "a + a", 0.9)
    r = _ref(facts, "TestAdd.test_add")
    assert (r.op, r.module_hint, r.reference, r.comparison) == (
        "self.ext.add", "ut", "2 * a", "torch.allclose")
    assert _build(facts, "ut").variable == "self.ext"
    r = _ref(facts, "TestAdd.test_apply")
    assert (r.op, r.reference, r.comparison, r.shapes) == (
        "ext_mod.exp_fwd", "torch.exp(x)", "numpy.testing.assert_allclose", ("(5, 6)",))


def test_helper_comparison_is_reported_for_each_calling_test() -> None:
    facts = _facts(UNIT_FILE, "tests/test_unit.py")
    a, b = _ref(facts, "test_a"), _ref(facts, "test_b")
    assert (a.kind, a.op, a.reference, a.shapes) == ("pytest", "ext_mod.exp_fwd", "x.exp()",
                                                     ("(9,)",))
    assert (b.kind, b.shapes) == ("pytest", ("(10,)",))
    assert "_check" not in {r.test for r in facts.references}


SCRIPT_FILE = """\
import itertools
import torch
import kern

x = torch.randn(1024, 256, device="cuda", dtype=torch.float16)


def main():
    for M, N in itertools.product([128, 256], [64]):
        for dt in (torch.float16, torch.bfloat16):
            a = torch.randn(M, N, dtype=dt, device="cuda")
            b = kern.add(a, 1.0)
            assert torch.equal(b, a + 1.0)


if __name__ == "__main__":
    y = kern.gemm(x, x.t())
    ref = x @ x.t()
    if (y - ref).abs().max() > 1e-2:
        print("mismatch")
    main()
"""


def test_script_function_and_module_level_checks() -> None:
    facts = _facts(SCRIPT_FILE, "bench/check.py")
    r = _ref(facts, "main")
    assert (r.kind, r.op, r.module_hint, r.reference, r.comparison) == (
        "script", "kern.add", "kern", "a + 1.0", "torch.equal")
    assert r.shapes == ("(128, 64)", "(256, 64)")
    assert r.dtypes == ("float16", "bfloat16")
    r = _ref(facts, "<module>")
    assert (r.kind, r.op, r.reference, r.comparison, r.line) == (
        "script", "kern.gemm", "x @ x.t()", "abs-max-diff", 19)
    assert (r.shapes, r.dtypes) == (("(1024, 256)",), ("float16",))


def test_test_functions_outside_test_files_are_scripts() -> None:
    source = "import torch, kern\ndef test_x():\n    x = torch.randn(4)\n" \
             "    assert torch.allclose(kern.f(x), x.relu())\n"
    assert _ref(_facts(source, "bench/run.py"), "test_x").kind == "script"
    assert _ref(_facts(source, "tests/run.py"), "test_x").kind == "pytest"
    assert _ref(_facts(source, "pkg/run_test.py"), "test_x").kind == "pytest"


@pytest.mark.parametrize("source", [PYTEST_FILE, UNIT_FILE, SCRIPT_FILE, IMPORTS_FILE])
def test_truncated_test_sources_never_raise(source: str) -> None:
    data = source.encode()
    for end in range(0, len(data), 7):
        facts = extract_python_facts("tests/test_cut.py", data[:end], lambda rel: False)
        assert not [p for p in facts.problems if "could not be analysed" in p.message]
