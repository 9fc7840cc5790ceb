"""The parts of the runtime anti-cheating layer that need no GPU: the probes' tensor
logic, the physics floor, and how failed checks become findings and verdicts."""

from __future__ import annotations

import pytest

from kfbot.anticheat.physics import MAX_SPEEDUP, ShapeRate, physics_findings
from kfbot.evaluate.evaluation import Check, Evaluation, ShapeTiming
from kfbot.evaluate.verdict.stats import compare_times

torch = pytest.importorskip("torch")


def test_poisoned_elements_counts_only_untouched_elements() -> None:
    from kfbot.evaluate.device.probes import poisoned_elements
    from kfbot.evaluate.poison import POISON_FINITE, POISON_NAN

    buf = torch.empty(10, dtype=torch.float32)
    buf.view(torch.uint8).fill_(POISON_NAN)
    assert poisoned_elements(buf, POISON_NAN) == 10
    assert bool(buf.isnan().all())  # 0xFF bytes read as NaN
    buf[:7] = 1.0
    assert poisoned_elements(buf, POISON_NAN) == 3
    assert poisoned_elements(buf, POISON_FINITE) == 0
    finite = torch.empty(4, dtype=torch.float32)
    finite.view(torch.uint8).fill_(POISON_FINITE)
    assert bool(finite.isfinite().all()) and float(finite[0]) > 1e37
    assert poisoned_elements(torch.empty(0), POISON_NAN) == 0


def test_mutated_compares_inputs_bit_for_bit() -> None:
    from kfbot.evaluate.device.probes import mutated, snapshot

    x, y = torch.randn(8), torch.randn(3, 3)
    args = [x, 2.0, {"w": y}]
    before = snapshot(args)
    assert mutated(before, args) == []
    y[1, 1] = -0.0 if float(y[1, 1]) == 0.0 else 0.0  # one element, even a sign bit
    assert mutated(before, args) == [1]
    x.zero_()
    assert mutated(before, args) == [0, 1]


@pytest.mark.parametrize(("dtype", "numel"), [
    (torch.uint8, 7), (torch.float16, 3), (torch.float32, 5), (torch.float64, 2),
])
def test_mutated_sees_one_flipped_bit_whatever_the_byte_count(dtype: torch.dtype,
                                                             numel: int) -> None:
    from kfbot.evaluate.device.probes import mutated, snapshot

    x = torch.zeros(numel * 2, dtype=dtype)[::2]  # not contiguous: copied before compared
    before = snapshot([x])
    assert mutated(before, [x]) == []
    raw = x.clone()
    raw.view(torch.uint8)[-1] ^= 0x01  # the last byte: a tail a wide view must not drop
    x.copy_(raw)
    assert mutated(before, [x]) == [0]


def test_close_flag_widens_to_a_float64_reference_and_never_passes_nan() -> None:
    from kfbot.evaluate.device.verify import close_flag

    want = torch.linspace(-1, 1, 64, dtype=torch.float64)
    got = want.float()
    for finite in (True, False):
        assert bool(close_flag(got, want, {}, finite=finite))
        assert bool(close_flag([got, got], [want, want], {}, finite=finite))
        bad = got.clone()
        bad[5] = float("nan")
        assert not bool(close_flag(bad, want, {}, finite=finite))
        assert not bool(close_flag(got + 1, want, {}, finite=finite))
    assert close_flag([got], [want, want], {}, finite=True) is False  # output count
    assert close_flag(got.int(), want, {}, finite=True) is False  # dtype
    assert close_flag(3, want, {}, finite=True) is False  # not a tensor


def test_kernel_names_from_profiler_names() -> None:
    from kfbot.evaluate.device.probes import is_benign, kernel_identifier

    assert kernel_identifier("gelu_kernel(float const*, float*, long)") == "gelu_kernel"
    assert kernel_identifier("void ns::softmax<128, float>(float const*, float*)") == "softmax"
    assert kernel_identifier("void rowlib::(anonymous namespace)::row_scale_kernel<float>"
                             "(float const*, float*, float, long)") == "row_scale_kernel"
    assert kernel_identifier(
        "void at::native::vectorized_elementwise_kernel<4, at::native::GeluCUDAKernelImpl"
        "(at::TensorIteratorBase&, at::native::GeluType)::{lambda()#1}>(int, float*)"
    ) == "vectorized_elementwise_kernel"
    assert is_benign("void at::native::vectorized_elementwise_kernel<4, "
                     "at::native::FillFunctor<float>, std::array<char*, 1ul> >(int, ...)")
    assert not is_benign("void at::native::vectorized_elementwise_kernel<4, GeluFunctor>(...)")


def _timing(original_us: float, candidate_us: float, nbytes: int = 0) -> ShapeTiming:
    import random

    rng = random.Random(0)
    speed = compare_times([original_us * (1 + 0.001 * i) for i in range(20)],
                          [candidate_us * (1 + 0.001 * i) for i in range(20)], rng)
    seconds = speed.candidate.median / 1e6
    return ShapeTiming("(1024,) float32", speed, nbytes, nbytes / seconds if nbytes else None)


def _rate(original_us: float, candidate_us: float, nbytes: int = 0,
          flops: float | None = None) -> ShapeRate:
    seconds = candidate_us / 1e6
    return ShapeRate("(1024,) float32", original_us / candidate_us, nbytes,
                     nbytes / seconds if nbytes else None, flops / seconds if flops else None)


