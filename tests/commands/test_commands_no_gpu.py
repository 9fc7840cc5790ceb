"""`kfbot verify` and `kfbot bench` without a GPU or without nvcc: one line, non-zero exit."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "fixtures" / "example"


def _kfbot(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "kfbot", *args], capture_output=True,
                          text=True, env=env, timeout=600)


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="needs nvcc to get past the build check")
def test_verify_without_a_gpu(tmp_path: Path) -> None:
    pytest.importorskip("torch")
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    env = {**os.environ, "KFBOT_CACHE": str(tmp_path)}
    result = _kfbot("verify", "softmax_kernel", "--repo", str(EXAMPLE), env=env)
    assert result.returncode == 3
    assert result.stderr.strip().splitlines() == [
        f"kfbot: error: no CUDA GPU: torch {torch.__version__} sees no CUDA GPU"]


def test_bench_without_nvcc(tmp_path: Path) -> None:
    bare = tmp_path / "bin"
    bare.mkdir()
    os.symlink(sys.executable, bare / "python3")
    env = {**os.environ, "PATH": str(bare), "KFBOT_CACHE": str(tmp_path),
           "CUDA_HOME": str(tmp_path / "no-cuda")}
    result = _kfbot("bench", "softmax_kernel", "--repo", str(EXAMPLE), env=env)
    assert result.returncode == 3
    (line,) = result.stderr.strip().splitlines()
    assert line.startswith("kfbot: error:") and "nvcc" in line


def test_unknown_kernel_for_verify(tmp_path: Path) -> None:
    result = _kfbot("verify", "softmax_kernal", "--repo", str(EXAMPLE),
                    env={**os.environ, "KFBOT_CACHE": str(tmp_path)})
    assert result.returncode == 2
    assert "unknown kernel 'softmax_kernal'; close matches: softmax_kernel" in result.stderr


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="needs nvcc to make a Builder")
def test_warming_an_engine_without_a_gpu_says_so_before_building(tmp_path: Path) -> None:
    pytest.importorskip("torch")
    import torch

    from kfbot.config import load_config
    from kfbot.errors import EXIT_MISSING_TOOL, KfbotError
    from kfbot.evaluate.engine import Engine, EngineSettings
    from kfbot.evaluate.task import make_task
    from kfbot.scan.scanner import scan
    from kfbot.scan.select import select_kernel

    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    config = load_config(None, EXAMPLE)
    task = make_task(select_kernel(scan(EXAMPLE, config).kernels, "softmax_kernel"),
                     EXAMPLE, config)
    with Engine(task, EngineSettings(cache_dir=tmp_path)) as engine, \
            pytest.raises(KfbotError, match="no CUDA GPU") as caught:
        engine.warm()
    assert caught.value.exit_code == EXIT_MISSING_TOOL
    assert not any((tmp_path / "build" / "objects").iterdir())  # nothing was compiled
