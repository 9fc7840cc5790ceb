"""Correctness: does a candidate's output match the reference, and if not, where.

This runs inside the worker next to the kernels, so it imports torch; nothing else in
kfbot's own process may import this module.

An element matches when `|actual - expected| <= atol + rtol * |expected|` with both
finite, or when both are NaN, or when both are the same infinity. Everything else is a
mismatch: a NaN or Inf where the reference is finite, a finite value where it is not.

Where mismatches fall says more than how many there are: a wrong last partial block
means a missing bounds check, wrong last rows a missing check on one dimension, wrong
block edges an off-by-one. `Comparison.where` is that short code, and
`Comparison.description` the one line a person (or an LLM) reads.

Dtypes: `dtype_ok` compares the actual dtype with `expected_dtype` when given.
Without it, a float64 reference is taken to be a high-precision stand-in, so any
floating actual dtype passes; any other reference dtype must match exactly.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Any, Literal

import torch

from kfbot.errors import KfbotError
from kfbot.evaluate.model import Diagnostic
from kfbot.evaluate.verdict.tolerances import DEFAULT_TOLERANCES, Tolerance, ToleranceLike

Where = Literal[
    "none",
    "shape",
    "tail_block",
    "last_rows",
    "last_cols",
    "first_elements",
    "block_boundaries",
    "nan",
    "everywhere",
    "scattered",
]

# At or above this fraction of wrong elements, positions stop telling a story.
EVERYWHERE_FRACTION = 0.5


def dtype_name(dtype: torch.dtype) -> str:
    """The name tolerances are keyed by: "float32" for torch.float32."""
    return str(dtype).removeprefix("torch.")


def tolerance_for(
    dtype: str | torch.dtype, overrides: Mapping[str, ToleranceLike] | None = None
) -> Tolerance:
    """The tolerance for a dtype: the override for its name if any, else the default."""
    name = dtype_name(dtype) if isinstance(dtype, torch.dtype) else dtype.removeprefix("torch.")
    override = (overrides or {}).get(name)
    if override is not None:
        return Tolerance(float(override.atol), float(override.rtol))
    if name not in DEFAULT_TOLERANCES:
        known = ", ".join(DEFAULT_TOLERANCES)
        raise KfbotError(f"no default tolerance for dtype {name!r} (known: {known})")
    return DEFAULT_TOLERANCES[name]


@dataclass(frozen=True)
class Comparison:
    """The verdict on one output tensor, with enough facts to say what went wrong."""

    passed: bool
    shape_ok: bool
    dtype_ok: bool
    max_abs_error: float  # over finite pairs; inf when a NaN/Inf appears where it should not
    max_rel_error: float  # |a - e| / max(|e|, tiny), same convention
    mismatched: int
    total: int
    mismatch_fraction: float
    nan_actual: int
    inf_actual: int
    nan_expected: int
    where: Where
    description: str
    first_mismatch: tuple[int, ...] | None = None  # index into the shape, when any

    def to_json(self) -> dict[str, Any]:
        """A JSON-able dict, so the verdict can leave the worker as a job result."""
        data = asdict(self)
        if self.first_mismatch is not None:
            data["first_mismatch"] = list(self.first_mismatch)
        return data

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Comparison:
        fields = dict(data)
        first = fields.get("first_mismatch")
        fields["first_mismatch"] = None if first is None else tuple(first)
        return cls(**fields)

    def diagnostic(self, subject: str = "output") -> Diagnostic | None:
        """A correctness `Diagnostic` naming `subject`; None when the output passed."""
        if self.passed:
            return None
        kind = "shape" if not self.shape_ok else "mismatch" if self.mismatched else "dtype"
        details = (
            ("where", self.where),
            ("mismatched", f"{self.mismatched}/{self.total}"),
            ("max_abs_error", f"{self.max_abs_error:.3g}"),
            ("max_rel_error", f"{self.max_rel_error:.3g}"),
        )
        return Diagnostic("correctness", kind, f"{subject}: {self.description}", details=details)


def compare(
    actual: torch.Tensor,
    expected: torch.Tensor,
    tol: Tolerance,
    block: int | None = None,
    *,
    expected_dtype: torch.dtype | str | None = None,
) -> Comparison:
    """Compare a candidate's output with the reference under `tol`.

    `block` is the kernel's elements per block (or tile), when known: it lets the
    localisation name a wrong last partial block or wrong block edges.
    """
    if block is not None and block <= 0:
        raise KfbotError(f"block must be positive, got {block}")
    if actual.is_complex() or expected.is_complex():
        raise KfbotError("complex tensors are not supported; compare their real views")
    want = expected.dtype if expected_dtype is None else _as_dtype(expected_dtype)
    expected_name = dtype_name(want)
    dtype_ok = _dtype_ok(actual.dtype, want, pinned=expected_dtype is not None)
    if actual.shape != expected.shape:
        return _shape_mismatch(actual, expected, dtype_ok)
    actual = actual.to(expected.device)
    bad, errors, counts, mismatched = _verdict(actual, expected, tol)
    total = expected.numel()
    where, text = _locate(bad, actual, expected, block, errors)
    if not dtype_ok:
        problem = f"dtype {dtype_name(actual.dtype)} != expected {expected_name}"
        text = f"{text}; {problem}" if mismatched else f"values match but {problem}"
    return Comparison(
        passed=dtype_ok and mismatched == 0,
        shape_ok=True,
        dtype_ok=dtype_ok,
        max_abs_error=errors[0],
        max_rel_error=errors[1],
        mismatched=mismatched,
        total=total,
        mismatch_fraction=mismatched / total if total else 0.0,
        nan_actual=counts[0],
        inf_actual=counts[1],
        nan_expected=counts[2],
        where=where,
        description=text,
        first_mismatch=_unravel(_first_index(bad.reshape(-1)), bad.shape) if mismatched else None,
    )


# -- dtypes and shapes -------------------------------------------------------------


def _as_dtype(dtype: torch.dtype | str) -> torch.dtype:
    if isinstance(dtype, torch.dtype):
        return dtype
    found = getattr(torch, dtype.removeprefix("torch."), None)
    if not isinstance(found, torch.dtype):
        raise KfbotError(f"unknown dtype {dtype!r}")
    return found


def _dtype_ok(actual: torch.dtype, expected: torch.dtype, *, pinned: bool) -> bool:
    """`pinned`: `expected` was given by the caller, not read off the reference."""
    if not pinned and expected == torch.float64:
        # References are often computed in float64 for accuracy; that says nothing about
        # the dtype the kernel should return, only that it should be a float.
        return actual.is_floating_point
    return actual == expected


def _shape_mismatch(actual: torch.Tensor, expected: torch.Tensor, dtype_ok: bool) -> Comparison:
    total = expected.numel()
    text = f"shape {tuple(actual.shape)} != expected {tuple(expected.shape)}"
    counts = _special_counts(actual, expected)
    return Comparison(
        passed=False,
        shape_ok=False,
        dtype_ok=dtype_ok,
        max_abs_error=math.inf,
        max_rel_error=math.inf,
        mismatched=total,
        total=total,
        mismatch_fraction=1.0 if total else 0.0,
        nan_actual=counts[0],
        inf_actual=counts[1],
        nan_expected=counts[2],
        where="shape",
        description=text,
    )


# -- element-wise verdict -----------------------------------------------------------


def _work_dtype(actual: torch.Tensor, expected: torch.Tensor) -> torch.dtype:
    """float64 when either side has it (a float64 reference is compared at its own
    precision) or neither is a float (integers beyond 2**24); else float32, which holds
    float16 and bfloat16 exactly."""
    floating = actual.is_floating_point() or expected.is_floating_point()
    if torch.float64 in (actual.dtype, expected.dtype) or not floating:
        return torch.float64
    return torch.float32


def _verdict(
    actual: torch.Tensor, expected: torch.Tensor, tol: Tolerance
) -> tuple[torch.Tensor, tuple[float, float], tuple[int, int, int], int]:
    """(mismatch mask, max errors, special counts, mismatched) with one synchronize:
    comparisons run many times per candidate, and each `.item()` waits for the GPU."""
    bad, diff, finite = _mismatches_mask(actual, expected, tol)
    if diff.numel() == 0:
        return bad, (0.0, 0.0), _special_counts(actual, expected), 0
    work = diff.dtype
    a, e = actual.to(work), expected.to(work)
    bad_special = bad & ~finite
    rel = diff / e.abs().clamp_min(torch.finfo(work).tiny)
    floats = (actual.is_floating_point(), actual.is_floating_point(),
              expected.is_floating_point())
    f64 = torch.float64  # counts beyond 2**24 stay exact
    zero = torch.zeros((), dtype=f64, device=diff.device)
    stats = torch.stack([
        diff.max().to(f64), rel.max().to(f64), bad_special.any().to(f64), bad.sum().to(f64),
        a.isnan().sum().to(f64) if floats[0] else zero,
        a.isinf().sum().to(f64) if floats[1] else zero,
        e.isnan().sum().to(f64) if floats[2] else zero,
    ]).tolist()
    errors = (math.inf, math.inf) if stats[2] else (float(stats[0]), float(stats[1]))
    counts = (int(stats[4]), int(stats[5]), int(stats[6]))
    return bad, errors, counts, int(stats[3])


def close_all(actual: torch.Tensor, expected: torch.Tensor, tol: Tolerance
              ) -> torch.Tensor | bool:
    """Whether every element is close, as a 0-dim bool tensor left on the device (no
    synchronize: checks made on every timed trial are read once, at the end), or a
    plain False when shape, dtype or device already say no."""
    if actual.shape != expected.shape or actual.dtype != expected.dtype:
        return False
    if actual.device != expected.device:
        return False
    if actual.numel() == 0:
        return True
    bad, _, _ = _mismatches_mask(actual, expected, tol)
    return ~bad.any()


def close_all_finite(actual: torch.Tensor, expected: torch.Tensor, tol: Tolerance
                     ) -> torch.Tensor | bool:
    """`close_all` in four passes instead of about twenty, for floating outputs whose
    `expected` holds no NaN or Inf (the caller knows it): `max(|a - e| - rtol * |e|)`
    must not exceed atol. A NaN or Inf in `actual` fails (NaN propagates through the
    max); one in `expected` can only fail too, never pass. Used on every timed trial,
    where the full mask cost more GPU time than the kernels being timed."""
    if actual.shape != expected.shape or actual.dtype != expected.dtype \
            or actual.device != expected.device or not actual.is_floating_point():
        return close_all(actual, expected, tol)
    if actual.numel() == 0:
        return True
    if actual.element_size() < 4:  # float16/bfloat16: exact in float32
        actual, expected = actual.float(), expected.float()
    slack = (actual - expected).abs_().sub_(expected.abs(), alpha=tol.rtol)
    return slack.amax() <= tol.atol


def _mismatches_mask(
    actual: torch.Tensor, expected: torch.Tensor, tol: Tolerance
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The mask of mismatched elements, the finite |a - e| and the mask of pairs where
    both are finite (no reductions)."""
    work = _work_dtype(actual, expected)
    a, e = actual.to(work), expected.to(work)
    finite = a.isfinite() & e.isfinite()
    diff = torch.where(finite, (a - e).abs(), 0.0)
    if _exact_integers(actual, expected, tol):
        # Integers are compared as integers: float64 cannot hold every int64.
        return actual.ne(expected), diff, finite
    close = finite & (diff <= tol.atol + tol.rtol * e.abs())
    same_special = (a.isnan() & e.isnan()) | (e.isinf() & a.eq(e))
    return ~(close | same_special), diff, finite


