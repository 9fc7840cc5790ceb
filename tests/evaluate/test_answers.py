"""An op that answers in its arguments (returns nothing, or a status): what it is judged
by, against the original and against a reference that computes fewer outputs."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from kfbot.evaluate.capture.via import answers_in_arguments  # noqa: E402
from kfbot.evaluate.device.answers import for_reference, in_arguments  # noqa: E402


def _nearest_call() -> tuple[list[object], object]:
    """`int nearest_forward(a, b, dist, idx)` after the call: the distances and indices
    written, the status returned."""
    a, b = torch.rand(2, 50, 2), torch.rand(2, 30, 2)
    d = ((a[:, :, None, :] - b[:, None, :, :]) ** 2).sum(-1)
    dist, idx = d.min(dim=2).values, d.min(dim=2).indices.int()
    return [a, b, dist, idx], d.min(dim=2).values.double()


def test_a_status_return_answers_with_every_tensor_argument_and_the_status() -> None:
    args, _ = _nearest_call()
    answer = in_arguments(1, args, {})
    assert len(answer) == 5 and answer[-1] == 1
    assert all(x is y for x, y in zip(answer[:4], args, strict=True))
    assert in_arguments(None, args, {"out": args[2]})[-1] is args[2]  # keywords after
    assert answers_in_arguments(1) and answers_in_arguments(None)
    assert not answers_in_arguments((1, args[0])) and not answers_in_arguments(0.5)


def test_a_reference_is_compared_with_the_one_argument_of_its_shape_and_kind() -> None:
    args, want = _nearest_call()
    answer = in_arguments(1, args, {})
    assert for_reference(answer, want) is args[2]  # float distances, not int indices
    assert for_reference(answer, (want, args[3].long())) == (args[2], args[3])
    assert for_reference(answer, torch.zeros(7)) is None  # no argument of that shape
    twice = in_arguments(None, [*args, args[2].clone()], {})
    assert for_reference(twice, want) is None  # two fit: none is chosen
    assert for_reference(in_arguments(3, args, {}), 3) == 3  # a count, compared as one
