"""The params mutator on the tunables the scan finds in a real fixture: which knobs,
which values, how a point becomes a candidate, and that the result still compiles."""

from __future__ import annotations

import random
import shutil
import subprocess
from pathlib import Path

import pytest

from kfbot.config import load_config
from kfbot.evaluate.candidate import ORIGINAL, Candidate
from kfbot.scan.model import Tunable
from kfbot.scan.scanner import scan
from kfbot.scan.select import select_kernel
from kfbot.search.mutators.params import (
    EXHAUSTIVE_LIMIT,
    Knob,
    apply_point,
    knobs,
    point_of,
    propose_points,
    space_size,
)

ROOT = Path(__file__).resolve().parents[2] / "fixtures" / "tunables_matmul"
MATMUL = "csrc/matmul.cu"


def _tunables(kernel: str) -> tuple[Tunable, ...]:
    config = load_config(None, ROOT)
    return select_kernel(scan(ROOT, config).kernels, kernel).tunables


def _files() -> dict[str, str]:
    return {MATMUL: (ROOT / MATMUL).read_text()}


def test_knobs_of_the_tiled_matmul() -> None:
    ks = {k.name: k for k in knobs(_tunables("matmul_tiled"))}
    assert set(ks) == {"TILE", "kUnroll", "kMinBlocks"}
    assert ks["TILE"].via_define and ks["TILE"].choices == ("8", "16", "32")
    assert ks["kUnroll"].choices == ("1", "2", "4", "8") and not ks["kUnroll"].via_define
    assert ks["kMinBlocks"].choices == ("1", "2", "4", "8")


def test_a_point_sets_defines_as_params_and_edits_literals_in_place() -> None:
    ks = knobs(_tunables("matmul_tiled"))
    cand = apply_point(ks, {"TILE": "32", "kUnroll": "8", "kMinBlocks": "1"}, _files(), ORIGINAL)
    assert cand is not None and cand.origin == "params"
    assert cand.params == {"TILE": "32"}
    text = cand.files[MATMUL]
    assert "constexpr int kUnroll = 8;" in text and "static const int kMinBlocks = 1;" in text
    assert "#define TILE 16" in text  # the #ifndef default stays; -DTILE=32 overrides it
    assert point_of(ks, cand, _files()) == {"TILE": "32", "kUnroll": "8", "kMinBlocks": "1"}
    assert "TILE=32" in cand.rationale


def test_launch_configuration_knobs_edit_the_launch_line() -> None:
    ks = knobs(_tunables("add_bias_kernel"))
    block = next(k for k in ks if k.kind == "launch_config")
    assert block.choices == ("32", "64", "128", "256", "512", "1024")
    cand = apply_point([block], {block.name: "512"}, _files(), ORIGINAL)
    assert cand is not None
    changed = cand.files[MATMUL].split("\n")[block.line - 1]
    assert "512" in changed and changed != _files()[MATMUL].split("\n")[block.line - 1]


def test_small_spaces_are_swept_in_a_fixed_order_without_repeats() -> None:
    ks = knobs(_tunables("matmul_tiled"))
    assert space_size(ks) == 3 * 4 * 4 <= EXHAUSTIVE_LIMIT
    seen: set[tuple[str, ...]] = set()
    rng = random.Random(0)
    batches = [propose_points(ks, ORIGINAL, _files(), rng, seen, 10) for _ in range(6)]
    flat = [tuple(sorted(p.items())) for b in batches for p in b]
    assert len(flat) == len(set(flat)) == 48
    assert batches[5] == []


def test_large_spaces_climb_from_the_parent() -> None:
    ks = [Knob(f"k{i}", "constexpr", "a.cu", i + 1, "4", ("1", "2", "4", "8")) for i in range(4)]
    files = {"a.cu": "\n".join(f"constexpr int k{i} = 4;" for i in range(4))}
    assert space_size(ks) > EXHAUSTIVE_LIMIT
    points = propose_points(ks, ORIGINAL, files, random.Random(1), set(), 20)
    steps = [p for p in points[:-1]]
    assert len(steps) == 8  # every knob one step down and one step up
    for p in steps:
        assert sum(v != "4" for v in p.values()) == 1
    parent = apply_point(ks, {"k0": "8", "k1": "4", "k2": "4", "k3": "4"}, files, ORIGINAL)
    assert parent is not None
    around = propose_points(ks, parent, files, random.Random(1), set(), 20)
    assert {"k0": "4", "k1": "4", "k2": "4", "k3": "4"} in around


def test_non_numeric_tunables_are_not_knobs() -> None:
    t = Tunable("kScale", "0.5f", "constexpr", "a.cu", 1)
    assert knobs([t]) == []


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="needs nvcc")
@pytest.mark.parametrize("point", [{"TILE": "32", "kUnroll": "8", "kMinBlocks": "1"},
                                   {"TILE": "8", "kUnroll": "2", "kMinBlocks": "4"}])
def test_params_candidates_compile(tmp_path: Path, point: dict[str, str]) -> None:
    ks = knobs(_tunables("matmul_tiled"))
    cand = apply_point(ks, point, _files(), Candidate())
    assert cand is not None
    src = tmp_path / "matmul.cu"
    src.write_text(cand.files[MATMUL])
    defines = [f"-D{k}={v}" for k, v in cand.params.items()]
    proc = subprocess.run(["nvcc", "-c", "-std=c++17", *defines, "-o", str(tmp_path / "m.o"),
                           str(src)], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr


def test_constants_another_kernel_uses_are_not_knobs(tmp_path: Path) -> None:
    from kfbot.evaluate.scope import shared_names
    from kfbot.evaluate.task import make_task

    root = tmp_path / "rows"
    shutil.copytree(Path(__file__).resolve().parents[2] / "fixtures" / "naive_rows", root)
    for shared in (False, True):
        if shared:  # the neighbour's launch reads the same constant
            path = root / "csrc" / "softmax.cu"
            path.write_text(path.read_text().replace(
                "scale_kernel<<<(unsigned)((n + 255) / 256), 256>>>",
                "scale_kernel<<<(unsigned)((n + kRowThreads - 1) / kRowThreads), kRowThreads>>>"))
        config = load_config(None, root)
        task = make_task(select_kernel(scan(root, config).kernels, "softmax_kernel"), root,
                         config)
        names = [k.name for k in knobs(task.tunables, shared_names(task))]
        assert ("kRowThreads" in names) is not shared
        assert "kRowThreads" in [k.name for k in knobs(task.tunables)]


def test_a_knob_whose_line_moved_changes_nothing() -> None:
    from kfbot.search.rewrites import propose_rewrites

    root = Path(__file__).resolve().parents[2] / "fixtures" / "naive_rows"
    config = load_config(None, root)
    for kernel, path in (("softmax_kernel", "csrc/softmax.cu"),
                         ("rms_norm_kernel", "csrc/rms_norm.cu")):
        task_knobs = knobs(select_kernel(scan(root, config).kernels, kernel).tunables)
        assert task_knobs
        files = {path: (root / path).read_text()}
        [warp] = [c for c in propose_rewrites(files, [path], ORIGINAL, kernel)
                  if c.rationale.startswith("warp-per-row")]
        for knob in task_knobs:
            other = next(v for v in knob.choices if v != knob.current)
            point = {k.name: (other if k is knob else k.current) for k in task_knobs}
            assert apply_point(task_knobs, point, files, ORIGINAL) is not None
            assert apply_point(task_knobs, point, {**files, **warp.files}, warp) is None
