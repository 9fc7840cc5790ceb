"""Timing statistics: exact summaries, bootstrap verdicts, stopping rules."""

from __future__ import annotations

import itertools
import math
import random
import statistics
from collections.abc import Sequence
from statistics import NormalDist

import pytest

from kfbot.evaluate.verdict.stats import (
    TimingSummary,
    compare_times,
    enough,
    geometric_mean,
    summarize,
)


def normal(mean: float, sd: float, n: int, seed: int) -> list[float]:
    rng = random.Random(seed)
    return [rng.gauss(mean, sd) for _ in range(n)]


def even_normal(mean: float, sd: float, n: int) -> list[float]:
    """A normal sample without sampling luck: its n quantiles, median exactly `mean`."""
    dist = NormalDist(mean, sd)
    return [dist.inv_cdf((i + 0.5) / n) for i in range(n)]


def test_summary_of_odd_count() -> None:
    s = summarize([5.0, 1.0, 4.0, 2.0, 3.0])
    assert (s.n, s.median, s.q1, s.q3, s.iqr, s.mean) == (5, 3.0, 2.0, 4.0, 2.0, 3.0)
    assert s.stdev == pytest.approx(math.sqrt(2.5))
    assert s.rse == pytest.approx(math.sqrt(2.5) / math.sqrt(5) / 3)


def test_quartiles_are_inclusive() -> None:
    # Inclusive (linear between order statistics, like numpy's default) gives 1.75
    # and 3.25 here; the "exclusive" method would give 1.25 and 3.75.
    s = summarize([4, 3, 2, 1])
    assert (s.median, s.q1, s.q3, s.iqr) == (2.5, 1.75, 3.25, 1.5)
    assert s.stdev == pytest.approx(math.sqrt(5 / 3))


def test_single_sample() -> None:
    assert summarize([2.0]) == TimingSummary(n=1, median=2.0, q1=2.0, q3=2.0, iqr=0.0, mean=2.0,
                                             stdev=0.0, rse=0.0)


@pytest.mark.parametrize("bad", [[], [1.0, 0.0], [1.0, -2.0], [1.0, math.nan, 2.0],
                                 [1.0, math.inf]])
def test_bad_samples(bad: list[float]) -> None:
    with pytest.raises(ValueError):
        summarize(bad)
    with pytest.raises(ValueError):
        compare_times([1.0, 2.0], bad, random.Random(0))
    with pytest.raises(ValueError):
        geometric_mean(bad)


def test_bad_options() -> None:
    same, rng = [1.0, 2.0], random.Random(0)
    with pytest.raises(ValueError):
        compare_times(same, same, rng, resamples=0)
    with pytest.raises(ValueError):
        compare_times(same, same, rng, confidence=1.0)
    with pytest.raises(ValueError):
        compare_times(same, same, rng, confidence=0.0)
    with pytest.raises(ValueError):
        compare_times(same, same, rng, noise_floor=-0.01)


def test_enough_waits_for_min_n() -> None:
    assert not enough([1.0] * 9)  # perfectly stable, but too few to trust
    assert enough([1.0] * 10)
    assert not enough([])


def test_enough_stops_on_precision() -> None:
    tight = [99.0, 101.0] * 5  # rse = sqrt(10/9) / sqrt(10) / 100 = 0.0033
    loose = [90.0, 110.0] * 5  # rse = 0.033
    assert enough(tight)
    assert not enough(loose)
    assert enough(loose, target_rse=0.05)
    assert not enough(tight, target_rse=0.003)


def test_enough_stops_at_max_n() -> None:
    loose = [50.0, 150.0] * 100  # rse = 0.035 even at 200 samples
    assert not enough(loose[:198])
    assert enough(loose)  # 200 samples: give up on precision
    assert enough(loose[:20], max_n=20)


