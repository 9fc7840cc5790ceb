"""nvcc for the tests: compile many small translation units at once, on every core.

Rewritten kernels are compiled for sm_90 (the H100/H200 the search runs on); a test
that needs nvcc skips itself when it is not on PATH.
"""

from __future__ import annotations

import functools
import os
import shutil
import subprocess
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

NVCC = shutil.which("nvcc")
ARCH = "-arch=sm_90"


@functools.cache
def torch_includes() -> tuple[str, ...]:
    """torch's C++ include folders; the calling test is skipped where torch is missing."""
    cpp_extension = pytest.importorskip("torch.utils.cpp_extension")
    return tuple(cpp_extension.include_paths())


def cuda_include() -> str | None:
    """The CUDA toolkit's include folder (cuda_runtime.h), or None."""
    candidates = [os.environ.get("CUDA_HOME"), os.environ.get("CUDA_PATH"), "/usr/local/cuda"]
    if NVCC:
        candidates.append(str(Path(NVCC).resolve().parent.parent))
    for home in candidates:
        if home and (Path(home) / "include" / "cuda_runtime.h").is_file():
            return str(Path(home) / "include")
    return None


def compile_all(sources: Mapping[str, str], folder: Path, flags: Sequence[str] = ()
                ) -> dict[str, str]:
    """Each source compiled to an object: name -> "" when it compiled, else the errors."""
    assert NVCC is not None
    folder.mkdir(parents=True, exist_ok=True)

    def one(item: tuple[str, str]) -> tuple[str, str]:
        name, text = item
        src = folder / f"{name}.cu"
        src.write_text(text)
        proc = subprocess.run([NVCC, "-c", "-std=c++17", ARCH, *flags, "-o",
                               str(folder / f"{name}.o"), str(src)],
                              capture_output=True, text=True, timeout=300)
        return name, "" if proc.returncode == 0 else proc.stderr[-3000:] or "nvcc failed"

    with ThreadPoolExecutor(max_workers=os.cpu_count() or 2) as pool:
        return dict(pool.map(one, sources.items()))
