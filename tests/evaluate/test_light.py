"""The speed of light: floors from bytes, FLOPs and measured peaks; the % beside the
speedup in every report; and the search stopping once a kernel is close to its floor."""

from __future__ import annotations

import random
from typing import Any

import pytest

from kfbot.evaluate.evaluation import Evaluation, ShapeTiming, shape_timings
from kfbot.evaluate.render import to_json, to_markdown, verdict_line
from kfbot.evaluate.verdict.light import (
    LATENCY_US,
    floating_dtype,
    floor_for,
    matmul_flops,
    percent,
    run_light,
)
from kfbot.github.prbody import PrReport, render, verdict
from kfbot.search.runner import near_light

H100 = {"bandwidth_bytes_per_s": 3.0e12, "fp32_flop_per_s": 5.0e13,
        "fp16_flop_per_s": 7.0e14, "bf16_flop_per_s": 7.0e14}


def _tensor(shape: tuple[int, ...], dtype: str = "float32") -> dict[str, Any]:
    return {"kind": "tensor", "shape": list(shape), "dtype": dtype}


def _sig(*args: dict[str, Any]) -> dict[str, Any]:
    return {"op": "m.op", "args": list(args), "kwargs": []}


def test_a_memory_bound_floor_is_bytes_over_bandwidth() -> None:
    # softmax of (4096, 1024) float32: 16 MiB read, 16 MiB written
    nbytes = 2 * 4096 * 1024 * 4
    floor = floor_for(nbytes, None, "float32", H100)
    assert floor is not None and floor.bound == "memory" and floor.flops_from == ""
    assert floor.us == pytest.approx(nbytes / 3.0e12 * 1e6)  # 11.18 µs
    assert floor_for(nbytes, None, "float32", None) is None
    assert floor_for(0, None, "float32", H100) is None


