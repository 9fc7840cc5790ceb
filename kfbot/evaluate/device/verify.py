"""Correctness inside the worker: the op against its reference and against the original."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from kfbot.evaluate.compare import Comparison, Tolerance, compare, dtype_name, tolerance_for

Op = Callable[..., Any]
Args = tuple[list[Any], dict[str, Any]]


@dataclass(frozen=True)
class InputSet:
    label: str  # e.g. "(4096, 1024) float32 seed#1" or "edge (1, 1)"
    args: list[Any]
    kwargs: dict[str, Any]


def clone(value: Any) -> Any:
    """Deep copy of tensors so one call cannot change what the next call sees."""
    if isinstance(value, torch.Tensor):
        return value.clone()
    if isinstance(value, (list, tuple)):
        return type(value)(clone(v) for v in value)
    if isinstance(value, dict):
        return {k: clone(v) for k, v in value.items()}
    return value


def upcast(value: Any) -> Any:
    """Floating tensors in float64: the reference is computed in higher precision."""
    if isinstance(value, torch.Tensor) and value.is_floating_point():
        return value.double()
    if isinstance(value, (list, tuple)):
        return type(value)(upcast(v) for v in value)
    return value


def call(fn: Op, inputs: InputSet) -> Any:
    out = fn(*clone(inputs.args), **clone(inputs.kwargs))
    torch.cuda.synchronize()
    return out


def reference_output(ref: Op, inputs: InputSet) -> tuple[Any, bool]:
    """The reference's output in float64 where it accepts it, else in the input dtype."""
    try:
        return call(ref, InputSet(inputs.label, upcast(inputs.args), upcast(inputs.kwargs))), True
    except (RuntimeError, TypeError):
        return call(ref, inputs), False


def tensors(out: Any) -> list[Any]:
    if isinstance(out, (list, tuple)):
        return [t for o in out for t in tensors(o)]
    return [out]


def compare_outputs(
    actual: Any, expected: Any, overrides: Mapping[str, Tolerance], block: int | None
) -> list[Comparison]:
    got, want = tensors(actual), tensors(expected)
    if len(got) != len(want):
        raise ValueError(f"the op returned {len(got)} outputs, the reference {len(want)}")
    results = []
    for a, e in zip(got, want, strict=True):
        if not isinstance(a, torch.Tensor) or not isinstance(e, torch.Tensor):
            a = torch.as_tensor(a)
            e = torch.as_tensor(e)
        tol = tolerance_for(dtype_name(a.dtype), overrides)
        results.append(compare(a, e, tol, block))
    return results


def check(
    fn: Op,
    against: str,
    expected: Any,
    inputs: InputSet,
    overrides: Mapping[str, Tolerance],
    block: int | None,
) -> dict[str, Any]:
    """One comparison as a JSON record; an exception from the op is a failed check."""
    try:
        results = compare_outputs(call(fn, inputs), expected, overrides, block)
    except (RuntimeError, ValueError, TypeError) as exc:
        if "CUDA" in str(exc) or "cuda" in type(exc).__name__.lower():
            raise  # a sticky CUDA error: the worker must restart; the engine records it
        return {
            "input": inputs.label,
            "against": against,
            "passed": False,
            "error": f"{type(exc).__name__}: {exc}"[:500],
            "comparisons": [],
        }
    return {
        "input": inputs.label,
        "against": against,
        "passed": all(r.passed for r in results),
        "error": None,
        "comparisons": [r.to_json() for r in results],
    }


def verify(
    fn: Op,
    original: Op | None,
    reference: Callable[[InputSet], Op | None],
    input_sets: Sequence[InputSet],
    overrides: Mapping[str, Tolerance],
    block: int | None,
) -> list[dict[str, Any]]:
    """Compare `fn` with the reference (where callable) and with the original on each input."""
    records = []
    for inputs in input_sets:
        ref = reference(inputs)
        if ref is not None:
            expected, _ = reference_output(ref, inputs)
            records.append(check(fn, "reference", expected, inputs, overrides, block))
        if original is not None:
            expected = call(original, inputs)
            records.append(check(fn, "original", expected, inputs, overrides, block))
    return records
