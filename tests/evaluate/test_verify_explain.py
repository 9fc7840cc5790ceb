"""`kfbot verify --explain` from the command line: the environment first (CUDA torch,
driver, nvcc, pytest, the tests' imports), in a second and before any build; then each
step with its outcome, the failed one with its evidence and the kfbot.yaml that would
get past it; every line within the terminal's width; the checkout left as it was."""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from kfbot.config import Config
from kfbot.evaluate.baseline.machine import environment_step
from kfbot.evaluate.task import KernelTask, make_task
from kfbot.scan.scanner import scan
from kfbot.scan.select import select_kernel

KERNEL = """\
__global__ void twice_kernel(const float* x, float* y, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) y[i] = 2.0f * x[i] +;
}

void launch_twice(const float* x, float* y, int n) {
  twice_kernel<<<(n + 255) / 256, 256>>>(x, y, n);
}
"""
BINDING = """\
#include <pybind11/pybind11.h>
#include <cstdint>

void launch_twice(const float* x, float* y, int n);

void twice(std::uintptr_t x, std::uintptr_t y, int n) {
  launch_twice(reinterpret_cast<const float*>(x), reinterpret_cast<float*>(y), n);
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) { m.def("twice", &twice); }
"""
SETUP = """\
from setuptools import setup
from torch.utils.cpp_extension import BuildExtension, CUDAExtension

setup(name="twice_ext", ext_modules=[CUDAExtension("twice_ext", ["csrc/bind.cpp", "csrc/twice.cu"],
      extra_compile_args={"nvcc": ["-O3", "--use_fast_math"]})],
      cmdclass={"build_ext": BuildExtension})
"""
TEST = """\
import torch
import twice_ext


def test_twice():
    x = torch.randn(1000, device="cuda")
    y = torch.empty_like(x)
    twice_ext.twice(x.data_ptr(), y.data_ptr(), x.numel())
    torch.testing.assert_close(y, x * 2)
"""


def _repository(tmp_path: Path, test: str = TEST) -> Path:
    root = tmp_path / "repo"
    for rel, text in {"csrc/twice.cu": KERNEL, "csrc/bind.cpp": BINDING, "setup.py": SETUP,
                      "tests/test_twice.py": test}.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)
    subprocess.run(["git", "init", "-q"], cwd=root, check=True)
    return root


def _explain(root: Path, tmp_path: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "KFBOT_CACHE": str(tmp_path / "cache"), "COLUMNS": "80"}
    return subprocess.run([sys.executable, "-m", "kfbot", "verify", "twice_kernel", "--repo",
                           str(root), "--explain"], capture_output=True, text=True, env=env,
                          timeout=600)


def _task(root: Path) -> KernelTask:
    report = scan(root, Config())
    return make_task(select_kernel(report.kernels, "twice_kernel"), root, Config(),
                     report.kernels)


def _runs_kernels(tmp_path: Path) -> bool:
    # Its summary names the driver whether or not one is here: its outcome says which.
    return environment_step(_task(_repository(tmp_path / "probe"))).outcome == "ok"


@pytest.mark.gpu
def test_explain_names_the_failed_step_with_its_evidence(tmp_path: Path) -> None:
    if not _runs_kernels(tmp_path):
        pytest.skip("needs a CUDA build of torch and an NVIDIA driver")
    root = _repository(tmp_path)
    before = _hashes(root)
    done = _explain(root, tmp_path)
    assert done.returncode == 1, done.stderr
    assert done.stdout, done.stderr
    assert all(len(line) <= 80 for line in done.stdout.splitlines()), done.stdout
    lines = [line.strip() for line in done.stdout.splitlines()]
    assert lines[0].startswith("environment  ok  CUDA torch, an NVIDIA driver and nvcc")
    said = " ".join(done.stdout.split())
    assert "pair ok 1 test calls the op: tests/test_twice.py::test_twice" in said
    assert "build FAILED setup_py twice_ext (setup.py:4): the original does not build at " \
           "the compile stage" in said
    assert any(line.startswith("| csrc/twice.cu:3:") for line in lines)
    snippet = done.stdout[done.stdout.index("kfbot.yaml that would get past this step:"):]
    assert "kernel: csrc/twice.cu::twice_kernel" in snippet
    assert 'extra_cuda_cflags: ["-O3", "--use_fast_math"]' in snippet
    assert lines[-4:] == ["import  skipped  not run: the build step failed",
                          "capture  skipped  not run: the build step failed",
                          "reference  skipped  not run: the build step failed",
                          "comparison  skipped  not run: the build step failed"]
    assert _hashes(root) == before


