"""Tensor comparison: the tolerance edge, NaN/Inf, dtypes, and where mismatches sit."""

from __future__ import annotations

import json
import math

import pytest
import torch

from kfbot.config import Tolerance as ConfigTolerance
from kfbot.errors import KfbotError
from kfbot.evaluate.verdict.compare import Comparison, compare, tolerance_for
from kfbot.evaluate.verdict.tolerances import DEFAULT_TOLERANCES, EXACT, Tolerance

F32 = DEFAULT_TOLERANCES["float32"]


def ramp(*shape: int, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """Distinct, exactly representable values, so only the planted errors differ."""
    n = math.prod(shape)
    return (torch.arange(n, dtype=torch.float64) % 1000 / 8).to(dtype).reshape(shape)


def with_errors(expected: torch.Tensor, *flat_indices: int) -> torch.Tensor:
    actual = expected.clone()
    actual.view(-1)[list(flat_indices)] += 1
    return actual


# -- tolerances ---------------------------------------------------------------------


def test_default_tolerances() -> None:
    assert tolerance_for("float32") == Tolerance(1e-4, 1e-4)
    assert tolerance_for("float16") == Tolerance(1e-2, 1e-2)
    assert tolerance_for(torch.bfloat16) == Tolerance(2e-2, 2e-2)
    assert tolerance_for("torch.float64") == Tolerance(1e-8, 1e-7)
    assert tolerance_for("int32") == EXACT == tolerance_for("bool")


def test_overrides_win_and_accept_config_records() -> None:
    overrides = {"float32": ConfigTolerance(atol=1e-6, rtol=2e-6)}
    assert tolerance_for("float32", overrides) == Tolerance(1e-6, 2e-6)
    assert tolerance_for("float16", overrides) == Tolerance(1e-2, 1e-2)


def test_unknown_dtype_has_no_default() -> None:
    with pytest.raises(KfbotError, match="float8_e4m3fn"):
        tolerance_for("float8_e4m3fn")


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_tolerance_edge_is_inclusive(dtype: torch.dtype) -> None:
    expected = torch.tensor([2.0], dtype=dtype)
    tol = Tolerance(atol=0.5, rtol=0.25)  # limit: 0.5 + 0.25 * 2 = 1.0, exact in binary
    at_edge = torch.tensor([3.0], dtype=dtype)
    past_edge = torch.nextafter(at_edge, torch.tensor([4.0], dtype=dtype))
    assert compare(at_edge, expected, tol).passed
    failed = compare(past_edge, expected, tol)
    assert not failed.passed
    assert failed.mismatched == 1
    assert failed.max_abs_error > 1.0
    assert failed.max_rel_error == pytest.approx(0.5)


# -- NaN and Inf ------------------------------------------------------------------------


def test_matching_nan_and_inf_pass() -> None:
    values = [math.nan, math.inf, -math.inf, 1.0]
    result = compare(torch.tensor(values), torch.tensor(values), F32)
    assert result.passed
    assert (result.nan_actual, result.inf_actual, result.nan_expected) == (1, 2, 1)
    assert result.where == "none"


@pytest.mark.parametrize(
    ("actual", "expected"),
    [
        (math.nan, 1.0),  # NaN where the reference is finite
        (1.0, math.nan),  # a number where the reference is NaN
        (math.inf, 1.0),
        (-math.inf, math.inf),  # the wrong infinity
        (1e30, math.inf),  # rtol * inf must not excuse a finite value
    ],
)
def test_misplaced_nan_or_inf_is_a_mismatch(actual: float, expected: float) -> None:
    result = compare(torch.tensor([0.0, actual]), torch.tensor([0.0, expected]), F32)
    assert not result.passed
    assert result.mismatched == 1
    assert result.max_abs_error == math.inf


def test_nan_mismatches_are_named() -> None:
    expected = ramp(4096)
    actual = expected.clone()
    actual[torch.tensor([17, 900, 2048, 3001])] = math.nan
    result = compare(actual, expected, F32)
    assert result.where == "nan"
    assert result.nan_actual == 4
    assert "4 of 4096 elements are NaN" in result.description


# -- shape and dtype ------------------------------------------------------------------


def test_shape_mismatch() -> None:
    result = compare(torch.zeros(4, 3), torch.zeros(4, 4), F32)
    assert (result.passed, result.shape_ok, result.where) == (False, False, "shape")
    assert result.description == "shape (4, 3) != expected (4, 4)"
    assert result.mismatch_fraction == 1.0


def test_float32_output_is_compared_to_float64_reference_in_float64() -> None:
    expected = torch.tensor([1.0 + 1e-9], dtype=torch.float64)  # rounds to 1.0 in float32
    actual = torch.tensor([1.0], dtype=torch.float32)
    result = compare(actual, expected, Tolerance(atol=1e-10, rtol=0.0))
    assert result.dtype_ok  # a float64 reference only asks for a float
    assert not result.passed
    assert result.max_abs_error == pytest.approx(1e-9, rel=1e-3)
    assert compare(actual, expected, F32).passed


def test_expected_dtype_pins_the_output_dtype() -> None:
    expected = ramp(16, dtype=torch.float64)
    actual = expected.to(torch.float32)
    assert compare(actual, expected, F32, expected_dtype="float32").dtype_ok
    pinned = compare(actual, expected, F32, expected_dtype=torch.float16)
    assert (pinned.dtype_ok, pinned.passed, pinned.where) == (False, False, "none")
    assert pinned.description == "values match but dtype float32 != expected float16"


def test_same_precision_reference_needs_the_same_dtype() -> None:
    expected = ramp(16)
    result = compare(expected.to(torch.float16), expected, F32)
    assert not result.dtype_ok
    assert not result.passed
    assert not compare(expected.to(torch.int64), expected.double(), F32).dtype_ok


def test_integers_compare_exactly() -> None:
    big = 2**53  # float64 cannot tell 2**53 from 2**53 + 1
    result = compare(torch.tensor([big + 1, 5]), torch.tensor([big, 5]), EXACT)
    assert (result.passed, result.mismatched) == (False, 1)
    assert compare(torch.tensor([big, 5]), torch.tensor([big, 5]), EXACT).passed
    off_by_one = compare(
        torch.tensor([1, 2, 3], dtype=torch.int32),
        torch.tensor([1, 2, 4], dtype=torch.int32),
        tolerance_for("int32"),
    )
    assert (off_by_one.mismatched, off_by_one.max_abs_error) == (1, 1.0)


def test_bools_compare_exactly() -> None:
    expected = torch.tensor([True, False, True])
    assert compare(expected.clone(), expected, EXACT).passed
    assert compare(~expected, expected, EXACT).mismatched == 3


def test_empty_tensors_pass() -> None:
    result = compare(torch.zeros(0), torch.zeros(0), F32)
    assert (result.passed, result.total, result.where) == (True, 0, "none")


# -- localisation -----------------------------------------------------------------------


def test_tail_block() -> None:
    expected = ramp(1031)
    result = compare(with_errors(expected, *range(1024, 1031)), expected, F32, block=256)
    assert (result.where, result.mismatched, result.first_mismatch) == ("tail_block", 7, (1024,))
    assert result.description == (
        "1031 elements: only elements 1024..1030 (the last partial block of 256) differ"
        " -> likely a missing bounds check"
    )


def test_tail_block_needs_every_mismatch_in_the_tail() -> None:
    expected = ramp(1031)
    result = compare(with_errors(expected, 500, 1030), expected, F32, block=256)
    assert result.where != "tail_block"


def test_last_rows() -> None:
    expected = ramp(64, 48)
    actual = expected.clone()
    actual[62:, :] += 1
    result = compare(actual, expected, F32)
    assert result.where == "last_rows"
    assert result.description.startswith("only the last 2 of 64 rows differ (96 elements)")
    assert result.first_mismatch == (62, 0)


def test_last_rows_of_every_matrix_in_a_batch() -> None:
    expected = ramp(3, 16, 16)
    actual = expected.clone()
    actual[:, 15, :] += 1
    assert compare(actual, expected, F32).where == "last_rows"


def test_last_cols() -> None:
    expected = ramp(64, 48)
    actual = expected.clone()
    actual[:, 45:] += 1
    result = compare(actual, expected, F32)
    assert result.where == "last_cols"
    assert "only the last 3 of 48 columns" in result.description


def test_first_elements() -> None:
    expected = ramp(4096)
    result = compare(with_errors(expected, 0, 1, 2), expected, F32, block=256)
    assert result.where == "first_elements"
    assert "only elements 0..2 at the start differ" in result.description


def test_block_boundaries() -> None:
    expected = ramp(4096)
    edges = [k * 256 for k in range(1, 16)] + [k * 256 - 1 for k in range(1, 16)]
    result = compare(with_errors(expected, *edges), expected, F32, block=256)
    assert result.where == "block_boundaries"
    assert "30 elements at the edges of 16 blocks of 256" in result.description


def test_block_boundaries_need_the_edges() -> None:
    expected = ramp(4096)
    middles = [k * 256 + 128 for k in range(16)]
    result = compare(with_errors(expected, *middles), expected, F32, block=256)
    assert result.where == "scattered"


def test_scattered() -> None:
    expected = ramp(4096)
    result = compare(with_errors(expected, 5, 700, 1500, 3001), expected, F32)
    assert (result.where, result.mismatched) == ("scattered", 4)
    assert result.description.startswith("4 of 4096 elements differ, first at [5]")
    assert result.mismatch_fraction == pytest.approx(4 / 4096)


def test_everywhere() -> None:
    expected = ramp(32, 32)
    result = compare(expected + 0.5, expected, F32)
    assert (result.where, result.mismatched, result.total) == ("everywhere", 1024, 1024)
    assert result.max_abs_error == pytest.approx(0.5)


# -- leaving the worker -------------------------------------------------------------------


def test_json_round_trip() -> None:
    expected = ramp(64, 48)
    original = compare(with_errors(expected, 7), expected, F32)
    restored = Comparison.from_json(json.loads(json.dumps(original.to_json())))
    assert restored == original


def test_diagnostic() -> None:
    expected = ramp(1031)
    failed = compare(with_errors(expected, 1030), expected, F32, block=256)
    diagnostic = failed.diagnostic("out")
    assert diagnostic is not None
    assert (diagnostic.stage, diagnostic.kind) == ("correctness", "mismatch")
    assert diagnostic.message == f"out: {failed.description}"
    assert ("where", "tail_block") in diagnostic.details
    assert compare(expected, expected, F32).diagnostic() is None


def test_all_of_a_single_partial_block_wrong_is_a_tail_bug() -> None:
    expected = torch.arange(100, dtype=torch.float32)
    actual = torch.full_like(expected, float("nan"))
    result = compare(actual, expected, Tolerance(1e-5, 1e-5), block=128)
    assert result.where == "tail_block"
    assert result.description.startswith("all 100 elements (fewer than one block of 128) differ")
    some = expected.clone()
    some[:10] = -1.0
    assert compare(some, expected, Tolerance(1e-5, 1e-5), block=128).where != "tail_block"


def test_close_all_passes_only_where_compare_passes() -> None:
    from kfbot.evaluate.verdict.compare import close_all

    tol = Tolerance(atol=1e-3, rtol=1e-3)
    base = torch.linspace(-2, 2, 64)
    cases = {
        "equal": base.clone(),
        "close": base + 5e-4,
        "far": base + 1e-2,
        "nan both": torch.where(base > 1, torch.nan, base),
        "dtype": base.double(),
        "shape": base[:32],
    }
    expected = {"nan both": torch.where(base > 1, torch.nan, base)}
    seen = {}
    for name, actual in cases.items():
        want = expected.get(name, base)
        seen[name] = bool(close_all(actual, want, tol))  # a tensor, or False early
        if seen[name]:  # never more lenient than the full comparison
            assert compare(actual, want, tol).passed, name
    assert seen == {"equal": True, "close": True, "far": False, "nan both": True,
                    "dtype": False, "shape": False}


def test_close_all_finite_agrees_with_close_all_and_never_passes_more() -> None:
    from kfbot.evaluate.verdict.compare import close_all, close_all_finite

    tol = Tolerance(atol=1e-3, rtol=1e-3)
    base = torch.linspace(-2, 2, 64)
    cases = {
        "equal": (base.clone(), base),
        "close": (base + 5e-4, base),
        "at the edge": (base + (1e-3 + 1e-3 * base.abs()) * 0.999, base),
        "far": (base + 1e-2, base),
        "one far": (torch.where(base == base[7], base + 1, base), base),
        "nan out": (torch.where(base > 1, torch.nan, base), base),
        "inf out": (torch.where(base > 1, torch.inf, base), base),
        "nan both": (torch.where(base > 1, torch.nan, base),) * 2,
        "inf both": (torch.where(base > 1, torch.inf, base),) * 2,
        "half close": ((base + 4e-4).half(), base.half()),
        "half far": (base.half() + 0.5, base.half()),
        "ints": (torch.arange(8), torch.arange(8)),
        "dtype": (base.double(), base),
    }
    fast = {name: bool(close_all_finite(a, e, tol)) for name, (a, e) in cases.items()}
    full = {name: bool(close_all(a, e, tol)) for name, (a, e) in cases.items()}
    finite_expected = {n for n, (_, e) in cases.items()
                       if not e.is_floating_point() or bool(e.isfinite().all())}
    for name in cases:  # the same verdict where the expected output is finite ...
        if name in finite_expected:
            assert fast[name] == full[name], name
        else:  # ... and never a pass the full check would not give where it is not
            assert not fast[name] or full[name], name
    assert fast["close"] and fast["at the edge"] and fast["half close"] and fast["ints"]
    assert not any(fast[n] for n in ("far", "one far", "nan out", "inf out", "half far",
                                     "dtype"))
