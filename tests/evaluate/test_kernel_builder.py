"""The Hugging Face kernel-builder layout without the builder: kfbot writes the
`registration.h` the repository lacks, renames the namespace the build defines as
TORCH_EXTENSION_NAME, and stages `torch-ext/<name>/` with a generated `_ops.py`, so
that the repository's own tests import the package and reach kfbot's build.

The end-to-end test builds a CPU op (torch's library header only: seconds) in a
kernel-builder repository written here, and captures what its tests call.
"""

from __future__ import annotations

import subprocess
from dataclasses import replace
from pathlib import Path

import pytest

from kfbot.evaluate.build import Builder, BuildRequest
from kfbot.evaluate.build.layouts.kernel_builder import REGISTRATION_H
from kfbot.evaluate.capture.signature import TensorSpec
from kfbot.evaluate.engine import Engine, EngineSettings
from kfbot.evaluate.task import EXTENSION_NAMESPACE, KernelTask, OpBinding
from kfbot.scan.model import BuildRecipe

FIXTURE = Path(__file__).resolve().parents[2] / "fixtures" / "kernel_builder"
# As the scan reads fixtures/kernel_builder/build.toml: [kernel.rms_norm] src and
# cuda-flags, [torch] src.
KB_NORM = BuildRecipe(
    kind="load", name="kb_norm", file="build.toml", line=1,
    sources=("kb_norm/norm.h", "kb_norm/rms_norm.cu", "kb_norm/fused_add_rms_norm.cu",
             "kb_norm/norm_torch.cpp", "torch-ext/torch_binding.cpp",
             "torch-ext/torch_binding.h"),
    extra_cuda_cflags=("-DKB_NORM_THREADS=256",),
)


@pytest.fixture(scope="module")
def builder(tmp_path_factory: pytest.TempPathFactory) -> Builder:
    return Builder(tmp_path_factory.mktemp("kfbot-build"), arch="90", jobs=2)


def test_the_builder_s_header_is_written_and_the_namespace_renamed(builder: Builder) -> None:
    staging = builder.stage(BuildRequest(KB_NORM, FIXTURE, tag="c1"))
    assert staging.sources == ("kb_norm/rms_norm.cu", "kb_norm/fused_add_rms_norm.cu",
                               "kb_norm/norm_torch.cpp", "torch-ext/torch_binding.cpp")
    assert (staging.directory / "torch-ext" / "registration.h").read_text() == REGISTRATION_H
    assert not (FIXTURE / "torch-ext" / "registration.h").exists()  # the checkout: untouched
    binding = (staging.directory / "torch-ext" / "torch_binding.cpp").read_text()
    assert "TORCH_LIBRARY_EXPAND(kb_norm_kfbot_kfc1, ops)" in binding
    assert "TORCH_LIBRARY_IMPL_EXPAND(kb_norm_kfbot_kfc1, CUDA, ops)" in binding
    assert "REGISTER_EXTENSION(TORCH_EXTENSION_NAME)" in binding  # the entry point stays
    assert staging.python_module
    assert staging.library_namespaces[EXTENSION_NAMESPACE] == "kb_norm_kfbot_kfc1"


KERNEL_CPP = """\
#include <ATen/core/Tensor.h>
// The kernel's host entry point; a CPU op here, so that it builds without a GPU.
void twice(at::Tensor& out, const at::Tensor& x) { out.copy_(x.mul(2)); }
"""
BINDING_CPP = """\
#include <torch/library.h>

#include "registration.h"

void twice(at::Tensor& out, const at::Tensor& x);

TORCH_LIBRARY_EXPAND(TORCH_EXTENSION_NAME, ops) {
  ops.def("twice(Tensor! out, Tensor x) -> ()");
}

TORCH_LIBRARY_IMPL_EXPAND(TORCH_EXTENSION_NAME, CPU, ops) {
  ops.impl("twice", &twice);
}

REGISTER_EXTENSION(TORCH_EXTENSION_NAME)
"""
FILES = {
    "build.toml": '[general]\nname = "kbx"\n\n[torch]\nsrc = ["torch-ext/torch_binding.cpp"]'
                  '\n\n[kernel.twice]\nbackend = "cuda"\nsrc = ["kbx/twice.cpp"]\n',
    "kbx/twice.cpp": KERNEL_CPP,
    "torch-ext/torch_binding.cpp": BINDING_CPP,
    "torch-ext/kbx/__init__.py": "import torch\n\nfrom ._ops import ops\n\n\n"
                                 "def twice(x):\n    out = torch.empty_like(x)\n"
                                 "    ops.twice(out, x)\n    return out\n",
    "tests/test_twice.py": "import torch\n\nimport kbx\n\n\ndef test_twice():\n"
                           "    x = torch.arange(6.0).reshape(2, 3)\n"
                           "    torch.testing.assert_close(kbx.twice(x), x * 2)\n",
}


def test_the_tests_import_the_package_and_reach_kfbot_s_build(tmp_path: Path) -> None:
    root = tmp_path / "repo"
    for rel, text in FILES.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)
    subprocess.run(["git", "init", "-q"], cwd=root, check=True)
    recipe = replace(KB_NORM, name="kbx", extra_cuda_cflags=(),
                     sources=("kbx/twice.cpp", "torch-ext/torch_binding.cpp"))
    task = KernelTask(
        kernel_id="kbx/twice.cu::twice_kernel", kernel_name="twice_kernel", root=root,
        build=recipe, op=OpBinding("torch_op", EXTENSION_NAMESPACE, "twice"), references=(),
        unusable_references=(), test_targets=("tests/test_twice.py::test_twice",),
        editable_files=("kbx/twice.cpp",),
    )
    settings = EngineSettings(cache_dir=tmp_path / "cache", capture_timeout_s=120)
    with Engine(task, settings) as engine:
        steps = {s.step: s for s in engine.prepare_baseline()}
        signatures = engine.signatures()
    assert steps["build"].outcome == "ok", steps["build"]
    assert steps["import"].summary == \
        "the op was found (kfbot's build of kbx, kbx._kfbot_ext, kbx._ops)"
    assert steps["capture"].outcome == "ok", steps["capture"]
    (sig,) = signatures
    assert sig.op == "torch.ops.kbx_kfbot.twice"
    out, x = sig.args
    assert isinstance(x, TensorSpec) and x.shape == (2, 3) and (x.min, x.max) == (0.0, 5.0)
    assert isinstance(out, TensorSpec) and out.shape == (2, 3)
    assert sorted(p.name for p in (root / "torch-ext" / "kbx").iterdir()) == ["__init__.py"]