def test_without_cuda_the_environment_is_said_first_and_nothing_is_built(
        tmp_path: Path) -> None:
    if _runs_kernels(tmp_path):
        pytest.skip("this machine can run kernels: the environment step passes")
    root = _repository(tmp_path)
    before = _hashes(root)
    started = time.monotonic()
    done = _explain(root, tmp_path)
    assert time.monotonic() - started < 30  # a build of torch's headers alone takes 40 s
    assert done.returncode == 1, done.stderr
    lines = done.stdout.splitlines()
    too_long = [line for line in lines if len(line) > 80]
    assert not too_long, too_long
    assert lines[0].startswith("environment  FAILED  this machine lacks ")
    said = " ".join(done.stdout.split())
    assert "nothing can get past the later steps without it" in said
    assert "kfbot.yaml" not in done.stdout  # no config fixes a machine
    assert [line.split()[:2] for line in lines[-6:]] == [
        [step, "skipped"] for step in ("pair", "build", "import", "capture", "reference",
                                       "comparison")]
    assert not (tmp_path / "cache" / "build").exists()  # nothing was built
    assert _hashes(root) == before


def test_the_tests_imports_are_checked_by_their_own_names(tmp_path: Path) -> None:
    test = ("import torch\nimport twice_ext\nimport helpers\nimport kfbot_no_such_module\n"
            "try:\n    import kfbot_optional_module\nexcept ImportError:\n    pass\n\n"
            "def test_twice():\n    import kfbot_later_module\n"
            + TEST.split("def test_twice():\n")[1])
    root = _repository(tmp_path, test)
    (root / "tests" / "helpers.py").write_text("X = 1\n")  # the repository's own
    (root / "tests" / "conftest.py").write_text("import kfbot_fixture_module\n")
    step = environment_step(_task(root))
    assert step.failed and step.suggestion == ""
    assert "kfbot_later_module, kfbot_no_such_module (which tests/test_twice.py imports)" \
        in step.summary
    assert "kfbot_fixture_module (which tests/conftest.py imports)" in step.summary
    assert "kfbot_optional_module" not in step.summary + step.evidence
    assert "helpers" not in step.summary and "twice_ext" not in step.summary


FIXTURES = Path(__file__).resolve().parents[2] / "fixtures"


def _explain_kernel(root: Path, kernel: str, cache: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "KFBOT_CACHE": str(cache), "COLUMNS": "200"}
    return subprocess.run([sys.executable, "-m", "kfbot", "verify", kernel, "--repo",
                           str(root), "--explain"], capture_output=True, text=True, env=env,
                          timeout=300)


