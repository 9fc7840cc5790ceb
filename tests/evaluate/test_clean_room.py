"""The clean room on CPU stand-ins: a candidate's saved outputs judged in a real worker
process that never loaded the candidate, on inputs it makes again itself."""

from __future__ import annotations

import pickle
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")

from kfbot.evaluate.capture.signature import CallSignature, TensorSpec  # noqa: E402
from kfbot.evaluate.device.cleanroom import save_outputs, specs  # noqa: E402
from kfbot.evaluate.inputs.contract import Trial  # noqa: E402
from kfbot.evaluate.inputs.redrawn import distribution_trials  # noqa: E402
from kfbot.evaluate.isolation import CLEAN_ROOM_JOB  # noqa: E402
from kfbot.evaluate.worker.session import WorkerSession  # noqa: E402

REPO = Path(__file__).resolve().parents[1] / "data" / "softmax_repo"
KFBOT_PARENT = str(Path(__file__).resolve().parents[2])
SPEC = TensorSpec((32, 65), "float32", (65, 1), True, "cpu", -3.0, 3.0, 0.0, std=1.0)
SIG = CallSignature("softmax_ops.softmax_no_max", (SPEC,), (), tests=())
PAYLOAD = {"op": {"kind": "module", "module": "softmax_ops", "name": "softmax_no_max"},
           "original": {"artifact": str(REPO / "softmax_ops.py"), "module_name": "softmax_ops"},
           "references": [{"callable_ref": "softmax_ops:reference"}], "tolerances": {},
           "sys_path": [str(REPO)], "device": "cpu"}


def _sets() -> list[dict[str, Any]]:
    added = [t.to_json() for t in distribution_trials([SIG], root=3)
             if t.values in ("normal", "uniform")]
    added.append(Trial("edge", "edge (1, 65) float32", SIG).to_json())  # recorded: not judged
    return specs([SIG], seed=17, added=added, contract_seed=23)


@pytest.fixture(scope="module")
def judge(tmp_path_factory: pytest.TempPathFactory) -> Any:
    # The judge reads the saved outputs by path: the tests save them under the test run's
    # temporary folder, which the sandbox shows only when named (the engine names its
    # cache, where the clean room's folder lies).
    with WorkerSession(cwd=REPO, python_path=[KFBOT_PARENT, str(REPO)],
                       readable=[tmp_path_factory.getbasetemp()]) as session:
        yield lambda saved: session.call(CLEAN_ROOM_JOB, {**PAYLOAD, "saved": saved},
                                         timeout_s=120)


def test_the_judged_sets_are_the_first_of_each_shape_and_the_redrawn_ones() -> None:
    sets = _sets()
    assert sets[0]["label"] == "(32, 65) float32 seed#0"
    # recorded values with the evaluation's seed; redrawn ones with the contract's
    assert sorted((s["values"], s["seed"]) for s in sets) == [
        ("normal", 23), ("recorded", 17), ("uniform", 23)]


def test_right_outputs_pass_and_wrong_ones_fail_in_the_other_process(
        tmp_path: Path, judge: Any) -> None:
    def honest(x: Any) -> Any:
        return torch.softmax(x, dim=-1)

    def skips_the_last_column(x: Any) -> Any:
        out = torch.softmax(x, dim=-1)
        out[:, -1] = 0.0
        return out

    good = save_outputs(honest, _sets(), str(tmp_path / "good"), device="cpu")
    assert all(Path(s["file"]).is_file() for s in good)
    job = judge(good)
    assert job.ok, job.reason
    records = job.value["records"]
    assert [r["passed"] for r in records] == [True] * 3 and {r["check"] for r in records} == \
        {"clean-room"}
    assert job.value["numerics"]["matmul_allow_tf32"] is False
    bad = save_outputs(skips_the_last_column, _sets(), str(tmp_path / "bad"), device="cpu")
    records = judge(bad).value["records"]
    assert [r["passed"] for r in records] == [False] * 3
    assert "judged in a process the candidate never ran in" in records[0]["error"]
    assert "last 1 of 65 columns" in records[0]["error"]


class _Planted:
    """A pickle that runs code when loaded the unsafe way."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[Any, ...]:
        return (Path.touch, (self.marker,))


def test_a_file_that_is_not_plain_tensors_is_never_run(tmp_path: Path, judge: Any) -> None:
    marker = tmp_path / "ran"
    saved = save_outputs(lambda x: torch.softmax(x, dim=-1), _sets()[:1],
                         str(tmp_path / "evil"), device="cpu")
    Path(saved[0]["file"]).write_bytes(pickle.dumps([_Planted(marker)]))
    records = judge(saved).value["records"]
    assert not records[0]["passed"] and "cannot be read" in records[0]["error"]
    assert not marker.exists()


def test_an_op_that_answers_in_its_arguments_is_left_to_its_own_worker(
        tmp_path: Path) -> None:
    def in_place(x: Any) -> None:
        x.mul_(2)

    assert save_outputs(in_place, _sets(), str(tmp_path / "none"), device="cpu") == []
