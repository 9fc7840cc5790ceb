"""The expert library's structural rewrites on a real GPU: for every naive fixture kernel,
each candidate the rules mutator proposes first (its class's rewrites, and the fast-math
intrinsics) builds, passes verification on the captured and edge shapes with every
anti-cheating probe, and so does the fixture's hand-written version; a candidate that
changes the neighbouring kernel of the file is rejected before it is built.

    pytest -m gpu tests/search/test_experts_gpu.py

Correctness only: the speedups are measured by bench/search_quality.py --naive.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from kfbot.config import load_config
from kfbot.evaluate.candidate import ORIGINAL, Candidate
from kfbot.evaluate.engine import Engine, EngineSettings
from kfbot.evaluate.task import make_task
from kfbot.scan.scanner import scan
from kfbot.scan.select import select_kernel
from kfbot.search.rewrites import load_library, propose_rewrites

pytestmark = pytest.mark.gpu

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures"
KERNELS = {  # kernel -> fixture
    "softmax_kernel": "naive_rows", "log_softmax_kernel": "naive_rows",
    "layer_norm_kernel": "naive_rows", "rms_norm_kernel": "naive_rows",
    "row_mean_kernel": "naive_rows", "row_max_kernel": "naive_rows",
    "silu_kernel": "naive_elementwise", "gelu_kernel": "naive_elementwise",
    "matmul_kernel": "naive_matmul",
    "transpose_kernel": "naive_transpose",
}
EXPERTS = {e.id for e in load_library().experts}


@pytest.fixture(scope="module")
def cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("kfbot-cache")


@pytest.fixture(scope="module", params=list(KERNELS))
def engine(request: pytest.FixtureRequest, cache: Path) -> Iterator[Engine]:
    kernel = str(request.param)
    root = FIXTURES / KERNELS[kernel]
    config = load_config(None, root)
    task = make_task(select_kernel(scan(root, config).kernels, kernel), root, config)
    with Engine(task, EngineSettings(cache_dir=cache, job_timeout_s=300)) as e:
        base = e.baseline()
        assert base.ok, f"{kernel}: the naive original fails its reference: {base.reason}"
        yield e


def _candidates(engine: Engine) -> list[Candidate]:
    task = engine.task
    files = {p: (task.root / p).read_text() for p in task.editable_files}
    proposed = propose_rewrites(files, task.editable_files, ORIGINAL, task.kernel_name)
    chosen = [c for c in proposed
              if c.rationale.split(":", 1)[0] in EXPERTS | {"fast-math-intrinsics"}]
    [path] = task.editable_files
    hand = (task.root / "hand" / f"{task.kernel_name}.cu").read_text()
    return [*chosen, Candidate(files={path: hand}, origin="user", rationale="hand-written")]


def test_structural_rewrites_and_the_hand_written_version_verify(engine: Engine) -> None:
    cands = _candidates(engine)
    assert len(cands) >= 2
    failed = []
    for cand, result in engine.evaluate_many(cands, bench=False):
        if not result.ok:
            failed.append(f"{cand.rationale.split(':', 1)[0]}: {result.stage}: {result.reason}")
        else:  # verified against the reference on captured and edge shapes
            assert any(c.against == "reference" and c.passed for c in result.checks)
    assert failed == [], f"{engine.task.kernel_name}: " + "; ".join(failed)


@pytest.mark.parametrize("engine", ["softmax_kernel"], indirect=True)  # scale_kernel's file
def test_a_change_to_the_neighbouring_kernel_is_rejected(engine: Engine) -> None:
    task = engine.task
    path = "csrc/softmax.cu"
    source = (task.root / path).read_text()
    changed = source.replace("y[i] = alpha * x[i];", "y[i] = x[i] * alpha;")
    assert changed != source
    result = engine.evaluate(Candidate(files={path: changed}, origin="user"), bench=False)
    assert result.stage == "static" and not result.ok
    assert "[edit-scope] changes kernel scale_kernel" in result.reason
    assert result.build_seconds == 0.0  # rejected before any build