def test_a_build_it_cannot_tell_is_a_failed_step_with_its_evidence(tmp_path: Path) -> None:
    """No setup.py, no load(): what used to stop with an error and no steps."""
    root = tmp_path / "repo"
    shutil.copytree(FIXTURES / "setup_rowsum", root)
    (root / "setup.py").unlink()
    done = _explain_kernel(root, "rowsum_kernel", tmp_path / "cache")
    assert done.returncode == 1, done.stderr
    lines = [line.strip() for line in done.stdout.splitlines()]
    assert lines[0] == ("pair  ok  1 test calls the op: "
                        "tests/test_rowsum.py::test_rowsum_matches_torch")
    assert lines[1].startswith("build  FAILED  kfbot cannot tell how this kernel is built: "
                               "no setup.py, pyproject.toml, load() or load_inline() the scan "
                               "could read compiles rowsum_kernel.cu")
    assert "| bound by rowsum.cpp:20 (pybind11 TORCH_EXTENSION_NAME.rowsum)" in lines
    snippet = done.stdout[done.stdout.index("kfbot.yaml that would get past this step:"):]
    # The repository's own names: the module its test imports, the files that hold the
    # kernel and the binding that reaches it.
    assert "name: rowsum_ext" in snippet
    assert "sources: [rowsum.cpp, rowsum_kernel.cu]" in snippet
    assert [line.split("  ")[0] for line in lines if "  " in line and not
            line.startswith(("|", "tasks", "-", "kernel", "build:", "kind", "name", "sources",
                             "extra", "evidence", "kfbot.yaml"))] == \
        ["pair", "build", "import", "capture", "reference", "comparison"]
    assert lines[-1] == "comparison  skipped  not run: the build step failed"
    assert "kfbot: error" not in done.stderr


def test_a_kernel_no_binding_reaches_fails_at_the_pair_step(tmp_path: Path) -> None:
    root = tmp_path / "repo"
    shutil.copytree(FIXTURES / "setup_rowsum", root)
    (root / "rowsum.cpp").write_text("// the bindings moved elsewhere\n")
    done = _explain_kernel(root, "rowsum_kernel", tmp_path / "cache")
    assert done.returncode == 1, done.stderr
    lines = [line.strip() for line in done.stdout.splitlines()]
    assert lines[0].startswith("pair  FAILED  no Python binding reaches the kernel: it is "
                               "launched from launch_rowsum")
    assert any(line.startswith("| rowsum_kernel.cu:") and "launched in launch_rowsum" in line
               for line in lines)
    assert lines[-5:] == ["build  skipped  not run: the pair step failed (the build: setup_py "
                          "rowsum_ext (setup.py:8))",
                          *(f"{step}  skipped  not run: the pair step failed"
                            for step in ("import", "capture", "reference", "comparison"))]
    # Without --explain: the same failure in one line, and how to see the rest.
    plain = subprocess.run([sys.executable, "-m", "kfbot", "verify", "rowsum_kernel", "--repo",
                            str(root)], capture_output=True, text=True, timeout=300,
                           env={**os.environ, "KFBOT_CACHE": str(tmp_path / "cache")})
    assert plain.returncode == 1
    assert "no Python binding reaches this kernel" in plain.stderr


def _hashes(root: Path) -> dict[str, str]:
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(root.rglob("*")) if p.is_file() and ".git" not in p.parts}


def test_a_suggestion_keeps_to_the_width_without_its_comments(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """YAML is never folded: a snippet line too long for the width loses its comment."""
    import io

    from rich.console import Console

    from kfbot.evaluate.baseline.steps import StepReport
    from kfbot.evaluate.render import print_step_details

    yaml = ("tasks:\n  - name: twice_kernel\n    build:\n"
            "      kind: setup_py                  # load | load_inline | setup_py\n"
            "      extra_cuda_cflags: [\"-O3\", \"--use_fast_math\"]  # every flag it passes\n"
            "      name: twice_ext  # short enough to keep its comment")
    monkeypatch.setenv("COLUMNS", "80")
    out = io.StringIO()
    print_step_details(StepReport("build", "failed", "it failed", evidence="an error",
                                  suggestion=yaml), Console(file=out, width=80))
    lines = out.getvalue().splitlines()
    assert all(len(line) <= 80 for line in lines), lines
    assert "      kind: setup_py" in "\n".join(lines) and "# load |" not in out.getvalue()
    assert "extra_cuda_cflags: [\"-O3\", \"--use_fast_math\"]" in out.getvalue()
    assert "name: twice_ext  # short enough to keep its comment" in out.getvalue()