def _exact_integers(actual: torch.Tensor, expected: torch.Tensor, tol: Tolerance) -> bool:
    floating = actual.is_floating_point() or expected.is_floating_point()
    return not floating and tol.atol == 0 and tol.rtol == 0


def _special_counts(actual: torch.Tensor, expected: torch.Tensor) -> tuple[int, int, int]:
    """NaNs and Infs in the output, NaNs in the reference (integers have none)."""
    nan_a = int(actual.isnan().sum()) if actual.is_floating_point() else 0
    inf_a = int(actual.isinf().sum()) if actual.is_floating_point() else 0
    nan_e = int(expected.isnan().sum()) if expected.is_floating_point() else 0
    return nan_a, inf_a, nan_e


# -- localisation -------------------------------------------------------------------


def _first_index(flat: torch.Tensor) -> int:
    return int(flat.to(torch.uint8).argmax())  # argmax returns the first maximum


def _last_index(flat: torch.Tensor) -> int:
    return flat.numel() - 1 - _first_index(flat.flip(0))


def _unravel(index: int, shape: torch.Size) -> tuple[int, ...]:
    coords: list[int] = []
    for size in reversed(shape):
        index, coord = divmod(index, size)
        coords.append(coord)
    return tuple(reversed(coords))


@dataclass(frozen=True)
class _Spread:
    """Where the mismatches are, in the flattened tensor."""

    bad: torch.Tensor  # the mask in the tensor's shape
    n: int
    count: int
    lo: int  # first mismatched flat index
    hi: int  # last


