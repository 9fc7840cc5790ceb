"""`kfbot optimize` without a GPU: the plan it shows, and clear refusals that write nothing."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from kfbot.config import Config
from kfbot.evaluate.task import make_task
from kfbot.scan.scanner import scan
from kfbot.scan.select import select_kernel
from kfbot.search.plan import OptimizeSettings, make_plan

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures"


def kfbot(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "ANTHROPIC_API_KEY"}
    env["COLUMNS"] = "200"
    return subprocess.run([sys.executable, "-m", "kfbot", *args], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=300)


def test_dry_run_shows_the_search_plan() -> None:
    proc = kfbot("optimize", "gelu_kernel", "--dry-run", "--seed", "3", "--islands", "2",
                 "--budget", "16", cwd=FIXTURES / "load_elementwise")
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    assert "kernel csrc/gelu_kernel.cu::gelu_kernel: 2 islands, seed 3, budget 16 evaluations" \
        in out
    assert "kBlockSize (constexpr, csrc/gelu_kernel.cu:5) = 128, tries 32, 64, 128, 256, " \
           "512, 1024" in out
    assert "rules: fast-math-flags, grid-stride-loop, launch-bounds, occupancy-2-blocks, " \
           "occupancy-4-blocks, restrict-pointers, vectorize-float4" in out
    assert "  grid-stride-loop: applies" in out
    assert "llm: ANTHROPIC_API_KEY is not set" in out
    assert not (FIXTURES / "load_elementwise" / ".kfbot").exists()


def test_without_a_gpu_it_says_so_after_the_plan_and_writes_nothing() -> None:
    root = FIXTURES / "load_elementwise"
    proc = kfbot("optimize", "gelu_kernel", "--no-llm", cwd=root)
    assert proc.returncode == 3
    assert "llm: off (--no-llm)" in proc.stdout
    assert "kfbot: error: no CUDA GPU" in proc.stderr
    assert not (root / ".kfbot").exists()


@pytest.mark.parametrize(("args", "message"), [
    (("optimize", "no_such_kernel", "--dry-run"), "unknown kernel 'no_such_kernel'"),
    (("optimize", "--dry-run", "--time", "soon"), "not a duration"),
    (("optimize", "gelu_kernel", "--budget", "0", "--dry-run"), "at least 1"),
])
def test_bad_input_is_refused_with_a_reason(args: tuple[str, ...], message: str) -> None:
    proc = kfbot(*args, cwd=FIXTURES / "load_elementwise")
    assert proc.returncode != 0
    assert message in proc.stderr.lower()


def test_a_repository_without_reference_tests_has_nothing_to_optimize() -> None:
    proc = kfbot("optimize", "--dry-run", cwd=FIXTURES / "no_reference")
    assert proc.returncode != 0
    assert "no kernel with a reference test to optimize" in proc.stderr


def test_with_no_kernel_named_every_kernel_with_a_reference_is_planned() -> None:
    proc = kfbot("optimize", "--dry-run", "--seed", "1", cwd=FIXTURES / "example")
    assert proc.returncode == 0, proc.stderr
    planned = [line for line in proc.stdout.splitlines() if line.startswith("kernel ")]
    assert len(planned) == 3


def test_the_plan_of_the_tunable_matmul() -> None:
    root = FIXTURES / "tunables_matmul"
    task = make_task(select_kernel(scan(root, Config()).kernels, "matmul_tiled"), root,
                     Config())
    plan = make_plan(task, OptimizeSettings(islands=4, seed=0), "off")
    assert [k.name for k in plan.knobs] == ["TILE", "kUnroll", "kMinBlocks"]
    assert "params: 3 tunables, 48 points" in plan.lines()
