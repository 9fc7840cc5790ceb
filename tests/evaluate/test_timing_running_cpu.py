"""The timing loop's stopping rule: the running relative standard error must match the
two-pass statistics over the same samples, whatever their scale and spread."""

from __future__ import annotations

import math
import random
import statistics

import pytest

pytest.importorskip("torch")

from kfbot.evaluate.device.timing import Running, TimingSettings, _done


def _two_pass(samples: list[float]) -> float:
    return statistics.stdev(samples) / math.sqrt(len(samples)) / statistics.fmean(samples)


@pytest.mark.parametrize(("centre", "spread"), [(5.0, 0.01), (37.0, 2.0), (1e4, 3.0), (0.8, 0.4)])
def test_running_rse_matches_the_two_pass_value_at_every_count(centre: float, spread: float
                                                              ) -> None:
    rng = random.Random(7)
    samples: list[float] = []
    running = Running()
    for _ in range(200):
        value = abs(rng.gauss(centre, spread))
        samples.append(value)
        running.add(value)
        if len(samples) >= 2:
            assert running.rse() == pytest.approx(_two_pass(samples), rel=1e-9)


def test_running_rse_is_infinite_until_two_samples_and_zero_for_equal_ones() -> None:
    running = Running()
    assert running.rse() == math.inf
    running.add(12.5)
    assert running.rse() == math.inf
    for _ in range(5):
        running.add(12.5)
    assert running.rse() == 0.0


def _spreads(values: dict[str, list[float]]) -> dict[str, Running]:
    out = {name: Running() for name in values}
    for name, samples in values.items():
        for value in samples:
            out[name].add(value)
    return out


def test_timing_stops_only_when_every_op_is_precise_or_time_is_up() -> None:
    settings = TimingSettings(min_trials=3, target_rse=0.01, max_seconds=20.0)
    tight, loose = [10.0, 10.01, 9.99, 10.0], [10.0, 14.0, 7.0, 12.0]
    assert not _done(_spreads({"a": tight, "b": tight}), 2, 0.1, settings)  # too few trials
    assert _done(_spreads({"a": tight, "b": tight}), 4, 0.1, settings)
    assert not _done(_spreads({"a": tight, "b": loose}), 4, 0.1, settings)
    assert _done(_spreads({"a": tight, "b": loose}), 4, 25.0, settings)  # out of time
