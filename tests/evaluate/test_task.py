"""Kernel tasks made from the fixture scans."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from kfbot.config import load_config
from kfbot.errors import KfbotError
from kfbot.evaluate.task import KernelTask, make_task
from kfbot.scan.scanner import scan
from kfbot.scan.select import select_kernel

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures"


def task_for(fixture: str, kernel: str) -> KernelTask:
    root = FIXTURES / fixture
    config = load_config(None, root)
    return make_task(select_kernel(scan(root, config).kernels, kernel), root, config)


def test_pybind_task() -> None:
    task = task_for("example", "softmax_kernel")
    assert (task.op.kind, task.op.module, task.op.name) == ("module", "kernels_demo_ext", "softmax")
    assert task.build.name == "kernels_demo_ext"
    assert [r.source for r in task.references] == ["lambda x: torch.softmax(x, dim=-1)"]
    assert task.test_targets == ("tests/test_ops.py::test_softmax",)
    assert task.block == 128  # BLOCK, read through the #define
    assert task.editable_files == ("csrc/softmax.cu",)


def test_torch_library_task() -> None:
    task = task_for("torch_library_layernorm", "layernorm_kernel")
    assert (task.op.kind, task.op.module, task.op.name) == ("torch_op", "kfln", "layernorm")


def test_declared_task_carries_config_facts() -> None:
    task = task_for("declared_task", "square_kernel")
    assert task.declared_shapes == ((1024,), (4096, 33))
    assert task.tolerances == {"float32": (1e-6, 1e-6)}
    assert task.inputs_ref == "inputs:make_inputs"
    assert task.references[0].callable_ref == "ref:square_ref"
    assert task.unusable_references == (
        "tests/test_square.py:15 test_square_matches_reference: "
        "the op call square(*args) uses keywords or *args",)


def test_kernel_without_binding_is_a_clear_error(tmp_path: Path) -> None:
    (tmp_path / "k.cu").write_text("__global__ void lonely(float* x) { x[0] = 1; }\n")
    (tmp_path / "b.py").write_text("from torch.utils.cpp_extension import load\n"
                                   "ext = load(name='e', sources=['k.cu'])\n")
    config = load_config(None, tmp_path)
    (kernel,) = scan(tmp_path, config).kernels
    with pytest.raises(KfbotError, match="no Python binding reaches this kernel"):
        make_task(kernel, tmp_path, config)


def test_a_tests_own_tolerance_widens_the_default_never_narrows_it(tmp_path: Path) -> None:
    """A float32 matmul over k=2048 differs from a float64 reference by more than kfbot's
    default near zero; the repository's test says `atol=1e-3`, and that is what it means."""
    root = tmp_path / "repo"
    shutil.copytree(FIXTURES / "naive_matmul", root)
    config = load_config(None, root)
    kernel = select_kernel(scan(root, config).kernels, "matmul_kernel")
    assert make_task(kernel, root, config).tolerances == {"float32": (1e-3, 1e-4)}
    test = root / "tests" / "test_matmul.py"
    test.write_text(test.read_text().replace("rtol=1e-4, atol=1e-3", "rtol=1e-9, atol=0"))
    kernel = select_kernel(scan(root, config).kernels, "matmul_kernel")
    assert make_task(kernel, root, config).tolerances == {"float32": (1e-4, 1e-4)}
