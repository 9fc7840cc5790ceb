"""Timing statistics for benchmarks: robust summaries and a bootstrap speedup test.

Kernel timings are skewed and noisy (clock changes, other work on the GPU, launch
jitter), so comparisons rest on medians and a bootstrap interval, which assume no
particular distribution. Pure Python on purpose: numpy is not everywhere this runs.
"""

from __future__ import annotations

import functools
import math
import random
import statistics
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Literal

Verdict = Literal["faster", "slower", "noise"]


@dataclass(frozen=True)
class TimingSummary:
    """Location and spread of one set of timings (any unit, all the same)."""

    n: int
    median: float
    q1: float  # quartiles by statistics.quantiles(method="inclusive")
    q3: float
    iqr: float
    mean: float
    stdev: float  # sample standard deviation; 0 for a single sample
    rse: float  # relative standard error of the mean: stdev / sqrt(n) / mean


@dataclass(frozen=True)
class Speedup:
    """How much faster the candidate is, with a bootstrap confidence interval."""

    ratio: float  # median(baseline) / median(candidate): above 1 means faster
    ci_low: float
    ci_high: float
    confidence: float
    verdict: Verdict
    baseline: TimingSummary
    candidate: TimingSummary


def _checked(samples: Iterable[float]) -> list[float]:
    """The samples in ascending order; each must be a positive finite number."""
    data = sorted(float(x) for x in samples)
    if not data:
        raise ValueError("no samples")
    bad = [x for x in data if not (math.isfinite(x) and x > 0)]  # NaN fails both tests
    if bad:
        raise ValueError(f"samples must be positive and finite, got {bad[0]!r}")
    return data


def _quartiles(data: list[float]) -> tuple[float, float]:
    if len(data) == 1:  # quantiles() needs two points
        return data[0], data[0]
    q1, _, q3 = statistics.quantiles(data, n=4, method="inclusive")
    return q1, q3


def summarize(samples: Sequence[float]) -> TimingSummary:
    """Median, quartiles, mean, spread; ValueError on empty or non-positive samples."""
    data = _checked(samples)
    n = len(data)
    q1, q3 = _quartiles(data)
    mean = statistics.fmean(data)
    stdev = statistics.stdev(data, mean) if n > 1 else 0.0
    return TimingSummary(n=n, median=statistics.median(data), q1=q1, q3=q3, iqr=q3 - q1,
                         mean=mean, stdev=stdev, rse=stdev / math.sqrt(n) / mean)


def enough(samples: Sequence[float], target_rse: float = 0.01, min_n: int = 10,
           max_n: int = 200) -> bool:
    """Whether to stop timing: precise enough after `min_n` runs, or `max_n` reached."""
    n = len(samples)
    if n >= max_n:
        return True
    if n < max(min_n, 2):  # one sample has no spread to judge precision by
        return False
    return summarize(samples).rse < target_rse


def _bootstrap_medians(data: list[float], rng: random.Random, resamples: int) -> list[float]:
    """Medians of `resamples` same-size draws with replacement from `data`.

    Which ranks of the sorted data a resample's median falls on depends only on n, so
    each draw is one pick from that exact distribution (`median_ranks`, made once per
    n) rather than n draws and a sort: the interpreter is held for about a millisecond
    per shape instead of tens, beside the threads that feed the GPUs. The same
    distribution as resampling, exactly.
    """
    ordered = sorted(data)
    pairs, cumulative = median_ranks(len(ordered))
    picked = rng.choices(pairs, cum_weights=cumulative, k=resamples)
    return [(ordered[low] + ordered[high]) / 2 for low, high in picked]