def test_clearly_faster() -> None:
    baseline, candidate = even_normal(100, 1, 51), even_normal(80, 1, 51)
    s = compare_times(baseline, candidate, random.Random(3))
    assert s.verdict == "faster"
    assert s.ratio == pytest.approx(1.25)
    assert s.ci_low < 1.25 < s.ci_high
    assert s.ci_high - s.ci_low < 0.02
    assert s.confidence == 0.95
    assert (s.baseline, s.candidate) == (summarize(baseline), summarize(candidate))


def test_clearly_slower() -> None:
    s = compare_times(even_normal(80, 1, 51), even_normal(100, 1, 51), random.Random(3))
    assert s.verdict == "slower"
    assert s.ratio == pytest.approx(0.8)
    assert s.ci_low < 0.8 < s.ci_high


def test_a_difference_below_the_absolute_floor_is_noise_both_ways() -> None:
    # A launch-bound shape: 3.90 µs against 4.16 µs, tightly measured, is significant
    # to the bootstrap but under half a microsecond.
    base, cand = even_normal(3.90, 0.02, 51), even_normal(4.16, 0.02, 51)
    assert compare_times(base, cand, random.Random(3)).verdict == "slower"
    tiny = compare_times(base, cand, random.Random(3), abs_floor_us=0.5)
    assert tiny.verdict == "noise" and tiny.ratio == pytest.approx(3.90 / 4.16)
    assert compare_times(cand, base, random.Random(3), abs_floor_us=0.5).verdict == "noise"
    # 5.7 µs against 8.6 µs is a real regression at any size.
    slow = compare_times(even_normal(5.7, 0.05, 51), even_normal(8.6, 0.05, 51),
                         random.Random(3), abs_floor_us=0.5)
    assert slow.verdict == "slower"


def test_random_samples_get_the_right_verdicts() -> None:
    # Sample medians wander a few tenths of a percent; the verdicts must not.
    rng = random.Random(5)
    for seed in range(10):
        fast, slow = normal(80, 1, 50, seed), normal(100, 1, 50, seed + 100)
        same = normal(100, 1, 50, seed + 200)
        assert compare_times(slow, fast, rng, resamples=500).verdict == "faster"
        assert compare_times(fast, slow, rng, resamples=500).verdict == "slower"
        assert compare_times(slow, same, rng, resamples=500).verdict == "noise"


def test_interval_covers_the_true_ratio() -> None:
    def hits(confidence: float) -> int:
        rng = random.Random(11)
        count = 0
        for _ in range(40):
            baseline = [rng.gauss(100, 1) for _ in range(50)]
            candidate = [rng.gauss(80, 1) for _ in range(50)]
            s = compare_times(baseline, candidate, rng, resamples=500, confidence=confidence)
            count += s.ci_low < 1.25 < s.ci_high
        return count

    # About 38 of 40 at 95 %, about 20 at 50 %: the interval means what it says.
    assert hits(0.95) >= 34
    assert 12 <= hits(0.5) <= 28


def test_same_distribution_is_noise() -> None:
    s = compare_times(even_normal(100, 1, 51), even_normal(100, 1, 51), random.Random(3))
    assert s.verdict == "noise"
    assert s.ci_low < 1 < s.ci_high


def test_noise_floor() -> None:
    # 0.5 % faster and measured very precisely: real, but below the default 1 % floor.
    baseline, candidate = normal(100, 0.01, 30, seed=1), normal(99.5, 0.01, 30, seed=2)
    s = compare_times(baseline, candidate, random.Random(3))
    assert 1.004 < s.ci_low < s.ci_high < 1.006
    assert s.verdict == "noise"
    assert compare_times(baseline, candidate, random.Random(3),
                         noise_floor=0.001).verdict == "faster"


def test_constant_samples_give_a_point_interval() -> None:
    s = compare_times([2.0] * 20, [1.0] * 20, random.Random(0))
    assert (s.ratio, s.ci_low, s.ci_high, s.verdict) == (2.0, 2.0, 2.0, "faster")


