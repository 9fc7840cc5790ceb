"""What an op answered with, where it returns no tensor.

Many ops write into tensors they are handed and return nothing (`rms_norm(Tensor! out,
...) -> ()`) or a status (`int nearest_forward(a, b, dist, idx)` returning 1). Their
answer is in their arguments: every tensor argument after the call, so a candidate that
leaves `out` unwritten differs from the original instead of matching its None or its 1.
A reference computes fewer outputs than that (the distances, not the points nor the
indices); it is compared with the arguments of its shape and kind, where exactly one
argument fits each of its outputs.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch


def tensors(out: Any) -> list[Any]:
    """An output's values, nested lists and tuples flattened."""
    if isinstance(out, (list, tuple)):
        return [t for o in out for t in tensors(o)]
    return [out]


def fits(reference_out: Any, op_out: Any) -> bool:
    """Whether a reference's output has the op's shape of outputs (a test may check one
    of two outputs, or a wrapper's result the op does not return)."""
    return len(tensors(reference_out)) == len(tensors(op_out))


def written(args: Sequence[Any], kwargs: Mapping[str, Any]) -> tuple[Any, ...]:
    """The tensor arguments of a call, positional then keyword, in order."""
    values = tensors([*args, *(kwargs[k] for k in sorted(kwargs))])
    return tuple(v for v in values if isinstance(v, torch.Tensor))


def in_arguments(out: Any, args: Sequence[Any], kwargs: Mapping[str, Any]) -> tuple[Any, ...]:
    """The answer of an op that returned `out`, nothing or a status: its tensor arguments,
    and the status, if any (a candidate must return the same)."""
    answer = written(args, kwargs)
    return answer if out is None else (*answer, out)


def for_reference(answer: Any, want: Any) -> Any | None:
    """The part of an answer in arguments a reference's output `want` is compared with:
    per output of the reference, the one argument of its shape and kind (floating or
    not); None where none or several fit."""
    wanted, values = tensors(want), tensors(answer)
    if len(wanted) == 1 and not isinstance(wanted[0], torch.Tensor):
        status = values[-1]  # a count the op returned beside what it wrote
        return status if not isinstance(status, torch.Tensor) else None
    got = [a for a in values if isinstance(a, torch.Tensor)]
    picked = []
    for w in wanted:
        if not isinstance(w, torch.Tensor):
            return None
        same = [a for a in got if a.shape == w.shape
                and a.is_floating_point() == w.is_floating_point()]
        if len(same) != 1:
            return None
        picked.append(same[0])
    if isinstance(want, (list, tuple)):
        return tuple(picked)
    return picked[0] if len(picked) == 1 else None