@functools.lru_cache(maxsize=512)
def median_ranks(n: int) -> tuple[tuple[tuple[int, int], ...], tuple[float, ...]]:
    """The ranks (from 0) of the two middle elements of a sorted resample of n items,
    as positions in the sorted data, with cumulative probabilities; for odd n both
    are the one middle rank. Pairs below 1e-16 in probability are left out.

    With N_j the draws among the j smallest items (binomial), the lower middle L
    (the k-th smallest draw) is at most j when N_j >= k. For even n, L = a < U = b
    exactly when k draws land in the a smallest, one of them on a, none strictly
    between a and b, and one on b: C(n, k) (a^k - (a-1)^k) ((n-b+1)^(n-k) - (n-b)^(n-k))
    out of n^n equally likely draws. L = U = a takes the rest of P(L = a).
    """
    if n < 1:
        raise ValueError("no samples")
    k, total = (n + 1) // 2, n**n
    floor = total // 10**16  # below this (over n^n) a pair is left out
    # L lies within a few standard deviations (about sqrt(n) / 2 ranks) of k.
    reach = 5 * math.isqrt(n) + 10
    first, last = max(1, k - reach), min(n, k + reach)
    at_least = {j: _at_least(n, k, j) for j in range(first - 1, last + 1)}
    # For even n: the factors of P(L = a < U = b) that depend on a, and on b alone.
    upper = [(n - b + 1) ** (n - k) - (n - b) ** (n - k) for b in range(n + 1)]
    weights: dict[tuple[int, int], int] = {}
    for a in range(first, last + 1):
        lower = at_least[a] - at_least[a - 1]  # n^n P(L = a)
        if lower <= floor:
            continue  # and every pair (a, b), which is less likely still
        if n % 2 == 0:
            below = math.comb(n, k) * (a**k - (a - 1) ** k)
            for b in range(a + 1, n + 1):  # less likely as b moves up: stop when negligible
                weight = below * upper[b]
                if weight <= floor:
                    break
                weights[(a - 1, b - 1)] = weight
            lower -= below * (n - a) ** (n - k)  # L = a < U, summed over every b
        weights[(a - 1, a - 1)] = lower
    kept = [(pair, w / total) for pair, w in weights.items() if w > floor]
    running, cumulative = 0.0, []
    for _, p in kept:
        running += p
        cumulative.append(running)
    return tuple(pair for pair, _ in kept), tuple(cumulative)


def _at_least(n: int, k: int, j: int) -> int:
    """n^n times the chance that at least k of n uniform draws from n items land among
    the j smallest, as an exact integer: the sum over i >= k of C(n, i) j^i (n-j)^(n-i),
    each term from the one before by an exact division."""
    if j == 0 or j == n:
        return 0 if j == 0 else n**n
    term: int = math.comb(n, k) * j**k * (n - j) ** (n - k)
    total = term
    for i in range(k, n):
        term = term * (n - i) * j // ((i + 1) * (n - j))
        total += term
    return total


def _percentile(ordered: list[float], q: float) -> float:
    """Linear interpolation between the closest ranks of an ascending list."""
    position = q * (len(ordered) - 1)
    low = math.floor(position)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (position - low)


def _verdict(ci_low: float, ci_high: float, noise_floor: float) -> Verdict:
    # A change must clear the floor with the whole interval: a significant 0.3 %
    # is still not worth a kernel rewrite, and timers drift by about that much.
    if ci_low > 1 + noise_floor:
        return "faster"
    if ci_high < 1 - noise_floor:
        return "slower"
    return "noise"


def compare_times(baseline: Sequence[float], candidate: Sequence[float], rng: random.Random,
                  resamples: int = 2000, confidence: float = 0.95,
                  noise_floor: float = 0.01, abs_floor_us: float = 0.0) -> Speedup:
    """Speedup of `candidate` over `baseline` with a percentile bootstrap interval.

    Each side is resampled on its own (the runs are not paired), and the interval
    is that of median(baseline) / median(candidate). Same rng state, same answer.
    Medians closer than `abs_floor_us` are noise whatever the interval says.
    """
    if resamples < 1 or not 0 < confidence < 1 or noise_floor < 0:
        raise ValueError("need resamples >= 1, 0 < confidence < 1 and noise_floor >= 0")
    base, cand = summarize(baseline), summarize(candidate)
    base_medians = _bootstrap_medians(_checked(baseline), rng, resamples)
    cand_medians = _bootstrap_medians(_checked(candidate), rng, resamples)
    ratios = sorted(b / c for b, c in zip(base_medians, cand_medians, strict=True))
    tail = (1 - confidence) / 2
    low, high = _percentile(ratios, tail), _percentile(ratios, 1 - tail)
    verdict = _verdict(low, high, noise_floor)
    if abs(base.median - cand.median) < abs_floor_us:
        verdict = "noise"
    return Speedup(ratio=base.median / cand.median, ci_low=low, ci_high=high,
                   confidence=confidence, verdict=verdict,
                   baseline=base, candidate=cand)


def geometric_mean(values: Iterable[float]) -> float:
    """The mean of ratios such as speedups (1.25 and 0.8 average to 1)."""
    data = _checked(values)
    return math.exp(math.fsum(math.log(x) for x in data) / len(data))
