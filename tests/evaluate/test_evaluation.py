"""Evaluation verdicts, per-shape timings and the reports drawn from them."""

from __future__ import annotations

import json

from kfbot.evaluate.evaluation import Check, Evaluation, failed, shape_timings
from kfbot.evaluate.render import to_json, to_markdown, verdict_line


def _bench(orig: float, cand: float, n: int = 40) -> dict[str, object]:
    return {"input": f"(4096, 1024) float32 [{orig}/{cand}]", "bytes": 32 << 20,
            "original_us": [orig + 0.01 * (i % 7) for i in range(n)],
            "candidate_us": [cand + 0.01 * (i % 5) for i in range(n)]}


PEAKS = {"bandwidth_bytes_per_s": 3.0e12, "fp32_flop_per_s": 5e13}


def test_faster_on_every_shape_is_faster() -> None:
    timings = shape_timings([_bench(100, 50), _bench(80, 40)], seed=1, peaks=PEAKS)
    ev = Evaluation(candidate="h", stage="done", ok=True, reason="ok", timings=timings,
                    environment={"gpu": "NVIDIA H100"})
    assert ev.verdict == "faster"
    assert abs((ev.speedup or 0) - 2.0) < 0.01
    line = verdict_line("softmax_kernel", ev)
    # 32 MiB at 3 TB/s is 11.2 µs: 22% and 28% of the candidate's 50 and 40 µs
    assert line == ("softmax_kernel: 2.00x ✓ faster (geometric mean over 2 shapes; per shape "
                    "2.00x-2.00x), 25% of the speed of light on NVIDIA H100, verified on 0 "
                    "checks")


def test_one_slower_shape_blocks_a_faster_verdict() -> None:
    timings = shape_timings([_bench(100, 50), _bench(40, 80)], seed=1, peaks=PEAKS)
    ev = Evaluation(candidate="h", stage="done", ok=True, reason="ok", timings=timings)
    assert ev.verdict == "noise"
    slower = shape_timings([_bench(40, 80), _bench(40, 40)], seed=1, peaks=PEAKS)
    assert Evaluation(candidate="h", stage="done", ok=True, reason="", timings=slower
                      ).verdict == "slower"


def test_shapes_within_noise_do_not_block_a_faster_verdict() -> None:
    timings = shape_timings([_bench(100, 50), _bench(4, 4)], seed=1, peaks=PEAKS)
    assert timings[1].speedup.verdict == "noise"
    ev = Evaluation(candidate="h", stage="done", ok=True, reason="ok", timings=timings)
    assert ev.verdict == "faster"


def test_roofline_class_from_the_measured_peak() -> None:
    (fast,) = shape_timings([_bench(100, 12)], seed=1, peaks=PEAKS)
    assert fast.bandwidth is not None and fast.bandwidth > 1.5e12
    assert fast.bound == "memory-bound"
    (tiny,) = shape_timings([_bench(5, 4)], seed=1, peaks=PEAKS)
    assert tiny.bound == "latency-bound"


def test_check_summarises_the_failing_comparison() -> None:
    record = {"input": "(1031,) seed#0", "against": "reference", "passed": False, "error": None,
              "comparisons": [{"passed": False, "max_abs_error": 3.5, "max_rel_error": 1.0,
                               "mismatch_fraction": 0.0068, "where": "tail_block",
                               "description": "only the last partial block differs"}]}
    check = Check.from_json(record)
    assert (check.where, check.max_abs_error, check.mismatch_fraction) == (
        "tail_block", 3.5, 0.0068)


def test_rejected_candidate_reports() -> None:
    ev = failed("h", "correctness", "(1031,) vs reference: only the last partial block differs")
    assert verdict_line("gelu_kernel", ev) == (
        "gelu_kernel: REJECTED at correctness: (1031,) vs reference: only the last partial "
        "block differs")
    data = to_json("gelu_kernel", ev)
    assert json.loads(json.dumps(data))["stage"] == "correctness"
    assert to_markdown("gelu_kernel", ev).startswith("**gelu_kernel: REJECTED")


def test_declared_flops_give_a_rate_and_a_compute_bound_class() -> None:
    record = {**_bench(100, 50), "bytes": 1 << 20, "flops": 2.0 * 4096**3}
    (t,) = shape_timings([record], seed=1, peaks=PEAKS)
    assert t.flop_rate is not None
    assert abs(t.flop_rate / (2.0 * 4096**3 / 50.02e-6) - 1) < 0.01
    assert t.bound == "compute-bound"
    (no_flops,) = shape_timings([_bench(100, 50)], seed=1, peaks=PEAKS)
    assert no_flops.flop_rate is None


def test_every_failed_anticheat_check_is_evidence_the_first_decides() -> None:
    from kfbot.evaluate.evaluation import evidence_of as _evidence

    def check(name: str, passed: bool, error: str = "") -> Check:
        return Check(input="(3, 500) float32", against="original", passed=passed,
                     error=error or None, check=name)

    checks = [check("correctness", True), check("timer-disagreement", False, "wall 39 us"),
              check("foreign-kernels", False, "launches cutlass_80_gemm"),
              check("timer-disagreement", False, "again"), check("correctness", False)]
    found = _evidence(checks[1].finding(), checks)
    assert [f.check for f in found] == ["timer-disagreement", "foreign-kernels"]
    assert found[1].reason == "launches cutlass_80_gemm" and found[0].layer == "timing"
    assert _evidence(checks[2].finding(), checks[:3])[0].check == "foreign-kernels"