def _locate(
    bad: torch.Tensor,
    actual: torch.Tensor,
    expected: torch.Tensor,
    block: int | None,
    errors: tuple[float, float],
) -> tuple[Where, str]:
    """The `where` code and the one-line description for a mismatch mask."""
    n = bad.numel()
    count = int(bad.sum())
    if count == 0:
        return "none", f"all {n} elements match (max abs error {errors[0]:.3g})"
    flat = bad.reshape(-1)
    spread = _Spread(bad, n, count, _first_index(flat), _last_index(flat))
    for finder in (_tail_block, _last_rows, _last_cols, _first_elements, _block_boundaries):
        found = finder(spread, block)
        if found is not None:
            return found
    if _all_nan(bad, actual, expected):
        text = f"{count} of {n} elements are NaN where the reference is not"
        return "nan", f"{text} -> likely uninitialised memory or a division by zero"
    return _spread_out(spread, errors)


def _tail_block(spread: _Spread, block: int | None) -> tuple[Where, str] | None:
    if block is None or spread.n % block == 0:
        return None
    start = spread.n - spread.n % block
    if spread.lo < start:
        return None
    if start == 0:  # fewer elements than one block: only "all of them wrong" points at bounds
        if spread.count < spread.n:
            return None
        text = f"all {spread.n} elements (fewer than one block of {block}) differ"
        return "tail_block", f"{text} -> the only, partial block is wrong: likely a missing " \
            "bounds check"
    text = f"{spread.n} elements: only elements {spread.lo}..{spread.hi}"
    text += f" (the last partial block of {block}) differ -> likely a missing bounds check"
    return "tail_block", text


