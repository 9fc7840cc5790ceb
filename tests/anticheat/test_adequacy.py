"""The test adequacy gate on CPU: a real pytest run per mutant, the op's result replaced.

The repository here is a pure-PyTorch op on CPU tensors, so the gate's machinery (the
capture plugin in mutant mode, one pytest process per mutant, the verdicts) runs
for real without a GPU.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import pytest

from kfbot.anticheat.adequacy import (
    IDLE,
    MEANING,
    MUTANTS,
    Adequacy,
    MutantVerdict,
    check_adequacy,
)
from kfbot.evaluate.capture.collect import MutantRuns
from kfbot.evaluate.capture.signature import OpRef

pytest.importorskip("torch")

OPS = '''
import torch

def scale(x):
    return x * 3.0 + 1.0
'''

STRONG = '''
import torch
import ops

def test_scale_matches_reference():
    torch.manual_seed(0)
    x = torch.randn(64, 33)
    torch.testing.assert_close(ops.scale(x), x * 3.0 + 1.0)
'''

WEAK = '''
import torch
import ops

def test_scale_runs():
    x = torch.randn(64, 33)
    out = ops.scale(x)
    assert out.shape == x.shape
'''


def _repo(tmp_path: Path, test: str) -> Path:
    (tmp_path / "ops.py").write_text(OPS)
    (tmp_path / "tests").mkdir()
    (tmp_path / "tests" / "test_ops.py").write_text(test)
    (tmp_path / "conftest.py").write_text("")  # the repository root on sys.path
    return tmp_path


# Each mutant is a pytest process of its own (seconds each on a small machine): the
# tests below run the ones they are about; the strong test shows the defaults.
def _gate(root: Path, op: str, mutants: Sequence[str]) -> Adequacy:
    """The gate on the repository's tests/test_ops.py, run by the evaluation engine's capture."""
    runs = MutantRuns(root, ("tests/test_ops.py",), OpRef.parse(op), timeout_s=120)
    return check_adequacy(runs, mutants=mutants)


STRONG_MUTANTS = ("zeros", "constant", "passthrough", "uninitialized", "strided-subsample",
                  "last-call-replay")


def test_a_strong_test_rejects_every_mutant(tmp_path: Path) -> None:
    root = _repo(tmp_path, STRONG)
    gate = _gate(root, "ops.scale", STRONG_MUTANTS)
    assert [v.mutant for v in gate.verdicts] == list(STRONG_MUTANTS)
    once = {"last-call-replay"}  # the test calls the op once: nothing to replay
    assert {v.mutant: v.verdict for v in gate.verdicts} == {
        m: "not-run" if m in once else "rejected" for m in STRONG_MUTANTS}
    assert gate.trusted and not gate.findings()
    assert gate.summary().startswith("the repository's test rejects 5 of 5")


def test_the_default_mutants_are_every_mutant() -> None:
    assert MUTANTS == ("zeros", "constant", "passthrough", "uninitialized", "half-precision",
                       "tf32", "bfloat16", "nan-output", "closed-form", "strided-subsample",
                       "last-call-replay")


WEAK_MUTANTS = ("zeros", "nan-output")


def test_a_shape_only_test_is_reported_too_weak(tmp_path: Path) -> None:
    root = _repo(tmp_path, WEAK)
    gate = _gate(root, "ops.scale", WEAK_MUTANTS)
    assert gate.accepted == list(WEAK_MUTANTS)
    assert not gate.trusted
    findings = gate.findings()
    assert {f.check for f in findings} == {"test-adequacy"}
    assert all(f.severity == "warn" and "tests/test_ops.py" in f.evidence for f in findings)
    assert "would let through: zeros, nan-output" in gate.summary()
    assert "(a kernel that writes NaN)" in findings[1].reason
    assert "| `zeros` | accepted |" in gate.markdown()


ONE_ELEMENT_TOO = '''
import torch
import ops

def test_scale_matches_reference():
    torch.manual_seed(0)
    for shape in [(1,), (64, 33)]:
        x = torch.randn(shape)
        torch.testing.assert_close(ops.scale(x), x * 3.0 + 1.0)
'''

ONE_ELEMENT_ONLY = ONE_ELEMENT_TOO.replace("[(1,), (64, 33)]", "[(1,)]")


def test_a_mutant_that_changes_some_calls_is_judged_by_them(tmp_path: Path) -> None:
    # A one-element call has no spread to draw from: that call keeps the op's own
    # answer, and the mutant is judged by the call it did change.
    gate = _gate(_repo(tmp_path, ONE_ELEMENT_TOO), "ops.scale", ("closed-form",))
    assert [(v.mutant, v.verdict) for v in gate.verdicts] == [("closed-form", "rejected")]


def test_a_mutant_that_changes_no_call_did_not_run(tmp_path: Path) -> None:
    gate = _gate(_repo(tmp_path, ONE_ELEMENT_ONLY), "ops.scale", ("closed-form",))
    assert gate.verdicts == (
        MutantVerdict("closed-form", "not-run", "no floating input to change"),)


def test_a_test_that_never_calls_the_op_runs_no_mutant(tmp_path: Path) -> None:
    root = _repo(tmp_path, "def test_nothing():\n    assert True\n")
    gate = _gate(root, "ops.scale", ("zeros",))
    assert gate.verdicts == (MutantVerdict("zeros", "not-run", "the tests never called the op"),)
    assert not gate.trusted
    assert "could not be run" in gate.summary()


def test_verdicts_round_trip_through_json() -> None:
    gate = Adequacy(("t.py",), (MutantVerdict("zeros", "accepted", "x"),
                                MutantVerdict("constant", "rejected", "y")))
    assert Adequacy.from_json(gate.to_json()) == gate


def test_every_mutant_has_a_maker_and_a_meaning() -> None:
    torch = pytest.importorskip("torch")
    from kfbot.anticheat.mutants import NotApplicable, mutate

    def op(t: object) -> object:
        return t * 2  # type: ignore[operator]

    x = torch.randn(4, 5)
    result = op(x)
    assert torch.equal(mutate("zeros", result, [x]), torch.zeros(4, 5))
    assert torch.equal(mutate("constant", result, [x]), torch.full((4, 5), 0.5))
    assert torch.equal(mutate("passthrough", result, [x]), x)
    assert mutate("uninitialized", result, [x]).shape == (4, 5)
    half = mutate("half-precision", result, [x])
    assert half.dtype == torch.float32 and torch.equal(half, result.half().float())
    assert set(MEANING) == set(MUTANTS)
    for name in set(MUTANTS) - {"last-call-replay"}:
        mutate(name, (result, result), [x], {}, lambda t: (op(t), op(t)))  # element-wise
    with pytest.raises(NotApplicable):
        mutate("passthrough", result, [torch.randn(3)])
    with pytest.raises(NotApplicable):
        mutate("half-precision", torch.arange(3), [x])
    with pytest.raises(NotApplicable, match="needs the op"):
        mutate("closed-form", result, [x])
    with pytest.raises(NotApplicable):
        mutate("nan-output", torch.arange(3), [x])


def test_precision_and_nan_mutants_on_cpu_tensors() -> None:
    torch = pytest.importorskip("torch")
    from kfbot.anticheat.mutants import mutate

    x = torch.randn(1000, dtype=torch.float32) * 100
    tf32 = mutate("tf32", x, [x])
    rel = ((tf32 - x).abs() / x.abs()).max()
    assert 2.0**-14 < float(rel) <= 2.0**-11  # TF32's 10 bits, rounded to nearest
    assert bool((tf32.view(torch.int32) & 0x1FFF == 0).all())
    bf16 = mutate("bfloat16", x, [x])
    assert torch.equal(bf16, x.bfloat16().float())
    assert bool(mutate("nan-output", x, [x]).isnan().all())
    big = torch.tensor([3e38, float("inf")])
    assert torch.equal(mutate("tf32", big, [big])[1:], big[1:])


def test_closed_form_and_strided_mutants_compute_on_inputs_of_their_own() -> None:
    torch = pytest.importorskip("torch")
    from kfbot.anticheat.mutants import mutate

    x = torch.rand(64, 4096) * 4 + 10  # mean 12, std about 1.15
    calls: list[torch.Tensor] = []

    def row_mean(t: torch.Tensor) -> torch.Tensor:
        calls.append(t)
        return t.mean(dim=-1)

    truth = row_mean(x)
    closed = mutate("closed-form", truth, [x], {}, row_mean)
    assert calls[-1] is not x and torch.equal(x, calls[0])  # the caller's x untouched
    assert abs(float(calls[-1].mean()) - float(x.mean())) < 0.01
    assert abs(float(calls[-1].std()) - float(x.std())) < 0.01
    assert 0 < float((closed - truth).abs().max()) < 0.1  # right in expectation only
    strided = mutate("strided-subsample", truth, [x], {}, row_mean)
    assert torch.allclose(strided, x[:, 0::2].mean(dim=-1))
    ints = torch.arange(10)
    mutate("strided-subsample", truth, [x, ints], {}, lambda a, b: a.mean(-1))
    assert torch.equal(ints, torch.arange(10))


def test_last_call_replay_returns_the_previous_result_of_the_same_shape() -> None:
    torch = pytest.importorskip("torch")
    from kfbot.anticheat import mutants

    mutants._LAST.clear()
    a, b, c = torch.ones(3), torch.full((3,), 2.0), torch.ones(5)
    # Nothing earlier of the shape: the op's own result stands, and the gate is told.
    with pytest.raises(mutants.NotApplicable, match=mutants.IDLE):
        mutants.mutate("last-call-replay", a, [])
    assert torch.equal(mutants.mutate("last-call-replay", b, []), a)
    with pytest.raises(mutants.NotApplicable, match=mutants.IDLE):
        mutants.mutate("last-call-replay", c, [])  # another shape
    assert torch.equal(mutants.mutate("last-call-replay", a, []), b)
    assert mutants.IDLE == IDLE  # the gate, which runs without torch, reads the same words


LOOSE_MEAN_OPS = """
import torch