def test_a_matmul_floor_is_its_flops_at_the_dtypes_peak() -> None:
    sig = _sig(_tensor((4096, 2048)), _tensor((2048, 1024)))
    flops = matmul_flops(sig)
    assert flops == 2.0 * 4096 * 1024 * 2048
    nbytes = (4096 * 2048 + 2048 * 1024 + 4096 * 1024) * 4
    floor = floor_for(nbytes, flops, floating_dtype(sig), H100, "matmul shape")
    assert floor is not None and floor.bound == "compute"
    assert floor.us == pytest.approx(flops / 5.0e13 * 1e6)  # 343.6 µs, not the 17 µs of bytes
    half = floor_for(nbytes // 2, flops, "float16", H100)
    assert half is not None and half.us == pytest.approx(flops / 7.0e14 * 1e6)
    # float64 has no measured peak: the memory floor alone
    double = floor_for(nbytes * 2, flops, "float64", H100)
    assert double is not None and double.bound == "memory"


def test_only_matmul_shaped_calls_get_inferred_flops() -> None:
    assert matmul_flops(_sig(_tensor((8, 64, 32)), _tensor((8, 32, 16)))) == 2.0 * 64 * 16 * 32 * 8
    assert matmul_flops(_sig(_tensor((64, 32)), _tensor((16, 64)))) is None  # K differs
    assert matmul_flops(_sig(_tensor((64, 32)), _tensor((32,)))) is None  # a vector
    assert matmul_flops(_sig(_tensor((64, 32)), _tensor((32, 16), "int64"))) is None
    assert matmul_flops(_sig(_tensor((4096, 1024)))) is None
    assert matmul_flops(_sig(_tensor((2, 32)), _tensor((3, 32, 16)))) is None
    assert matmul_flops(None) is None


def test_percent_and_the_run_mean_leave_launch_bound_shapes_out() -> None:
    assert percent(10.0, 40.0) == 25.0
    assert percent(None, 40.0) is None and percent(1.0, 0.0) is None
    small = (0.01, LATENCY_US / 2)  # 3.5 µs of launch for a tiny shape: says nothing
    assert run_light([(10.0, 40.0), (20.0, 20.0), small]) == pytest.approx(0.5)
    assert run_light([small, (None, 100.0)]) is None


def _record(shape: tuple[int, ...], original_us: float, candidate_us: float) -> dict[str, Any]:
    rng = random.Random(1)
    return {"input": f"{shape} float32", "bytes": 2 * 4 * shape[0] * shape[1],
            "signature": _sig(_tensor(shape)),
            "original_us": [original_us * (1 + rng.random() / 100) for _ in range(30)],
            "candidate_us": [candidate_us * (1 + rng.random() / 100) for _ in range(30)]}


def _evaluation(candidate_us: float = 20.0, original_us: float = 400.0) -> Evaluation:
    timings = shape_timings([_record((4096, 1024), original_us, candidate_us),
                             _record((7, 33), 3.0, 2.9)], seed=0, peaks=H100)
    return Evaluation("c" * 64, "done", True, "correct", timings=timings,
                      environment={"gpu": "NVIDIA H100"})


def test_shape_timings_carry_the_floor_and_the_percent() -> None:
    ev = _evaluation()
    big: ShapeTiming = ev.timings[0]
    assert big.floor is not None and big.floor.bound == "memory"
    assert big.light == pytest.approx(100 * 11.18 / 20.1, rel=0.01)
    assert big.original_light == pytest.approx(100 * 11.18 / 402, rel=0.01)
    assert ev.light == pytest.approx(big.light)  # the tiny shape is launch-bound
    no_peaks = shape_timings([_record((64, 64), 10.0, 10.0)], seed=0, peaks=None)
    assert no_peaks[0].floor is None and no_peaks[0].light is None


def test_reports_print_the_percent_beside_the_speedup() -> None:
    ev = _evaluation()
    line = verdict_line("softmax_kernel", ev)
    assert "56% of the speed of light on NVIDIA H100" in line
    md = to_markdown("softmax_kernel", ev)
    assert "| % of speed of light |" in md and "| ✓ faster | 56% |" in md
    shape = to_json("softmax_kernel", ev)["timings"][0]
    assert shape["floor_bound"] == "memory" and shape["percent_of_light"] == pytest.approx(
        big_light(ev))
    report = PrReport("k.cu::softmax_kernel", "softmax_kernel", ev)
    body = render(report, "<!-- m -->")
    assert "at 56% of the speed of light" in verdict("softmax_kernel", ev)
    assert "| 56% (3%) |" in body  # the candidate's, and the original's
    assert "Speed of light: the least time the bytes each call must move take" in body


def big_light(ev: Evaluation) -> float:
    value = ev.timings[0].light
    assert value is not None
    return value


def test_the_search_stops_near_the_floor() -> None:
    far = {"a" * 64: _evaluation(candidate_us=200.0)}
    assert near_light(far, 90.0)() is None
    near = {"b" * 64: _evaluation(candidate_us=12.0)}
    said = near_light(near, 90.0)()
    assert said is not None and said.startswith("candidate bbbbbbbbbb runs at 9")
    assert near_light(near, None)() is None
    original_near = {"c" * 64: _evaluation(candidate_us=13.0, original_us=12.0)}
    said = near_light(original_near, 90.0)()
    assert said is not None and said.startswith("the original already runs at 9")


def test_the_precision_a_candidate_keeps_is_shown_in_the_pull_request() -> None:
    from kfbot.anticheat.findings import Finding
    from kfbot.evaluate.inputs.redrawn import precision_finding

    found = {"input": "(4096, 1024) float32 seed#0", "verdict": "warn",
             "line": "the candidate keeps 17.9 bits against a float64 reference, the "
                     "original 23.2 (float32): 5.3 bits lost"}
    (warn,) = precision_finding(found)
    assert (warn.check, warn.severity) == ("precision", "warn")
    assert precision_finding({**found, "verdict": "strict"}) == []  # a failed check instead
    assert precision_finding(None) == []
    ev = _evaluation()
    ev = Evaluation(ev.candidate, ev.stage, ev.ok, ev.reason, timings=ev.timings,
                    environment=ev.environment,
                    findings=(warn, Finding("fast-math", "static", "warn", "flag", "x")))
    body = render(PrReport("k.cu::softmax_kernel", "softmax_kernel", ev), "<!-- m -->")
    assert ("- Precision (warning): the candidate keeps 17.9 bits against a float64 "
            "reference, the original 23.2 (float32): 5.3 bits lost (on `(4096, 1024) "
            "float32 seed#0`).") in body
    assert "1 finding:" in body  # the precision line is not counted as a cheat's finding