def _trailing_band(hit: torch.Tensor) -> int | None:
    """How many trailing entries the hits are confined to, if that is at most half."""
    size = hit.numel()
    first = _first_index(hit)
    band = size - first
    return band if size > 1 and first > 0 and band <= max(1, size // 2) else None


def _last_rows(spread: _Spread, block: int | None) -> tuple[Where, str] | None:
    if spread.bad.dim() < 2:
        return None
    rows, cols = spread.bad.shape[-2], spread.bad.shape[-1]
    band = _trailing_band(spread.bad.reshape(-1, rows, cols).any(2).any(0))
    if band is None:
        return None
    text = f"only the last {band} of {rows} rows differ ({spread.count} elements)"
    return "last_rows", f"{text} -> likely a missing bounds check on the row dimension"


def _last_cols(spread: _Spread, block: int | None) -> tuple[Where, str] | None:
    if spread.bad.dim() < 2:
        return None
    cols = spread.bad.shape[-1]
    band = _trailing_band(spread.bad.reshape(-1, cols).any(0))
    if band is None:
        return None
    text = f"only the last {band} of {cols} columns differ ({spread.count} elements)"
    return "last_cols", f"{text} -> likely a missing bounds check on the column dimension"


def _first_elements(spread: _Spread, block: int | None) -> tuple[Where, str] | None:
    limit = block if block is not None else max(1, spread.n // 16)
    if limit >= spread.n or spread.hi >= limit:
        return None
    text = f"only elements {spread.lo}..{spread.hi} at the start differ"
    text += f" ({spread.count} of {spread.n})"
    return "first_elements", f"{text} -> likely a race or missing initialisation at the start"


def _block_boundaries(spread: _Spread, block: int | None) -> tuple[Where, str] | None:
    """Mismatches only within a few elements of multiples of `block`, in 2+ blocks."""
    if block is None or block < 8 or spread.n < 2 * block:
        return None
    flat = spread.bad.reshape(-1)
    padded = torch.zeros(-(-spread.n // block) * block, dtype=torch.bool, device=flat.device)
    padded[: spread.n] = flat
    per_block = padded.reshape(-1, block)
    offsets = torch.arange(block, device=flat.device)
    distance = torch.minimum(offsets, block - offsets)  # to the nearest multiple of block
    halo = max(1, block // 32)  # wide enough for a stencil's radius
    if bool(per_block.any(0)[distance > halo].any()):
        return None
    blocks = int(per_block.any(1).sum())
    if blocks < 2:
        return None
    text = f"{spread.count} elements at the edges of {blocks} blocks of {block} differ"
    return "block_boundaries", f"{text} -> likely an off-by-one or halo error at block edges"


def _all_nan(bad: torch.Tensor, actual: torch.Tensor, expected: torch.Tensor) -> bool:
    if not actual.is_floating_point():
        return False
    nan_where_finite = actual.isnan() & ~expected.isnan()
    return bool(nan_where_finite[bad].all())


def _spread_out(spread: _Spread, errors: tuple[float, float]) -> tuple[Where, str]:
    fraction = spread.count / spread.n
    index = list(_unravel(spread.lo, spread.bad.shape))
    if fraction >= EVERYWHERE_FRACTION:
        text = f"{spread.count} of {spread.n} elements ({fraction:.0%}) differ"
        return "everywhere", f"{text}, max abs error {errors[0]:.3g} -> wrong throughout"
    text = f"{spread.count} of {spread.n} elements differ, first at {index},"
    return "scattered", f"{text} max abs error {errors[0]:.3g}, max rel error {errors[1]:.3g}"
