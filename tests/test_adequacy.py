"""The test adequacy gate on CPU: a real pytest run per mutant, the op's result replaced.

The repository here is a pure-PyTorch op on CPU tensors, so the gate's machinery (the
capture plugin in mutant mode, one pytest process per mutant, the verdicts) runs
for real without a GPU.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from kfbot.anticheat.adequacy import MUTANTS, Adequacy, MutantVerdict, check_adequacy
from kfbot.evaluate.signature import OpRef

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


def test_a_strong_test_rejects_every_mutant(tmp_path: Path) -> None:
    root = _repo(tmp_path, STRONG)
    gate = check_adequacy(root, ["tests/test_ops.py"], OpRef.parse("ops.scale"), timeout_s=120)
    assert [v.mutant for v in gate.verdicts] == list(MUTANTS)
    assert {v.mutant: v.verdict for v in gate.verdicts} == dict.fromkeys(MUTANTS, "rejected")
    assert gate.trusted and not gate.findings()
    assert gate.summary().startswith("the repository's test rejects 5 of 5")


def test_a_shape_only_test_is_reported_too_weak(tmp_path: Path) -> None:
    root = _repo(tmp_path, WEAK)
    gate = check_adequacy(root, ["tests/test_ops.py"], OpRef.parse("ops.scale"), timeout_s=120)
    assert gate.accepted == list(MUTANTS)
    assert not gate.trusted
    findings = gate.findings()
    assert {f.check for f in findings} == {"test-adequacy"}
    assert all(f.severity == "warn" and "tests/test_ops.py" in f.evidence for f in findings)
    assert "too weak" in gate.summary()
    assert "| `zeros` | accepted |" in gate.markdown()


def test_a_test_that_never_calls_the_op_runs_no_mutant(tmp_path: Path) -> None:
    root = _repo(tmp_path, "def test_nothing():\n    assert True\n")
    gate = check_adequacy(root, ["tests/test_ops.py"], OpRef.parse("ops.scale"), timeout_s=120,
                          mutants=("zeros",))
    assert gate.verdicts == (MutantVerdict("zeros", "not-run", "the tests never called the op"),)
    assert not gate.trusted
    assert "could not be run" in gate.summary()


def test_verdicts_round_trip_through_json() -> None:
    gate = Adequacy(("t.py",), (MutantVerdict("zeros", "accepted", "x"),
                                MutantVerdict("constant", "rejected", "y")))
    assert Adequacy.from_json(gate.to_json()) == gate


def test_every_mutant_has_a_maker() -> None:
    torch = pytest.importorskip("torch")
    from kfbot.anticheat.mutants import NotApplicable, mutate

    x = torch.randn(4, 5)
    result = x * 2
    assert torch.equal(mutate("zeros", result, [x]), torch.zeros(4, 5))
    assert torch.equal(mutate("constant", result, [x]), torch.full((4, 5), 0.5))
    assert torch.equal(mutate("passthrough", result, [x]), x)
    assert mutate("uninitialized", result, [x]).shape == (4, 5)
    half = mutate("half-precision", result, [x])
    assert half.dtype == torch.float32 and torch.equal(half, result.half().float())
    for name in MUTANTS:
        mutate(name, (result, result), [x])  # tuples of outputs are mutated element-wise
    with pytest.raises(NotApplicable):
        mutate("passthrough", result, [torch.randn(3)])
    with pytest.raises(NotApplicable):
        mutate("half-precision", torch.arange(3), [x])
