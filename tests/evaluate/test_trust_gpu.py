"""On a real GPU: redrawn inputs are the same in every process (the clean room makes
them again), and a worker whose device an earlier job left broken is found out by the
next job's health check and replaced, not blamed on that job."""

from __future__ import annotations

from pathlib import Path

import pytest

from kfbot.evaluate.capture.signature import CallSignature, TensorSpec, contiguous_strides
from kfbot.evaluate.inputs.redrawn import distribution_trials
from kfbot.evaluate.worker.session import WorkerSession

pytestmark = pytest.mark.gpu

TESTS = Path(__file__).resolve().parents[1]
KFBOT_PARENT = str(TESTS.parent)
HEALTH = "kfbot.evaluate.device.jobs:device_health"


def _session() -> WorkerSession:
    return WorkerSession(python_path=[KFBOT_PARENT, str(TESTS)], preload=("torch",))


def test_two_processes_draw_the_same_redrawn_inputs() -> None:
    shape = (333, 1025)
    spec = TensorSpec(shape, "float32", contiguous_strides(shape), True, "cuda", -3.0, 3.0,
                      0.0, std=1.0)
    trials = [t.to_json() for t in distribution_trials(
        [CallSignature("m.op", (spec, spec), ())], root=99)]
    payload = {"trials": trials, "seed": 1234}
    with _session() as a, _session() as b:
        first = a.call("worker_jobs:redrawn_bits", payload, timeout_s=120)
        second = b.call("worker_jobs:redrawn_bits", payload, timeout_s=120)
    assert first.ok and second.ok, (first.reason, second.reason)
    assert first.value is not None and second.value is not None
    assert len(first.value["sums"]) == 10 and first.value["sums"] == second.value["sums"]


def test_a_broken_device_is_found_by_the_next_job_and_the_worker_replaced() -> None:
    with _session() as session:
        healthy = session.call(HEALTH, {}, timeout_s=120)
        assert healthy.ok and healthy.value == {"stale": None}, healthy.reason
        before = session.pid
        left = session.call("worker_jobs:leave_a_fault", {}, timeout_s=120)
        assert left.ok, left.reason  # the fault is still in flight when the job ends
        found = session.call(HEALTH, {}, timeout_s=120)
        assert found.ok and found.value is not None and found.value["stale"], found
        assert "device-side assert" in found.value["stale"] or "CUDA error" in \
            found.value["stale"]
        after = session.call(HEALTH, {}, timeout_s=120)  # a fresh worker
        assert after.ok and after.value == {"stale": None}, after.reason
        assert session.pid != before
