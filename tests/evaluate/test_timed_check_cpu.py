"""The timed-output check's logic on CPU tensors: the first trial of an argument set is
checked in full, later trials that repeat its candidate outputs bit for bit pass in one
pass, and anything else is held to the original's outputs of its own trial."""

from __future__ import annotations

from typing import Any

import pytest

torch = pytest.importorskip("torch")

from kfbot.evaluate.device.timed import timed_check  # noqa: E402
from kfbot.evaluate.device.verify import Context  # noqa: E402


def _verdict(result: Any) -> bool | str | None:
    """None (passed without a flag), the flag's value, or the problem's text."""
    if isinstance(result, torch.Tensor):
        return bool(result)
    return result


def test_repeats_of_the_first_outputs_pass_and_anything_else_is_compared() -> None:
    check = timed_check(Context({}, None))
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
    check = timed_check(Context({}, None))
    want = torch.ones(64)
    buffer = want.clone()
    assert _verdict(check({"candidate": buffer, "original": want}, 0)) is True
    buffer.zero_()  # the same storage, now wrong
    assert _verdict(check({"candidate": buffer, "original": want}, 0)) is False


def test_each_argument_set_has_its_own_first_outputs() -> None:
    check = timed_check(Context({}, None))
    a, b = torch.full((8,), 1.0), torch.full((8,), 2.0)
    assert _verdict(check({"candidate": a, "original": a}, 0)) is True
    assert _verdict(check({"candidate": b, "original": b}, 1)) is True
    # Set 0's outputs on set 1 are not a repeat of set 1's: compared, and wrong there.
    assert _verdict(check({"candidate": a.clone(), "original": b}, 1)) is False


def test_nan_outputs_are_never_taken_for_repeats() -> None:
    check = timed_check(Context({}, None))
    want = torch.tensor([1.0, float("nan"), 3.0])
    assert _verdict(check({"candidate": want.clone(), "original": want}, 0)) is True
    bad = torch.tensor([1.0, float("nan"), 30.0])
    assert _verdict(check({"candidate": bad, "original": want}, 0)) is False
    assert _verdict(check({"candidate": want.clone(), "original": want}, 0)) is True


def test_after_a_miss_repeats_are_compared_in_full() -> None:
    """Outputs that vary from call to call (atomics) stop the bit-for-bit shortcut for
    their argument set: later trials, repeats or not, are compared with the original."""
    check = timed_check(Context({}, None))
    want = torch.linspace(0.0, 1.0, 100)
    assert _verdict(check({"candidate": want.clone(), "original": want}, 0)) is True
    assert _verdict(check({"candidate": want + 1e-8, "original": want}, 0)) is True
    repeat = check({"candidate": want.clone(), "original": want}, 0)
    assert isinstance(repeat, torch.Tensor) and bool(repeat)


def test_swaps_change_the_timed_inputs_but_keep_their_values() -> None:
    from kfbot.evaluate.device.timing import Swaps

    x = torch.randn(4096)
    ints = torch.arange(100)
    before = x.clone()
    swaps = Swaps([([x, ints], {})], seed=3, every=1)
    swaps(0, 0)  # a set's first trial runs on the inputs it was made with
    assert torch.equal(x, before) and not swaps.dirty
    swaps(1, 0)
    assert not torch.equal(x, before)
    assert torch.equal(x.sort().values, before.sort().values)  # the same values, moved
    assert torch.equal(ints, torch.arange(100))  # integers are never touched
    assert swaps.dirty == {0} and swaps.swapped == 1


def test_swaps_come_on_about_one_trial_in_four() -> None:
    from kfbot.evaluate.device.timing import Swaps

    swaps = Swaps([([torch.randn(64)], {})], seed=5)
    for trial in range(1, 401):
        swaps(trial, 0)
    assert 60 < swaps.swapped < 140


def test_after_a_swap_a_replayed_output_is_compared_with_the_new_one() -> None:
    """A candidate that answers from memory returns its first output again after the
    inputs changed: the bit-for-bit shortcut must not pass it."""
    dirty: set[int] = set()
    check = timed_check(Context({}, None), dirty)
    want = torch.linspace(-1.0, 1.0, 256)
    stale = want.clone()
    assert _verdict(check({"candidate": stale, "original": want}, 0)) is True
    assert _verdict(check({"candidate": stale.clone(), "original": want}, 0)) is None
    changed = want.flip(0)  # the original's output after the inputs moved
    dirty.add(0)
    assert _verdict(check({"candidate": stale.clone(), "original": changed}, 0)) is False
    assert not dirty