def row_mean(x):
    return x.mean(dim=-1)
"""

LOOSE_MEAN_TEST = """
import torch
import ops

def test_row_mean_loosely():
    torch.manual_seed(0)
    for _ in range(2):
        x = torch.rand(64, 4096) * 4 + 10
        err = (ops.row_mean(x) - x.mean(dim=-1)).abs().max()
        assert not (err > 0.2)  # the comparison a NaN passes
"""

TIGHT_MEAN_TEST = """
import torch
import ops

def test_row_mean():
    torch.manual_seed(0)
    for _ in range(2):
        x = torch.rand(64, 4096) * 4 + 10
        torch.testing.assert_close(ops.row_mean(x), x.mean(dim=-1))
"""

LOOSE = ("nan-output", "closed-form", "last-call-replay")
TIGHT = ("closed-form", "tf32", "last-call-replay")


def _mean_repo(tmp_path: Path, test: str) -> Path:
    root = _repo(tmp_path, test)
    (root / "ops.py").write_text(LOOSE_MEAN_OPS)
    return root


def test_a_loose_statistic_test_lets_the_new_mutants_through(tmp_path: Path) -> None:
    root = _mean_repo(tmp_path, LOOSE_MEAN_TEST)
    gate = _gate(root, "ops.row_mean", LOOSE)
    # Two calls of one shape: the replayed mean of other values is within 0.2 as well.
    assert gate.accepted == list(LOOSE), gate.verdicts
    assert "would let through: nan-output, closed-form, last-call-replay" in gate.summary()


def test_a_tight_test_rejects_the_new_mutants(tmp_path: Path) -> None:
    root = _mean_repo(tmp_path, TIGHT_MEAN_TEST)
    gate = _gate(root, "ops.row_mean", TIGHT)
    assert {v.mutant: v.verdict for v in gate.verdicts} == dict.fromkeys(TIGHT, "rejected"), \
        gate.verdicts
    assert gate.trusted
