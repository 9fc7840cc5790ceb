"""Tunables that reach the kernel (kfbot/search/mutators/reach.py): a constant of another function
is never a knob, a conditional block size in the launcher becomes knobs of its branches
and its switch, and a block kfbot cannot trace gives no launch knobs and a reason."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from kfbot.config import load_config
from kfbot.evaluate.candidate import ORIGINAL
from kfbot.evaluate.task import make_task
from kfbot.scan.scanner import scan
from kfbot.scan.select import select_kernel
from kfbot.search.mutators.params import apply_point
from kfbot.search.mutators.reach import reaching_knobs
from kfbot.search.plan import OptimizeSettings, make_plan

ROOT = Path(__file__).resolve().parents[2]
REAL = ROOT / "fixtures" / "naive_real"

# Two kernels, each with a launcher holding its own `const int BLOCK_SIZE`: the scan sees
# the name in both launchers, only one of them reaches each kernel.
TWO = """\
#include <cuda_runtime.h>
__global__ void a_kernel(float* x, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) x[i] *= 2.0f;
}
__global__ void b_kernel(float* x, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) x[i] += 1.0f;
}
void launch_a(float* x, int n) {
    const int BLOCK_SIZE = 128;
    a_kernel<<<(n + BLOCK_SIZE - 1) / BLOCK_SIZE, BLOCK_SIZE>>>(x, n);
}
void launch_b(float* x, int n) {
    const int BLOCK_SIZE = 512;
    b_kernel<<<(n + BLOCK_SIZE - 1) / BLOCK_SIZE, BLOCK_SIZE>>>(x, n);
}
"""

CONFIGURED = """\
#include <cuda_runtime.h>
struct Config { int threads; };
__global__ void scale_kernel(float* x, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) x[i] *= 2.0f;
}
void launch_scale(float* x, int n, Config cfg) {
    const int threads = cfg.threads;
    scale_kernel<<<(n + threads - 1) / threads, threads>>>(x, n);
}
"""


def _scanned(tmp_path: Path, text: str, kernel: str):
    (tmp_path / "k.cu").write_text(text)
    config = load_config(None, tmp_path)
    return select_kernel(scan(tmp_path, config).kernels, kernel)


def test_a_constant_of_another_launcher_is_never_a_knob(tmp_path: Path) -> None:
    for kernel, value, other_line in (("a_kernel", "128", 15), ("b_kernel", "512", 11)):
        k = _scanned(tmp_path, TWO, kernel)
        # The scan, by name, offers both launchers' BLOCK_SIZE.
        assert {t.line for t in k.tunables if t.name == "BLOCK_SIZE"} == {11, 15}
        found = reaching_knobs({"k.cu": TWO}, ["k.cu"], kernel, k.tunables)
        assert [(kn.name, kn.current) for kn in found.knobs] == [("BLOCK_SIZE", value)]
        [note] = [n for n in found.notes if n.startswith("BLOCK_SIZE")]
        assert f"k.cu:{other_line}" in note
        assert "declared in a function that neither launches the kernel" in note


def test_a_conditional_block_becomes_knobs_of_its_branches() -> None:
    k = select_kernel(scan(REAL, load_config(None, REAL)).kernels, "softmax_block_kernel")
    files = {k.file: (REAL / k.file).read_text()}
    found = reaching_knobs(files, list(k.editable_files), k.name, k.tunables)
    by_role = {kn.name.split("(")[1].rstrip(")"): kn for kn in found.knobs
               if kn.kind == "launch_choice"}
    assert set(by_role) == {"block if true", "block otherwise", "switches at cols >= 1024"}
    assert [by_role[r].current for r in ("block if true", "block otherwise")] == ["1024", "256"]
    assert "BLOCK_SIZE" not in [kn.name for kn in found.knobs]
    point = {kn.name: kn.current for kn in found.knobs}
    point[by_role["block otherwise"].name] = "128"
    point[by_role["switches at cols >= 1024"].name] = "2048"
    cand = apply_point(found.knobs, point, files, ORIGINAL)
    assert cand is not None
    assert "const int threads = cols >= 2048 ? 1024 : 128;" in cand.files[k.file]


def test_an_untraceable_block_gives_no_launch_knobs_and_says_why(tmp_path: Path) -> None:
    k = _scanned(tmp_path, CONFIGURED, "scale_kernel")
    found = reaching_knobs({"k.cu": CONFIGURED}, ["k.cu"], "scale_kernel", k.tunables)
    assert found.knobs == ()
    [note] = found.notes
    assert "`cfg.threads`" in note and "cannot trace" in note and "not proposed" in note


def test_the_plan_shows_what_reaches_and_what_does_not(tmp_path: Path) -> None:
    root = tmp_path / "repo"
    shutil.copytree(REAL, root)
    (root / "csrc" / "softmax.cu").write_text((root / "csrc" / "softmax.cu").read_text().replace(
        "softmax_block_kernel<<<rows, threads>>>(x, y, cols);",
        "const int BLOCK_SIZE = 7;\n    softmax_block_kernel<<<rows, threads>>>(x, y, cols);"))
    config = load_config(None, root)
    task = make_task(select_kernel(scan(root, config).kernels, "softmax_block_kernel"), root,
                     config)
    lines = make_plan(task, OptimizeSettings(), "off").lines()
    text = "\n".join(lines)
    assert "launch_softmax_block:threads (block if true) (launch_choice" in text
    # A name in the launcher that flows nowhere, and the other launcher's constant.
    assert "BLOCK_SIZE (const, csrc/softmax.cu:" in text and "left out" in text
    assert not any(line.startswith("  BLOCK_SIZE (const") and "tries" in line for line in lines)


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="needs nvcc")
def test_conditional_knob_candidates_compile(tmp_path: Path) -> None:
    k = select_kernel(scan(REAL, load_config(None, REAL)).kernels, "blur_rows_kernel")
    files = {k.file: (REAL / k.file).read_text()}
    found = reaching_knobs(files, list(k.editable_files), k.name, k.tunables)
    point = {kn.name: kn.choices[-1] for kn in found.knobs}
    cand = apply_point(found.knobs, point, files, ORIGINAL)
    assert cand is not None and "height < 16384 ? 1024 : 1024" in cand.files[k.file]
    src = tmp_path / "s.cu"
    src.write_text(cand.files[k.file])
    proc = subprocess.run(["nvcc", "-c", "-std=c++17", "-arch=sm_90", "-o",
                           str(tmp_path / "s.o"), str(src)], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr


def _real_knobs(kernel: str) -> tuple[object, dict[str, str], object]:
    k = select_kernel(scan(REAL, load_config(None, REAL)).kernels, kernel)
    files = {k.file: (REAL / k.file).read_text()}
    return k, files, reaching_knobs(files, list(k.editable_files), k.name, k.tunables)


def test_a_template_block_and_its_launch_literals_are_one_knob() -> None:
    _, files, found = _real_knobs("row_absmax_kernel")
    [knob] = found.knobs
    assert knob.kind == "launch_tied" and knob.current == "128"
    assert [n for n in found.notes if n.startswith("BLOCK (template_arg")]
    cand = apply_point(found.knobs, {knob.name: "512"}, files, ORIGINAL)
    assert cand is not None
    text = cand.files["csrc/reduce.cu"]
    # The template argument, the block and the grid's round-up, all at once.
    assert "row_absmax_kernel<T, 512><<<(rows + 511) / 512, 512>>>" in text
    # The other launch of the file (row_sum, kBlock) is untouched.
    assert "row_sum_kernel<T, kBlock><<<(rows + kBlock - 1) / kBlock, kBlock>>>" in text
    # Reading the point back from the candidate gives the knob's new value.
    from kfbot.search.mutators.params import point_of
    assert point_of(found.knobs, cand, files) == {knob.name: "512"}


def test_a_shared_array_size_is_a_capacity_not_a_block() -> None:
    _, _, found = _real_knobs("softmax_block_kernel")
    assert "MAX_THREADS" not in [kn.name for kn in found.knobs]
    [note] = [n for n in found.notes if n.startswith("MAX_THREADS")]
    assert "sizes the shared array `smem`" in note


def test_a_shared_tile_that_is_also_the_block_stays_a_knob(tmp_path: Path) -> None:
    text = """\
#include <cuda_runtime.h>
#define TILE 16
__global__ void t_kernel(const float* x, float* y, int n) {
    __shared__ float tile[TILE][TILE + 1];
    int i = blockIdx.x * TILE + threadIdx.x;
    tile[threadIdx.y][threadIdx.x] = i < n ? x[i] : 0.0f;
    __syncthreads();
    if (i < n) y[i] = tile[threadIdx.x][threadIdx.y];
}
void launch_t(const float* x, float* y, int n) {
    dim3 block(TILE, TILE);
    t_kernel<<<(n + TILE - 1) / TILE, block>>>(x, y, n);
}
"""
    k = _scanned(tmp_path, text, "t_kernel")
    found = reaching_knobs({"k.cu": text}, ["k.cu"], "t_kernel", k.tunables)
    assert "TILE" in [kn.name for kn in found.knobs]
