"""The GPU-free part of bench/eval_throughput.py: its layouts' candidates are distinct, and
every one of them takes the fast path (its unit splits, the host part is the
original's), so the bench measures the fast path and says when it does not; the kernel's
unit of the most changed candidates compiles with nvcc, without torch."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from kfbot.evaluate.build.fast.split import Split, host_difference, split_unit

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from bench.layouts import LAYOUTS, Layout  # noqa: E402

UNITS = {"torch-files": ("csrc/softmax.cu", ("csrc/softmax.cu",)),
         "one-unit": ("csrc/main.cu", ("csrc/main.cu", "csrc/kernels/common.cuh",
                                       "csrc/kernels/softmax.cuh", "csrc/kernels/relu.cuh",
                                       "csrc/kernels/rmsnorm.cuh"))}


def _split(layout: Layout, edited: dict[str, str]) -> Split:
    unit, paths = UNITS[layout.name]
    files = {p: edited.get(p) or (layout.fixture / p).read_text() for p in paths}
    found = split_unit(unit, files, layout.kernel)
    assert isinstance(found, Split), found
    return found


@pytest.mark.parametrize("name", sorted(UNITS))
def test_every_candidate_of_the_layout_shares_the_host_part(name: str) -> None:
    layout = LAYOUTS[name]
    candidates = layout.candidates(32)
    assert len({c.hash for c in candidates}) == 32
    original = _split(layout, {})
    for cand in candidates:
        assert host_difference(original, _split(layout, dict(cand.files))) is None, \
            cand.rationale


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="needs nvcc")
@pytest.mark.parametrize("name", sorted(UNITS))
def test_the_kernels_unit_compiles_without_torch(name: str, tmp_path: Path) -> None:
    layout = LAYOUTS[name]
    last = layout.candidates(32)[-1]  # every change of the layout at once
    split = _split(layout, dict(last.files))
    for path, text in split.device.items():
        (tmp_path / path).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / path).write_text(text)
    done = subprocess.run(["nvcc", "-std=c++17", "-O3", "-arch=sm_90", "-Icsrc", "-c",
                           split.unit, "-o", "unit.o"], cwd=tmp_path, capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    device = "".join(split.device.values())
    assert "#include <torch" not in device and "torch::" not in device
