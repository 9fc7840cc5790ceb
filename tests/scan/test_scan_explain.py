"""`kfbot scan --explain <kernel>`: the chain from a test to the kernel, link by link,
or the first link the scan could not follow."""

from __future__ import annotations

from pathlib import Path

import pytest

from kfbot.cli import main

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures"


def _explain(root: Path, kernel: str, capsys: pytest.CaptureFixture[str]) -> str:
    assert main(["scan", str(root), "--explain", kernel]) == 0
    return capsys.readouterr().out


def test_the_chain_of_each_reference(capsys: pytest.CaptureFixture[str]) -> None:
    out = _explain(FIXTURES / "pkg_chain", "gelu_bwd_kernel", capsys)
    lines = out.splitlines()
    assert lines[0] == "csrc/gelu.cu::fusedact::gelu_bwd_kernel  (csrc/gelu.cu:26)"
    assert "  bound       fusedact._C.gelu_bwd -> gelu_backward (csrc/bindings.cpp:49)" in lines
    assert lines[lines.index("  built       setup_py fusedact._C (setup.py:29)") + 1].startswith(
        "              cannot tell: setup.py:29: `Ext = CUDAExtension if with_cuda")
    kinds = {"test", "python", "binding", "host", "launch", "kernel"}
    chain = [line.split()[:2] for line in lines if line[:2] == "  " and line.split()[0] in kinds]
    assert chain == [["test", "tests/test_gelu.py:26"], ["python", "fusedact/functional.py:10"],
                     ["python", "fusedact/_autograd.py:17"],
                     ["binding", "csrc/bindings.cpp:49"], ["host", "csrc/bindings.cpp:28"],
                     ["launch", "csrc/gelu.cu:55"], ["kernel", "csrc/gelu.cu:26"]]
    assert "reference 1 of 1: tests/test_gelu.py:26 test_fused_gelu_backward" in out
    assert "compared by check (tests/conftest.py:11)" in out


def test_dispatch_is_explained(capsys: pytest.CaptureFixture[str]) -> None:
    out = _explain(FIXTURES / "torch_ops_multi", "rowmax_naive_kernel", capsys)
    assert "dispatch: op kfops.rowmax runs this kernel when `case at::kDouble of switch " \
           "(xc.scalar_type())` (csrc/rowmax.cu:57; dtype); otherwise " \
           "csrc/rowmax.cu::kfops::rowmax::rowmax_warp_kernel" in out


def test_where_pairing_stops(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "k.cu").write_text(
        "__global__ void lonely_kernel(float* x) {}\n"
        "void run(float* x) { lonely_kernel<<<1, 1>>>(x); }\n"
        "PYBIND11_MODULE(lonely_ext, m) { m.def(\"run\", &run); }\n")
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "__init__.py").write_text("from lonely import go\n")
    (tmp_path / "test_run.py").write_text(
        "import torch\nimport pkg\n\ndef test_run():\n    x = torch.ones(2)\n"
        "    torch.testing.assert_close(pkg.go(x), x)\n")
    out = _explain(tmp_path, "lonely_kernel", capsys)
    assert "NO REFERENCE TEST. The first link the scan could not follow:" in out
    assert "  k.cu:3: op lonely_ext.run reaches this kernel, but no test or script compares" in out
    assert ("  test_run.py:6: test_run calls pkg.go; the first link not followed: "
            "pkg/__init__.py:1: `lonely.go`: module `lonely` is neither a Python file of the "
            "repository nor an extension it builds") in out


def test_an_unknown_kernel_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["scan", str(FIXTURES / "pkg_chain"), "--explain", "gelu_fwd"]) == 2
    assert "close matches: gelu_fwd_kernel" in capsys.readouterr().err
