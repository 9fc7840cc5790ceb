"""Mutants of an op's result, for the test adequacy gate.

Runs inside the repository's test process (the capture plugin), so torch is there.
A test that still passes when the op returns one of these cannot tell a kernel that
computes from one that does not, or from one that cheats in a known way:

- `zeros`, `constant`, `passthrough` (an input of the output's shape), `uninitialized`
  (what a kernel that writes nothing returns): no computation at all;
- `half-precision`, `tf32` (float32's mantissa cut to TF32's 10 bits), `bfloat16`: a
  float32 result computed in a lower precision;
- `nan-output`: NaN everywhere, which a comparison written `err > tol` lets through;
- `closed-form`: the op on other inputs of the same mean and standard deviation, the
  answer a formula from the input distribution gives (a loss from the mean of
  uniform inputs), right in expectation and wrong for these inputs;
- `strided-subsample`: the op on inputs whose odd elements (last dimension) repeat the
  even ones before them, as statistics computed on every second element come out;
- `last-call-replay`: the previous call's result of the same shape (a batch computed
  on the first call, the rest answered from memory); the first call is answered
  truly, so it needs a test that calls the op twice to be seen.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch


class NotApplicable(Exception):
    """This mutant makes no sense for this op (e.g. no input shaped like the output)."""


# Said by a replay mutant that had nothing earlier to replay: a call's own result is no
# cheat, so the gate does not read it as a reason the mutant could not run at all.
IDLE = "nothing earlier of this shape to replay"


Op = Callable[..., Any]


def mutate(name: str, result: Any, args: Sequence[object],
           kwargs: Mapping[str, object] | None = None, op: Op | None = None) -> Any:
    """`result` as mutant `name` makes it; `op` (called on copies of `args` and `kwargs`
    the mutant makes) is needed by the mutants that compute on other inputs."""
    if name in _OF_OP:
        if op is None:
            raise NotApplicable(f"the {name} mutant needs the op itself")
        return _OF_OP[name](result, list(args), dict(kwargs or {}), op)
    if name == "last-call-replay":
        return _replayed(result)
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


def _single_or_double(t: torch.Tensor) -> None:
    if t.dtype not in (torch.float32, torch.float64):
        raise NotApplicable(f"the output is {t.dtype}, not a single or double float")


def _half(t: torch.Tensor, args: Sequence[object]) -> torch.Tensor:
    _single_or_double(t)
    return t.half().to(t.dtype)


def _bfloat16(t: torch.Tensor, args: Sequence[object]) -> torch.Tensor:
    _single_or_double(t)
    return t.bfloat16().to(t.dtype)


def _tf32(t: torch.Tensor, args: Sequence[object]) -> torch.Tensor:
    """Rounded to nearest at TF32's 10 mantissa bits, float32's range kept."""
    if t.dtype != torch.float32:
        raise NotApplicable(f"the output is {t.dtype}, not float32")
    bits = t.contiguous().view(torch.int32)
    rounded = (bits + 0x1000) & ~0x1FFF
    finite = t.isfinite().reshape(bits.shape)
    return torch.where(finite, rounded, bits).view(torch.float32).reshape(t.shape)


def _nan(t: torch.Tensor, args: Sequence[object]) -> torch.Tensor:
    if not t.is_floating_point():
        raise NotApplicable(f"the output is {t.dtype}: it holds no NaN")
    return torch.full_like(t, float("nan"))


_MAKERS: dict[str, Callable[[torch.Tensor, Sequence[object]], torch.Tensor]] = {
    "zeros": _zeros,
    "constant": _constant,
    "passthrough": _passthrough,
    "uninitialized": _uninitialized,
    "half-precision": _half,
    "tf32": _tf32,
    "bfloat16": _bfloat16,
    "nan-output": _nan,
}


# --- mutants that call the op on inputs of their own -----------------------------------


def _closed_form(result: Any, args: list[object], kwargs: dict[str, object], op: Op) -> Any:
    """The op on inputs of the same mean and standard deviation, drawn anew."""
    gen = torch.Generator().manual_seed(0x5EED)

    def like(t: torch.Tensor) -> torch.Tensor:
        if t.numel() < 2:
            return t.clone()
        work = t.detach().double()
        fresh = torch.randn(t.shape, generator=gen, dtype=torch.float64)
        return (fresh * work.std() + work.mean()).to(t.dtype).to(t.device)

    return _on_floats(result, args, kwargs, op, like)


def _strided(result: Any, args: list[object], kwargs: dict[str, object], op: Op) -> Any:
    """The op on inputs whose odd elements repeat the even ones before them."""

    def every_second(t: torch.Tensor) -> torch.Tensor:
        out = t.detach().clone()
        if t.dim() == 0 or t.shape[-1] < 2:
            return out
        evens = out[..., 0::2]
        out[..., 1::2] = evens[..., : out.shape[-1] // 2]
        return out

    return _on_floats(result, args, kwargs, op, every_second)


def _on_floats(result: Any, args: list[object], kwargs: dict[str, object], op: Op,
               change: Callable[[torch.Tensor], torch.Tensor]) -> Any:
    floats = [a for a in [*args, *kwargs.values()]
              if isinstance(a, torch.Tensor) and a.is_floating_point() and a.numel() >= 2]
    if not floats:
        raise NotApplicable("no floating input to change")

    def copy(value: object) -> object:
        if isinstance(value, torch.Tensor):
            return change(value) if value.is_floating_point() else value.clone()
        if isinstance(value, (list, tuple)):
            return type(value)(copy(v) for v in value)
        return value

    with torch.no_grad():
        return op(*[copy(a) for a in args], **{k: copy(v) for k, v in kwargs.items()})


_OF_OP: dict[str, Callable[[Any, list[object], dict[str, object], Op], Any]] = {
    "closed-form": _closed_form,
    "strided-subsample": _strided,
}


# --- last-call replay ------------------------------------------------------------------

# The last result of each shape and dtype this process's op returned: one test process
# runs one mutant, so this lives as long as the run that needs it.
_LAST: dict[tuple[tuple[int, ...], torch.dtype, str], torch.Tensor] = {}


def _replayed(result: Any) -> Any:
    replayed = [0]

    def replay(t: torch.Tensor) -> torch.Tensor:
        key = (tuple(t.shape), t.dtype, str(t.device))
        earlier = _LAST.get(key)
        _LAST[key] = t.detach().clone()
        if earlier is None:
            return t
        replayed[0] += 1
        return earlier.clone()

    out = _map(result, replay)
    if not replayed[0]:  # the result is the op's own: say so
        raise NotApplicable(IDLE)
    return out

