"""The motivating hack on CPU tensors: a softmax that skips the max subtraction passes
the standard-normal rows a test draws, and fails kfbot's judgement on the redrawn
ones (heavy tails, wide exponents, spikes), named `non-finite`; an online softmax that
keeps a running max passes every one of them."""

from __future__ import annotations

from typing import Any

import pytest

torch = pytest.importorskip("torch")

from kfbot.evaluate.capture.signature import CallSignature, TensorSpec  # noqa: E402
from kfbot.evaluate.device.verify import (  # noqa: E402
    Context,
    InputSet,
    Run,
    judge,
    own_non_finite,
)
from kfbot.evaluate.inputs.distributions import DISTRIBUTIONS, draw_args  # noqa: E402

ROWS = CallSignature("m.softmax", (TensorSpec((64, 1024), "float32", (1024, 1), True, "cpu",
                                              -4.5, 4.6, 0.0, std=1.0),), ())


def no_max(x: Any) -> Any:
    e = torch.exp(x)
    return e / e.sum(dim=-1, keepdim=True)


def online(x: Any) -> Any:
    """Chunks of 128 columns: a running max, the sum rescaled whenever it grows."""
    m = torch.full(x.shape[:-1], float("-inf"))
    s = torch.zeros(x.shape[:-1])
    for chunk in x.split(128, dim=-1):
        top = torch.maximum(m, chunk.amax(dim=-1))
        s = s * torch.exp(m - top) + torch.exp(chunk - top[..., None]).sum(dim=-1)
        m = top
    return torch.exp(x - m[..., None]) / s[..., None]


def _verdict(op: Any, args: list[Any], label: str) -> dict[str, Any]:
    x = args[0]
    want = torch.softmax(x.double(), dim=-1)
    inputs = InputSet(label, args, {})
    rec = judge(Run(op(x.clone())), want, inputs, "reference", Context({}, None))
    # The run under the finite poison pattern, where a NaN can only be the op's own.
    return own_non_finite(rec, Run(op(x.clone())), want)


def test_standard_normal_rows_cannot_tell_them_apart() -> None:
    from kfbot.evaluate.inputs.fresh import make_args

    args, _ = make_args(ROWS, 3, "cpu")
    assert _verdict(no_max, args, "captured")["passed"]
    assert _verdict(online, args, "captured")["passed"]


def test_the_redrawn_rows_reject_the_hack_and_pass_the_online_softmax() -> None:
    verdicts = {}
    for name in DISTRIBUTIONS:
        args, _ = draw_args(ROWS, 11, "cpu", name)
        verdicts[name] = _verdict(no_max, args, name)
        assert _verdict(online, args, name)["passed"], name
    for name in ("pareto", "wide", "spikes"):  # rows past 88: exp overflows float32
        assert not verdicts[name]["passed"] and verdicts[name]["check"] == "non-finite", name
        assert "NaN or Inf where the reference is finite" in verdicts[name]["error"]
