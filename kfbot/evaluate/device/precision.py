"""How many bits of the op's dtype a candidate keeps, against a float64 reference.

A float32 op computed through TF32 tensor cores, bfloat16 or half keeps about 8 to 11
bits where float32 keeps 24; under a loose tolerance (a repository's own, or
kfbot's on a long reduction) that passes unseen. Here the candidate's error and the
original's, on the same inputs, are read as bits of precision:

    error = mean |out - ref| / mean |ref|,   bits = -log2(error)

The original is the yardstick (a long sum loses bits whatever computes it), and the
declared dtype's lower neighbours say what a silent downcast looks like:

- `precision-loss` (rejects): the candidate lost at least `STRICT_BITS` bits to the
  original and its error is within 4 bits of a lower precision's rounding (TF32 and
  half: 11 bits, bfloat16: 8; for float64, float32's 24);
- a warning when it lost at least `WARN_BITS` bits otherwise;
- a note with both figures in every other case, for the reviewer.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any, Literal

import torch

from kfbot.evaluate.device.answers import tensors
from kfbot.evaluate.device.verify import InputSet, call, reference_output

Verdict = Literal["strict", "warn", "note"]
WARN_BITS = 5.0
STRICT_BITS = 6.0
# The relative rounding error (unit roundoff) of the precisions below each dtype.
LOWER: dict[torch.dtype, tuple[tuple[str, float], ...]] = {
    torch.float32: (("TF32 or float16", 2.0**-11), ("bfloat16", 2.0**-8)),
    torch.float64: (("float32", 2.0**-24),),
}


def bits(error: float) -> float:
    return math.inf if error <= 0 else -math.log2(error)


def relative_error(out: torch.Tensor, ref: torch.Tensor) -> float | None:
    """mean |out - ref| / mean |ref| over the elements where both are finite; None when
    nothing is left to measure (no finite element, or a reference of zeros)."""
    if out.shape != ref.shape or not out.is_floating_point():
        return None
    a, e = out.double(), ref.to(out.device).double()
    finite = a.isfinite() & e.isfinite()
    if not bool(finite.any()):
        return None
    scale = float(e[finite].abs().mean())
    if scale == 0.0:
        return None
    return float((a - e)[finite].abs().mean()) / scale


def judge_precision(candidate_error: float, original_error: float, dtype: torch.dtype
                    ) -> tuple[Verdict, str]:
    """The verdict and its one line, from the two errors against float64."""
    floor = torch.finfo(dtype).eps / 4  # an original can be exact on easy inputs
    lost = bits(max(original_error, floor)) - bits(candidate_error)
    said = (f"the candidate keeps {bits(candidate_error):.1f} bits against a float64 "
            f"reference, the original {bits(original_error):.1f} ({_name(dtype)})")
    if lost >= STRICT_BITS:
        for lower, rounding in LOWER.get(dtype, ()):
            if candidate_error >= rounding / 16:
                return "strict", (f"{said}: {lost:.1f} bits lost, as much as {lower} "
                                  f"rounding loses: a precision below {_name(dtype)}")
    if lost >= WARN_BITS:
        return "warn", f"{said}: {lost:.1f} bits lost"
    return "note", said


def _name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def precision(candidate: Any, original: Any, reference: Any, inputs: InputSet
              ) -> dict[str, Any] | None:
    """The worst output's verdict on `inputs`, as JSON: None without a float64
    reference, or without a floating output to measure."""
    want, upcast = reference_output(reference, inputs)
    if not upcast:
        return None
    got, base = tensors(call(candidate, inputs)), tensors(call(original, inputs))
    worst: dict[str, Any] | None = None
    for c, o, e in zip(got, base, tensors(want), strict=False):
        if not all(isinstance(t, torch.Tensor) for t in (c, o, e)) or c.dtype not in LOWER:
            continue
        err_c, err_o = relative_error(c, e), relative_error(o, e)
        if err_c is None or err_o is None:
            continue
        verdict, line = judge_precision(err_c, err_o, c.dtype)
        margin = bits(err_c) - bits(err_o)
        if worst is None or margin < worst["margin"]:
            worst = {"input": inputs.label, "verdict": verdict, "line": line,
                     "candidate_bits": bits(err_c), "original_bits": bits(err_o),
                     "margin": margin}
    return worst


def precision_record(found: Mapping[str, Any]) -> dict[str, Any]:
    """A rejecting verdict as a failed check record."""
    return {"input": found["input"], "against": "reference", "passed": False,
            "check": "precision-loss", "error": found["line"], "comparisons": [],
            "run": "plain call, errors against the float64 reference"}