PEAKS = {"bandwidth_bytes_per_s": 3.0e12, "fp32_flop_per_s": 5.0e13}
L2 = 50_000_000


def test_physics_floor_flags_speedups_over_ten_times() -> None:
    assert physics_findings([_rate(100.0, 20.0)], None) == []
    flags = physics_findings([_rate(100.0, 100.0 / (MAX_SPEEDUP + 1))], None)
    assert [f.check for f in flags] == ["physics-floor"]
    assert flags[0].severity == "warn" and "review" in flags[0].reason


def test_physics_floor_flags_bandwidth_above_the_measured_peak() -> None:
    honest = _rate(20.0, 10.0, nbytes=27_000_000)  # 2.7 TB/s: below the peak
    assert physics_findings([honest], PEAKS, L2) == []
    above = _rate(20.0, 10.0, nbytes=40_000_000)  # 4 TB/s on a 3 TB/s device
    flags = physics_findings([above], PEAKS, L2)
    assert [(f.check, f.severity) for f in flags] == [("physics-floor", "warn")]
    assert "4000 GB/s, above the measured 3000 GB/s" in flags[0].reason


def test_rates_no_cache_can_explain_are_rejected_with_the_numbers() -> None:
    # 200 MB (4x the L2) in 20 µs is 10 TB/s on a 3 TB/s device: half of it at least
    # must cross memory, at 5 TB/s. Rejected, not sent for review.
    impossible = _rate(2000.0, 20.0, nbytes=200_000_000)
    found = physics_findings([impossible], PEAKS, L2)
    strict = [f for f in found if f.severity == "strict"]
    assert [f.check for f in strict] == ["physics-peak"]
    assert "10000 GB/s" in strict[0].reason and "4.0x the L2" in strict[0].reason
    assert strict[0].evidence == "(1024,) float32"
    # The same rate over bytes the L2 can hold is only implausible: reviewed, not rejected.
    cached = _rate(100.0, 2.0, nbytes=20_000_000)
    assert {f.severity for f in physics_findings([cached], PEAKS, L2)} == {"warn"}
    # Without the L2's size nothing is rejected on bandwidth alone.
    assert {f.severity for f in physics_findings([impossible], PEAKS)} == {"warn"}
    flops = physics_findings([_rate(100.0, 50.0, flops=6e9)], PEAKS, L2)  # 120 TFLOP/s
    assert [(f.check, f.severity) for f in flops] == [("physics-peak", "strict")]
    near = physics_findings([_rate(100.0, 50.0, flops=3e9)], PEAKS, L2)  # 60 TFLOP/s
    assert [(f.check, f.severity) for f in near] == [("physics-floor", "warn")]


def test_a_failed_runtime_check_is_a_strict_finding_with_its_evidence() -> None:
    record = {"input": "(1024,) float32 seed#0", "against": "reference", "passed": False,
              "check": "output-poison", "error": "5 of 1024 output elements hold the poison",
              "run": "outputs poisoned with NaN (0xFF bytes)", "comparisons": []}
    check = Check.from_json(record)
    finding = check.finding()
    assert (finding.check, finding.layer, finding.severity) == ("output-poison", "runtime",
                                                                 "strict")
    assert "5 of 1024" in finding.reason and "NaN" in finding.evidence
    timed = Check.from_json({**record, "check": "timed-output"})
    assert timed.finding().layer == "timing"
    assert Check.from_json({"input": "x", "against": "original", "passed": True}).check == \
        "correctness"


def test_flagged_evaluations_are_publishable_after_review() -> None:
    fast = _timing(100.0, 50.0)
    ok = Evaluation("h", "done", True, "correct", timings=(fast,))
    assert ok.verdict == "faster" and ok.publishable and not ok.needs_review
    flagged = Evaluation("h", "done", True, "correct", timings=(fast,),
                         findings=tuple(physics_findings([_rate(100.0, 5.0)], None)))
    assert flagged.ok and flagged.needs_review and flagged.publishable


def test_deferred_timed_checks_name_the_first_failing_trial() -> None:
    import torch

    from kfbot.evaluate.device.timing import Timed

    timed = Timed({"original": [], "candidate": []},
                  pending=[(1, torch.tensor(True)), (2, torch.tensor(False)),
                           (3, torch.tensor(False))])
    timed.settle()
    assert timed.mismatch is not None and timed.mismatch.startswith("timed trial 2:")
    honest = Timed({}, pending=[(1, torch.tensor(True)), (2, torch.tensor(True))])
    honest.settle()
    assert honest.mismatch is None and honest.pending == []


def test_back_to_back_repeat_calls_fit_in_a_quarter_of_free_memory() -> None:
    from kfbot.evaluate.device.verify import back_to_back_group

    gib = 1 << 30
    assert back_to_back_group(10, 12 << 20, 70 * gib) == 10  # small inputs: all ten
    assert back_to_back_group(10, 3 * gib, 70 * gib) == 5  # 17.5 GiB holds five
    assert back_to_back_group(10, 30 * gib, 70 * gib) == 2  # never fewer than a pair
    assert back_to_back_group(1, 1, gib) == 2 and back_to_back_group(3, 0, gib) == 3
