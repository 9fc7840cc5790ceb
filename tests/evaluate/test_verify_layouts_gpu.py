"""On a GPU, the original passes its baseline on every layout real repositories use,
found by the scan alone (no kfbot.yaml): a setup.py extension nothing installed, a
package that reaches it through wrappers, torch.ops libraries whose ops pick their
kernel by their arguments, script references run as scripts, the kernel-builder
layout. Where a kernel cannot be verified, the baseline says exactly which step and why.

    pytest -m gpu tests/evaluate/test_verify_layouts_gpu.py -v    # builds each fixture once
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from kfbot.config import load_config
from kfbot.evaluate.baseline.steps import NO_REFERENCE
from kfbot.evaluate.candidate import Candidate
from kfbot.evaluate.engine import Engine, EngineSettings
from kfbot.evaluate.evaluation import Evaluation
from kfbot.evaluate.task import make_task
from kfbot.scan.scanner import scan
from kfbot.scan.select import select_kernel

pytestmark = pytest.mark.gpu

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures"


@pytest.fixture(scope="module")
def cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("kfbot-cache")


def baseline(fixture: str, kernel: str, cache: Path) -> Evaluation:
    root = FIXTURES / fixture
    config = load_config(None, root)
    task = make_task(select_kernel(scan(root, config).kernels, kernel), root, config)
    settings = EngineSettings(cache_dir=cache, capture_timeout_s=600, job_timeout_s=300)
    with Engine(task, settings) as engine:
        return engine.baseline()


def explained(ev: Evaluation) -> str:
    return "\n".join(f"{s.step} {s.outcome}: {s.summary}\n{s.evidence}" for s in ev.steps)


@pytest.mark.parametrize(("fixture", "kernel", "reference"), [
    ("setup_rowsum", "rowsum_kernel", True),  # setup.py: the tests import kfbot's build
    ("bench_reference", "relu_kernel", True),  # a script that chdirs and asserts
    ("script_reference", "swish_kernel", True),  # main.py, its reference defined in it
    # The tests call a wrapper: the reference over its arguments judges the op's calls
    # made inside it (fused_gelu(x) -> autograd.Function -> fusedact._C.gelu_fwd(x, False)).
    ("pkg_chain", "gelu_fwd_kernel", True),
    ("pkg_chain", "swiglu_kernel", True),  # fusedact.ops.swiglu -> _swiglu -> _C
    ("torch_ops_multi", "scale_naive_kernel", True),  # torch.ops.kfops.scale(.default)
    ("torch_ops_multi", "softplus_naive_kernel", True),  # chosen by an integer argument
    ("torch_ops_multi", "rowmax_naive_kernel", True),  # chosen by the dtype
    # build.toml, torch-ext/, a generated _ops; rms_norm(out, x, w, eps) -> () is judged
    # by the out its wrapper returns.
    ("kernel_builder", "rms_norm_kernel", True),
    # Its test compares values it computed beforehand (x + residual): no reference can
    # be carried, the original is the judge, and the reports say so.
    ("kernel_builder", "fused_add_rms_norm_kernel", False),
])
def test_the_original_passes_its_baseline(cache: Path, fixture: str, kernel: str,
                                          reference: bool) -> None:
    ev = baseline(fixture, kernel, cache)
    assert ev.ok, f"{ev.reason}\n{explained(ev)}"
    assert [s.step for s in ev.steps] == ["pair", "build", "import", "capture", "reference",
                                          "comparison"]
    assert all(s.outcome in ("ok", "warning") for s in ev.steps), explained(ev)
    assert ev.checks and all(c.passed for c in ev.checks)
    against = {c.against for c in ev.checks}
    if reference:
        assert "reference" in against, explained(ev)
    else:
        assert any(f.check == "no-reference" and f.reason == NO_REFERENCE
                   for f in ev.findings), explained(ev)


def test_calls_that_launch_another_kernel_are_dropped(cache: Path) -> None:
    """scale runs its vector kernel from 4096 aligned elements: the naive kernel is
    verified on the calls that reach it, and the capture step says what was dropped."""
    ev = baseline("torch_ops_multi", "scale_naive_kernel", cache)
    capture = next(s for s in ev.steps if s.step == "capture")
    assert "that launch scale_naive_kernel; dropped" in capture.summary, explained(ev)
    assert "scale_vec4_kernel" in capture.summary
    assert all("1048576" not in c.input for c in ev.checks)  # 1 << 20 takes the vector kernel


def test_a_kernel_no_captured_call_reaches_is_said_so(cache: Path) -> None:
    """kfops_clamp_kernel is compiled only when KFOPS_USE_CLUSTERS is off; it is on."""
    ev = baseline("torch_ops_multi", "kfops_clamp_kernel", cache)
    assert not ev.ok and ev.stage == "baseline"
    failed = next(s for s in ev.steps if s.outcome == "failed")
    assert failed.step in ("pair", "capture"), explained(ev)
    if failed.step == "capture":
        assert "none of the captured calls launches kfops_clamp_kernel" in failed.summary
        assert "shapes:" in failed.suggestion


def test_an_op_that_writes_into_out_is_judged_by_what_it_writes(cache: Path) -> None:
    """kb_norm's rms_norm(out, x, w, eps) returns nothing: a candidate that leaves the
    last column of out unwritten must fail, not match the original's None."""
    root = FIXTURES / "kernel_builder"
    config = load_config(None, root)
    task = make_task(select_kernel(scan(root, config).kernels, "rms_norm_kernel"), root, config)
    source = (root / "kb_norm" / "rms_norm.cu").read_text()
    broken = source.replace("for (int c = 0; c < cols; ++c) {\n    out[",
                            "for (int c = 0; c < cols - 1; ++c) {\n    out[")
    assert broken != source
    with Engine(task, EngineSettings(cache_dir=cache, capture_timeout_s=600)) as engine:
        assert engine.baseline().ok
        ev = engine.evaluate(Candidate(files={"kb_norm/rms_norm.cu": broken}), bench=False)
    assert not ev.ok and ev.stage in ("correctness", "anticheat"), ev.reason


def test_verify_explain_prints_every_step(tmp_path: Path) -> None:
    env = {**os.environ, "KFBOT_CACHE": str(tmp_path / "cache"), "COLUMNS": "200"}
    done = subprocess.run([sys.executable, "-m", "kfbot", "verify", "rowsum_kernel", "--repo",
                           str(FIXTURES / "setup_rowsum"), "--explain"],
                          capture_output=True, text=True, env=env, timeout=900)
    assert done.returncode == 0, done.stdout + done.stderr
    steps = [line.split()[:2] for line in done.stdout.splitlines()[:7]]
    assert steps == [["environment", "ok"], ["pair", "ok"], ["build", "ok"], ["import", "ok"],
                     ["capture", "ok"],
                     ["reference", "ok"], ["comparison", "ok"]], done.stdout
    assert "kfbot's build of rowsum_ext" in done.stdout
