"""Trivial mutants of an op's result, for the test adequacy gate.

Runs inside the repository's test process (the capture plugin), so torch is there.
A test that still passes when the op returns one of these cannot tell a kernel that
computes from one that does not.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch


class NotApplicable(Exception):
    """This mutant makes no sense for this op (e.g. no input shaped like the output)."""


def mutate(name: str, result: Any, args: Sequence[object]) -> Any:
    if name not in _MAKERS:
        raise NotApplicable(f"unknown mutant {name!r}")
    return _map(result, lambda t: _MAKERS[name](t, args))


def _map(value: Any, fn: Callable[[torch.Tensor], torch.Tensor]) -> Any:
    if isinstance(value, torch.Tensor):
        return fn(value)
    if isinstance(value, (list, tuple)):
        return type(value)(_map(v, fn) for v in value)
    return value


def _zeros(t: torch.Tensor, args: Sequence[object]) -> torch.Tensor:
    return torch.zeros_like(t)


def _constant(t: torch.Tensor, args: Sequence[object]) -> torch.Tensor:
    return torch.full_like(t, 1 if not t.is_floating_point() else 0.5)


def _passthrough(t: torch.Tensor, args: Sequence[object]) -> torch.Tensor:
    """The first input of the output's shape, returned unchanged (a copy)."""
    for arg in args:
        if isinstance(arg, torch.Tensor) and arg.shape == t.shape:
            return arg.to(t.dtype).clone()
    raise NotApplicable("no input has the output's shape")


def _uninitialized(t: torch.Tensor, args: Sequence[object]) -> torch.Tensor:
    # What a kernel that writes nothing returns: whatever the allocator hands out.
    return torch.empty_like(t)


def _half(t: torch.Tensor, args: Sequence[object]) -> torch.Tensor:
    if t.dtype not in (torch.float32, torch.float64):
        raise NotApplicable(f"the output is {t.dtype}, not a single or double float")
    return t.half().to(t.dtype)


_MAKERS: dict[str, Callable[[torch.Tensor, Sequence[object]], torch.Tensor]] = {
    "zeros": _zeros,
    "constant": _constant,
    "passthrough": _passthrough,
    "uninitialized": _uninitialized,
    "half-precision": _half,
}