def test_deterministic_given_the_rng() -> None:
    baseline, candidate = normal(100, 5, 40, seed=1), normal(95, 5, 40, seed=2)
    first = compare_times(baseline, candidate, random.Random(42))
    assert compare_times(baseline, candidate, random.Random(42)) == first
    other = compare_times(baseline, candidate, random.Random(43))
    assert (other.ci_low, other.ci_high) != (first.ci_low, first.ci_high)
    assert other.ratio == first.ratio  # the point estimate does not depend on the rng


def test_lower_confidence_gives_a_narrower_interval() -> None:
    baseline, candidate = normal(100, 5, 40, seed=1), normal(95, 5, 40, seed=2)
    wide = compare_times(baseline, candidate, random.Random(7), confidence=0.99)
    narrow = compare_times(baseline, candidate, random.Random(7), confidence=0.5)
    assert wide.ci_low < narrow.ci_low < narrow.ci_high < wide.ci_high


def test_geometric_mean() -> None:
    assert geometric_mean([1.25, 0.8]) == pytest.approx(1.0)
    assert geometric_mean([2.0, 8.0]) == pytest.approx(4.0)
    assert geometric_mean(iter([3.0])) == pytest.approx(3.0)


@pytest.mark.parametrize("n", [1, 2, 7, 10, 51])
def test_bootstrap_medians_follow_the_resampling_distribution(n: int) -> None:
    # Drawn as order statistics, the medians must be distributed exactly as those of
    # n draws with replacement: compare the two empirical distribution functions at
    # every data point (their gap stays under 0.015 but for a 1-in-1000 fluke).
    from kfbot.evaluate.verdict.stats import _bootstrap_medians

    data = [random.Random(n).expovariate(1) * (i + 1) for i in range(n)]
    draws = 40_000
    fast = _bootstrap_medians(data, random.Random(1), draws)
    rng = random.Random(2)
    slow = [statistics.median(rng.choices(data, k=n)) for _ in range(draws)]
    assert set(fast) <= {(a + b) / 2 for a in data for b in data}
    for x in sorted(data):
        gap = abs(sum(m <= x for m in fast) - sum(m <= x for m in slow)) / draws
        assert gap < 0.015, (x, gap)


@pytest.mark.parametrize("n", [1, 2, 3, 4, 5, 6])
def test_median_ranks_match_every_possible_resample(n: int) -> None:
    # All n^n resamples, equally likely: which sorted positions their two middle
    # elements come from must have exactly the probabilities of the table.
    from kfbot.evaluate.verdict.stats import median_ranks

    counts: dict[tuple[int, int], int] = {}
    for draw in itertools.product(range(n), repeat=n):
        ordered = sorted(draw)
        pair = (ordered[(n - 1) // 2], ordered[n // 2])
        counts[pair] = counts.get(pair, 0) + 1
    pairs, cumulative = median_ranks(n)
    table = dict(zip(pairs, _chances(cumulative), strict=True))
    assert set(table) == set(counts)
    for pair, count in counts.items():
        assert table[pair] == pytest.approx(count / n**n, rel=1e-12, abs=1e-15), pair


@pytest.mark.parametrize("n", [30, 31, 200, 201])
def test_median_ranks_hold_all_but_a_negligible_mass(n: int) -> None:
    from kfbot.evaluate.verdict.stats import median_ranks

    pairs, cumulative = median_ranks(n)
    assert cumulative[-1] == pytest.approx(1.0, abs=1e-13)
    assert all(low <= high for low, high in pairs) and len(set(pairs)) == len(pairs)
    chances = _chances(cumulative)
    assert min(chances) > 0
    # The likeliest median of a resample is the data's own middle.
    likeliest = pairs[chances.index(max(chances))]
    assert likeliest == ((n - 1) // 2, (n - 1) // 2 if n % 2 else n // 2)


def _chances(cumulative: Sequence[float]) -> list[float]:
    return [b - a for a, b in itertools.pairwise((0.0, *cumulative))]

