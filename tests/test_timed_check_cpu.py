"""The timed-output check's logic on CPU tensors: the first trial of an argument set is
checked in full, later trials that repeat its candidate outputs bit for bit pass in one
pass, and anything else is held to the original's outputs of its own trial."""

from __future__ import annotations

from typing import Any

import pytest

torch = pytest.importorskip("torch")

from kfbot.evaluate.device.jobs import _timed_check  # noqa: E402
from kfbot.evaluate.device.verify import Context  # noqa: E402


def _verdict(result: Any) -> bool | str | None:
    """None (passed without a flag), the flag's value, or the problem's text."""
    if isinstance(result, torch.Tensor):
        return bool(result)
    return result


def test_repeats_of_the_first_outputs_pass_and_anything_else_is_compared() -> None:
    check = _timed_check(Context({}, None))
    want = torch.linspace(-2.0, 2.0, 1000)
    first = want + 1e-7
    assert _verdict(check({"candidate": first, "original": want}, 0)) is True
    assert _verdict(check({"candidate": first.clone(), "original": want}, 0)) is None
    close = want - 1e-7  # not the same bits, within tolerance: compared, and passes
    assert _verdict(check({"candidate": close, "original": want}, 0)) is True
    wrong = want.clone()
    wrong[17] += 1.0
    assert _verdict(check({"candidate": wrong, "original": want}, 0)) is False


def test_the_held_outputs_are_copies_the_candidate_cannot_change() -> None:
    """A launcher that keeps its first output and writes later results into it must
    not make them pass as repeats of the first."""
    check = _timed_check(Context({}, None))
    want = torch.ones(64)
    buffer = want.clone()
    assert _verdict(check({"candidate": buffer, "original": want}, 0)) is True
    buffer.zero_()  # the same storage, now wrong
    assert _verdict(check({"candidate": buffer, "original": want}, 0)) is False


def test_each_argument_set_has_its_own_first_outputs() -> None:
    check = _timed_check(Context({}, None))
    a, b = torch.full((8,), 1.0), torch.full((8,), 2.0)
    assert _verdict(check({"candidate": a, "original": a}, 0)) is True
    assert _verdict(check({"candidate": b, "original": b}, 1)) is True
    # Set 0's outputs on set 1 are not a repeat of set 1's: compared, and wrong there.
    assert _verdict(check({"candidate": a.clone(), "original": b}, 1)) is False


def test_nan_outputs_are_never_taken_for_repeats() -> None:
    check = _timed_check(Context({}, None))
    want = torch.tensor([1.0, float("nan"), 3.0])
    assert _verdict(check({"candidate": want.clone(), "original": want}, 0)) is True
    bad = torch.tensor([1.0, float("nan"), 30.0])
    assert _verdict(check({"candidate": bad, "original": want}, 0)) is False
    assert _verdict(check({"candidate": want.clone(), "original": want}, 0)) is True


def test_after_a_miss_repeats_are_compared_in_full() -> None:
    """Outputs that vary from call to call (atomics) stop the bit-for-bit shortcut for
    their argument set: later trials, repeats or not, are compared with the original."""
    check = _timed_check(Context({}, None))
    want = torch.linspace(0.0, 1.0, 100)
    assert _verdict(check({"candidate": want.clone(), "original": want}, 0)) is True
    assert _verdict(check({"candidate": want + 1e-8, "original": want}, 0)) is True
    repeat = check({"candidate": want.clone(), "original": want}, 0)
    assert isinstance(repeat, torch.Tensor) and bool(repeat)
