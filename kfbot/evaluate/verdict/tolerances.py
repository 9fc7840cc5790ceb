"""How far a result may be from the expected one, per dtype: kfbot's defaults.

Kept apart from the comparison itself (which needs torch) so that making a task, in
kfbot's own process, can weigh a repository's own test tolerances against them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol


@dataclass(frozen=True)
class Tolerance:
    atol: float
    rtol: float


class ToleranceLike(Protocol):
    """Anything with atol and rtol, such as the config's own tolerance records."""

    @property
    def atol(self) -> float: ...

    @property
    def rtol(self) -> float: ...


EXACT = Tolerance(0.0, 0.0)
DEFAULT_TOLERANCES: dict[str, Tolerance] = {
    "float64": Tolerance(1e-8, 1e-7),
    "float32": Tolerance(1e-4, 1e-4),
    "float16": Tolerance(1e-2, 1e-2),
    "bfloat16": Tolerance(2e-2, 2e-2),
    # Integer and boolean results have no rounding to forgive.
    **dict.fromkeys(
        ("int64", "int32", "int16", "int8", "uint64", "uint32", "uint16", "uint8", "bool"), EXACT
    ),
}


def floor_with_defaults(dtype: str, atol: float | None, rtol: float | None
                        ) -> tuple[float, float] | None:
    """A test's own tolerance for `dtype`, never tighter than kfbot's default (which is
    measured against a float64 reference); None when the test gives neither."""
    if atol is None and rtol is None:
        return None
    base = DEFAULT_TOLERANCES.get(dtype)
    if base is None:
        return None
    return max(base.atol, atol or 0.0), max(base.rtol, rtol or 0.0)
