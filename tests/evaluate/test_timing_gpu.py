"""Interleaved timing on a real GPU: every timed trial's outputs are checked, whether
in full (the first trial on an argument set) or by the four-pass check (later ones)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

pytestmark = pytest.mark.gpu



def _wrong_on_call(bad_call: int | None) -> Callable[[Any], Any]:
    """x * 2, but x * 3 on call `bad_call` (0 is the warm-up call, then one per trial)."""
    calls = [0]

    def op(x: Any) -> Any:
        calls[0] += 1
        return x * (3 if calls[0] - 1 == bad_call else 2)

    return op


def _run(bad_call: int | None) -> Any:
    import torch

    from kfbot.evaluate.device.timed import timed_check
    from kfbot.evaluate.device.timing import TimingSettings, interleaved
    from kfbot.evaluate.device.verify import Context

    arg_sets: list[tuple[list[Any], dict[str, Any]]] = [
        ([torch.randn(1 << 20, device="cuda")], {}) for _ in range(2)]
    fns = {"original": _wrong_on_call(None), "candidate": _wrong_on_call(bad_call)}
    settings = TimingSettings(warmup=1, warmup_seconds=0.0, min_trials=10, max_trials=10)
    return interleaved(fns, arg_sets, settings, seed=0, check=timed_check(Context({}, None)))


def test_honest_ops_pass_every_trial() -> None:
    timed = _run(None)
    assert timed.mismatch is None
    assert [len(s) for s in timed.samples.values()] == [10, 10]
    assert all(us > 0 for s in timed.samples.values() for us in s)


@pytest.mark.parametrize("trial", [1, 2, 7, 10])  # in full, in full, four-pass, the last
def test_a_wrong_output_on_any_one_trial_is_named(trial: int) -> None:
    timed = _run(trial)
    assert timed.mismatch is not None
    assert timed.mismatch.startswith(f"timed trial {trial}:"), timed.mismatch
