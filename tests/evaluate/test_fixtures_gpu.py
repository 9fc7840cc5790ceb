"""The real-layout fixtures work on a GPU: each is built its own way in a scratch copy
and its own tests (or scripts) pass against its original kernels.

    pytest -m gpu tests/evaluate/test_fixtures_gpu.py     # a few minutes: four torch builds
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from kernel_builder_tool import REGISTRATION_H

from kfbot.scan.build_toml import tomllib

pytestmark = pytest.mark.gpu

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures"
TIMEOUT_S = 900


def _copy(name: str, tmp_path: Path) -> Path:
    root = tmp_path / name
    shutil.copytree(FIXTURES / name, root)
    return root


def _run(cmd: list[str], cwd: Path, tmp_path: Path, **env: str) -> str:
    """Run a command of the fixture; its output, or a failure that shows it."""
    environ = {**os.environ, "TORCH_EXTENSIONS_DIR": str(tmp_path / "torch_extensions"), **env}
    done = subprocess.run(cmd, cwd=cwd, env=environ, capture_output=True, text=True,
                          timeout=TIMEOUT_S, check=False)
    output = done.stdout + done.stderr
    assert done.returncode == 0, f"{' '.join(cmd)} exited {done.returncode}:\n{output[-6000:]}"
    return output


def _pytest(root: Path, tmp_path: Path, **env: str) -> str:
    output = _run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "tests"],
                  root, tmp_path, **env)
    assert " passed" in output and "skipped" not in output, output[-3000:]
    return output


def test_torch_ops_multi(tmp_path: Path) -> None:
    _pytest(_copy("torch_ops_multi", tmp_path), tmp_path)


def test_pkg_chain(tmp_path: Path) -> None:
    root = _copy("pkg_chain", tmp_path)
    _run([sys.executable, "setup.py", "build_ext", "--inplace"], root, tmp_path)
    _pytest(root, tmp_path)


def test_script_reference(tmp_path: Path) -> None:
    root = _copy("script_reference", tmp_path)
    checked = _run([sys.executable, str(root / "main.py")], tmp_path, tmp_path)  # elsewhere
    assert checked.count(" ok") == 4 and "MISMATCH" not in checked
    printed = _run([sys.executable, str(root / "bench.py")], tmp_path, tmp_path)
    assert "mish kernel" in printed and "mish reference" in printed


def _ops_module(root: Path, namespace: str) -> str:
    """What the kernel builder generates as `_ops.py`, with a JIT build standing in for
    its CMake build: the sources and CUDA flags of build.toml, and its registration.h."""
    recipe = tomllib.loads((root / "build.toml").read_text())
    sources = [*recipe["torch"]["src"], *recipe["kernel"]["rms_norm"]["src"]]
    compiled = [str(root / s) for s in sources if s.endswith((".cpp", ".cu"))]
    flags = recipe["kernel"]["rms_norm"].get("cuda-flags", [])
    includes = sorted({str((root / s).parent) for s in sources})
    return "\n".join([
        "import torch",
        "from torch.utils.cpp_extension import load",
        f"load(name={namespace!r}, sources={compiled!r}, extra_include_paths={includes!r},",
        f"     extra_cuda_cflags={flags!r}, is_python_module=False)",
        f"ops = torch.ops.{namespace}",
        "",
    ])


def test_kernel_builder(tmp_path: Path) -> None:
    root = _copy("kernel_builder", tmp_path)
    (root / "torch-ext" / "registration.h").write_text(REGISTRATION_H)
    (root / "torch-ext" / "kb_norm" / "_ops.py").write_text(_ops_module(root, "_kb_norm_test"))
    _pytest(root, tmp_path, PYTHONPATH=str(root / "torch-ext"))
