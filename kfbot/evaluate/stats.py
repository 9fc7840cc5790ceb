"""Timing statistics for benchmarks: robust summaries and a bootstrap speedup test.

Kernel timings are skewed and noisy (clock changes, other work on the GPU, launch
jitter), so comparisons rest on medians and a bootstrap interval, which assume no
particular distribution. Pure Python on purpose: numpy is not everywhere this runs.
"""

from __future__ import annotations

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


def _median_of_sorted(data: list[float]) -> float:
    middle = len(data) // 2
    return data[middle] if len(data) % 2 else (data[middle - 1] + data[middle]) / 2


def _bootstrap_medians(data: list[float], rng: random.Random, resamples: int) -> list[float]:
    """Medians of `resamples` same-size draws with replacement from `data`, each drawn
    in constant time rather than as n draws and a sort (which held the interpreter
    for tens of milliseconds per shape, beside the threads that feed the GPUs).

    A draw's k-th smallest element is `ordered[floor(n * U)]`, U the k-th smallest of
    n uniforms, which is Beta(k, n - k + 1); given U, the next one up is
    U + (1 - U) * (1 - V ** (1 / (n - k))) for a uniform V (the least of the n - k
    uniforms above U). The same distribution as resampling, exactly.
    """
    ordered = sorted(data)
    n = len(ordered)
    k = (n + 1) // 2  # the lower middle rank, from 1
    medians = []
    for _ in range(resamples):
        u = rng.betavariate(k, n - k + 1)
        low = ordered[min(n - 1, int(u * n))]
        if n % 2:
            medians.append(low)
            continue
        above = u + (1 - u) * (1 - rng.random() ** (1 / (n - k)))
        medians.append((low + ordered[min(n - 1, int(above * n))]) / 2)
    return medians


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
                  noise_floor: float = 0.01) -> Speedup:
    """Speedup of `candidate` over `baseline` with a percentile bootstrap interval.

    Each side is resampled on its own (the runs are not paired), and the interval
    is that of median(baseline) / median(candidate). Same rng state, same answer.
    """
    if resamples < 1 or not 0 < confidence < 1 or noise_floor < 0:
        raise ValueError("need resamples >= 1, 0 < confidence < 1 and noise_floor >= 0")
    base, cand = summarize(baseline), summarize(candidate)
    base_medians = _bootstrap_medians(_checked(baseline), rng, resamples)
    cand_medians = _bootstrap_medians(_checked(candidate), rng, resamples)
    ratios = sorted(b / c for b, c in zip(base_medians, cand_medians, strict=True))
    tail = (1 - confidence) / 2
    low, high = _percentile(ratios, tail), _percentile(ratios, 1 - tail)
    return Speedup(ratio=base.median / cand.median, ci_low=low, ci_high=high,
                   confidence=confidence, verdict=_verdict(low, high, noise_floor),
                   baseline=base, candidate=cand)


def geometric_mean(values: Iterable[float]) -> float:
    """The mean of ratios such as speedups (1.25 and 0.8 average to 1)."""
    data = _checked(values)
    return math.exp(math.fsum(math.log(x) for x in data) / len(data))
