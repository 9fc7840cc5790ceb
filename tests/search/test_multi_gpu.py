"""One machine, two GPUs: one evaluation worker per GPU, each candidate timed against
the original in its own GPU's worker, a crashing candidate kept from taking GPUs out."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from kfbot.config import load_config
from kfbot.evaluate.candidate import Candidate
from kfbot.evaluate.engine import Engine, EngineSettings
from kfbot.evaluate.task import make_task
from kfbot.scan.scanner import scan
from kfbot.scan.select import select_kernel
from kfbot.search.executors.gpus import visible_gpus
from kfbot.search.executors.local import LocalGpuExecutor, engines_per_gpu

ROOT = Path(__file__).resolve().parents[2]
CANDIDATES = ROOT / "tests" / "data" / "candidates"
TIMING = {"max_trials": 40, "min_trials": 10}
GPUS = visible_gpus()

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(len(GPUS) < 2, reason=f"needs 2 GPUs, {len(GPUS)} visible")]


def executor(fixture: str, kernel: str, cache: Path, notes: list[str]) -> LocalGpuExecutor:
    root = ROOT / "fixtures" / fixture
    config = load_config(None, root)
    task = make_task(select_kernel(scan(root, config).kernels, kernel), root, config)
    settings = EngineSettings(cache_dir=cache, timing=TIMING, job_timeout_s=120)
    return LocalGpuExecutor(GPUS[:2], engines_per_gpu(task, settings), note=notes.append)


@pytest.fixture
def notes() -> list[str]:
    return []


@pytest.fixture
def softmax(tmp_path: Path, notes: list[str]) -> Iterator[LocalGpuExecutor]:
    ex = executor("example", "softmax_kernel", tmp_path, notes)
    yield ex
    ex.close()


def pinned_to(engine: Engine) -> str:
    """CUDA_VISIBLE_DEVICES of the engine's live worker, read from its process."""
    pid = engine.session.pid
    assert pid is not None
    env = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    return next(e for e in env if e.startswith(b"CUDA_VISIBLE_DEVICES=")).split(b"=")[1].decode()


def test_two_gpus_share_the_work_and_time_each_candidate_on_one(
        softmax: LocalGpuExecutor, notes: list[str]) -> None:
    faster = (CANDIDATES / "softmax_block_per_row" / "csrc" / "softmax.cu").read_text()
    batch = [Candidate(params={"KFBOT_TEST_REBUILD": str(i)}, origin="user") for i in range(5)]
    batch.insert(2, Candidate(files={"csrc/softmax.cu": faster}, origin="user"))
    results = softmax.evaluate(batch)
    assert [c for c, _ in results] == batch
    assert all(ev.ok for _, ev in results), [ev.reason for _, ev in results]
    assert all(ev.timings for _, ev in results)  # original and candidate in the same job
    assert (results[2][1].speedup or 0) > 1.5
    assert softmax.live == GPUS[:2] and not notes
    assert all(softmax.ran[gpu] for gpu in GPUS[:2]), softmax.ran  # every GPU got work
    for gpu in GPUS[:2]:
        engine = softmax.engines[gpu]
        assert isinstance(engine, Engine)
        assert pinned_to(engine) == str(gpu)  # its worker sees that GPU and no other


def test_a_crashing_candidate_does_not_take_gpus_out(tmp_path: Path, notes: list[str]) -> None:
    bad = Candidate(files={"csrc/gelu_kernel.cu": (
        CANDIDATES / "gelu" / "illegal_address.cu").read_text()}, origin="user")
    ok = Candidate(params={"KFBOT_TEST_REBUILD": "after"}, origin="user")
    ex = executor("load_elementwise", "gelu_kernel", tmp_path, notes)
    try:
        (_, crashed), (_, fine) = ex.evaluate([bad, ok])
    finally:
        ex.close()
    assert crashed.stage == "runtime" and "illegal" in crashed.reason, crashed.reason
    assert fine.ok, fine.reason
    assert ex.live == GPUS[:2] and not notes
