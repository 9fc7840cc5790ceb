"""The numeric contract on CPU tensors: no NaN or Inf passes where the expectation is
finite, in any of the comparisons kfbot makes; numeric flags pinned and a change to
them named; the precision a candidate keeps, read in bits."""

from __future__ import annotations

from typing import Any

import pytest

torch = pytest.importorskip("torch")

from kfbot.evaluate.device import health  # noqa: E402
from kfbot.evaluate.device.precision import (  # noqa: E402
    bits,
    judge_precision,
    relative_error,
)
from kfbot.evaluate.device.timed import timed_check  # noqa: E402
from kfbot.evaluate.device.verify import (  # noqa: E402
    Context,
    Run,
    close_flag,
    own_non_finite,
)
from kfbot.evaluate.verdict.compare import close_all, close_all_finite, compare  # noqa: E402
from kfbot.evaluate.verdict.tolerances import Tolerance  # noqa: E402

TOL = Tolerance(1e-4, 1e-4)
NAN, INF = float("nan"), float("inf")


def _cases() -> dict[str, tuple[Any, Any]]:
    want = torch.linspace(-3.0, 3.0, 1000)
    cases = {}
    for name, value in (("one NaN", NAN), ("one Inf", INF), ("one -Inf", -INF)):
        got = want.clone()
        got[500] = value
        cases[name] = (got, want)
    cases["all NaN"] = (torch.full_like(want, NAN), want)
    cases["finite where the reference is NaN"] = (want.clone(),
                                                  torch.where(want > 0, NAN, want))
    cases["+Inf where the reference is -Inf"] = (torch.full((4,), INF),
                                                 torch.full((4,), -INF))
    return cases


@pytest.mark.parametrize("name", list(_cases()))
def test_no_comparison_lets_a_non_finite_element_through(name: str) -> None:
    got, want = _cases()[name]
    assert not compare(got, want, TOL).passed
    assert bool(close_all(got, want, TOL)) is False
    assert bool(close_all_finite(got, want, TOL)) is False
    for finite in (True, False):
        assert bool(close_flag(got, want, {}, finite=finite)) is False
    assert compare(got.half(), want.half(), Tolerance(1e-2, 1e-2)).passed is False


def test_nan_and_the_same_infinity_as_the_reference_pass() -> None:
    want = torch.tensor([1.0, NAN, INF, -INF])
    assert compare(want.clone(), want, TOL).passed
    assert bool(close_all(want.clone(), want, TOL))


def test_a_nan_output_fails_every_timed_trial_even_repeated() -> None:
    check = timed_check(Context({}, None))
    want = torch.ones(16)
    bad = torch.full((16,), NAN)
    for _ in range(3):
        flag = check({"candidate": bad.clone(), "original": want}, 0)
        assert flag is not None and not (isinstance(flag, torch.Tensor) and bool(flag))


def _record(check: str = "output-poison") -> dict[str, Any]:
    return {"input": "spikes (8, 64) float32", "against": "reference", "passed": False,
            "check": check, "error": "poison", "comparisons": [], "run": ""}


def test_nan_the_op_writes_itself_is_named_non_finite() -> None:
    want = torch.ones(8, 64)
    wrote_nan = want.clone()
    wrote_nan[:, 5] = NAN  # present in the run whose allocator held a finite pattern
    rec = own_non_finite(_record(), Run(wrote_nan), want)
    assert rec["check"] == "non-finite" and "8 of 512" in rec["error"]
    unwritten = torch.full_like(want, 8.4e37)  # the finite pattern read back: not its own
    assert own_non_finite(_record(), Run(unwritten), want)["check"] == "output-poison"
    assert own_non_finite(_record(), None, want)["check"] == "output-poison"
    passed = {**_record("correctness"), "passed": True}
    assert own_non_finite(passed, Run(wrote_nan), want) is passed
    assert own_non_finite(_record("correctness"), Run(wrote_nan), want)["check"] == "non-finite"


def test_numeric_flags_are_pinned_and_a_change_is_named() -> None:
    before = health.numeric_flags()
    try:
        pinned = health.pin_numerics()
        assert pinned == health.PINNED
        assert health.flag_records(pinned, "after verification") == []
        torch.backends.cuda.matmul.allow_tf32 = True  # what a candidate's library could do
        torch.set_float32_matmul_precision("high")
        records = health.flag_records(pinned, "after verification")
        assert [r["check"] for r in records] == ["numeric-flags"]
        assert "matmul_allow_tf32 False -> True" in records[0]["error"]
        assert "float32_matmul_precision 'highest' -> 'high'" in records[0]["error"]
        assert health.numeric_flags() == pinned  # pinned again for what follows
    finally:
        torch.backends.cuda.matmul.allow_tf32 = before["matmul_allow_tf32"]
        torch.backends.cudnn.allow_tf32 = before["cudnn_allow_tf32"]
        torch.set_float32_matmul_precision(before["float32_matmul_precision"])
        torch.backends.cudnn.benchmark = before["cudnn_benchmark"]


def test_cuda_errors_in_checks_ask_for_a_fresh_worker() -> None:
    seen = [{"error": "RuntimeError: CUDA error: invalid configuration argument"}]
    assert health.saw_cuda_error(seen)
    assert health.saw_cuda_error([{"error": "CUBLAS_STATUS_EXECUTION_FAILED when calling"}])
    assert not health.saw_cuda_error([{"error": "shape (3,) != expected (4,)"}, {}])


def _tf32(x: torch.Tensor) -> torch.Tensor:
    """x rounded to TF32's 10-bit mantissa (towards zero)."""
    return (x.view(torch.int32) & ~0x1FFF).view(torch.float32)


def test_a_tf32_matmul_loses_the_bits_of_float32_and_is_rejected() -> None:
    gen = torch.Generator().manual_seed(0)
    a = torch.randn(128, 256, generator=gen)
    b = torch.randn(256, 64, generator=gen)
    ref = a.double() @ b.double()
    fp32 = a @ b
    tf32 = _tf32(a) @ _tf32(b)
    err_o, err_c = relative_error(fp32, ref), relative_error(tf32, ref)
    assert err_o is not None and err_c is not None
    assert bits(err_o) > 20 and bits(err_c) < 13
    verdict, line = judge_precision(err_c, err_o, torch.float32)
    assert verdict == "strict" and "TF32 or float16" in line
    bf16 = (a.bfloat16() @ b.bfloat16()).float()
    assert judge_precision(relative_error(bf16, ref) or 1.0, err_o, torch.float32)[0] == "strict"


def test_an_honest_reordering_keeps_its_bits() -> None:
    gen = torch.Generator().manual_seed(1)
    x = torch.randn(64, 4096, generator=gen)
    ref = x.double().sum(dim=1)
    forward = x.sum(dim=1)
    chunks = x.view(64, 64, 64).sum(dim=2).sum(dim=1)  # another order of summation
    verdict, line = judge_precision(relative_error(chunks, ref) or 0.0,
                                    relative_error(forward, ref) or 0.0, torch.float32)
    assert verdict == "note" and "bits against a float64 reference" in line


def test_a_few_lost_bits_warn_and_nothing_is_measured_on_empty_or_zero_references() -> None:
    verdict, _ = judge_precision(2.0**-17, 2.0**-23, torch.float32)
    assert verdict == "warn"  # 6 bits lost, far from TF32's rounding
    assert relative_error(torch.zeros(4), torch.zeros(4)) is None
    assert relative_error(torch.full((4,), NAN), torch.ones(4)) is None
    assert relative_error(torch.ones(3), torch.ones(4)) is None
