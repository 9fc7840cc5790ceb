"""Compare the way the repository's test compares.

kfbot's comparison is strict: the same shape, and the reference's dtype (or any
floating dtype against a float64 reference). A test's own comparison may accept more:
`torch.allclose(out, ref)` broadcasts, so a result of shape (1,) passes against a
reference of shape (); `numpy.allclose` and `(out - ref).abs().max() < tol` also
promote dtypes. Where the repository's test accepts an output, so does kfbot, and the
report says that kfbot's own comparison would not have (a warning, not a failure).

Only what broadcasting does without copying values counts here: the same elements in
the same order, shapes differing by dimensions of size 1.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from kfbot.evaluate.verdict.compare import dtype_name

# The comparisons that broadcast, and those that also promote dtypes, by the names the
# scan gives them (`kfbot.scan.python.compare`).
_BROADCAST = frozenset({"torch.allclose", "torch.isclose", "numpy.allclose",
                        "numpy.testing.assert_allclose", "numpy.testing.assert_almost_equal",
                        "numpy.testing.assert_array_almost_equal", "abs-max-diff"})
_PROMOTE = frozenset({"numpy.allclose", "numpy.testing.assert_allclose",
                      "numpy.testing.assert_almost_equal",
                      "numpy.testing.assert_array_almost_equal", "abs-max-diff",
                      "torch.testing.assert_allclose"})


@dataclass(frozen=True)
class Leniency:
    comparison: str
    broadcast: bool
    promote: bool


def leniency_of(comparison: str) -> Leniency | None:
    """What the named comparison accepts beyond kfbot's; None for one as strict."""
    broadcast, promote = comparison in _BROADCAST, comparison in _PROMOTE
    return Leniency(comparison, broadcast, promote) if broadcast or promote else None


def relaxed(outputs: Sequence[Any], expected: Any, lenient: Leniency | None
            ) -> tuple[Any, str]:
    """`expected`, each tensor shaped and typed as the test's comparison would meet the
    matching one of the op's `outputs`; and what was accepted that kfbot alone would
    not ("" when nothing was)."""
    if lenient is None or len(outputs) != len(_tensors(expected)):
        return expected, ""
    out, notes = [], []
    for got, want in zip(outputs, _tensors(expected), strict=True):
        if not isinstance(got, torch.Tensor) or not isinstance(want, torch.Tensor):
            out.append(want)
            continue
        if lenient.broadcast and got.shape != want.shape and _squeezed(got) == _squeezed(want):
            notes.append(f"shape {tuple(got.shape)} against the reference's {tuple(want.shape)}")
            want = want.reshape(got.shape)
        if lenient.promote and got.dtype != want.dtype and want.dtype != torch.float64:
            notes.append(f"dtype {dtype_name(got.dtype)} against the reference's "
                         f"{dtype_name(want.dtype)}")
            want = want.to(got.dtype)
        out.append(want)
    if not notes:
        return expected, ""
    return out, f"{'; '.join(notes)}, which the repository's {lenient.comparison} accepts"


def _squeezed(t: torch.Tensor) -> list[int]:
    return [d for d in t.shape if d != 1]


def _tensors(value: Any) -> list[Any]:
    if isinstance(value, (list, tuple)):
        return [t for v in value for t in _tensors(v)]
    return [value]
