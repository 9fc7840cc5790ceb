"""One budget for a run: evaluations, wall-clock time, LLM tokens and money.

Everything that costs is charged here, in one place; the search asks `exhausted()`
before each step and stops cleanly with the reason, and the report says what was
spent. The state is plain numbers so a resumed run continues with what is left.

Time is also asked ahead: `room(n)` says how many of a generation's n evaluations can
still finish before the limit, from how long evaluations have taken so far (`Pace`),
keeping back what the end of the run needs (`reserve_s`: the winner's second
evaluation, and what the command does after the search). A run so stops starting work
it cannot finish; what it started ends within one evaluation of the limit.
"""

from __future__ import annotations

import statistics
import time
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

# How many recent measurements an estimate looks at: builds get slower and faster as
# the search moves between the fast path and full builds.
RECENT = 16


@dataclass(frozen=True)
class Limits:
    evaluations: int | None = None
    seconds: float | None = None
    tokens: int | None = None
    usd: float | None = None


class Pace:
    """How long evaluations take, measured as they finish.

    A generation's candidates are built in parallel while the GPU verifies them one
    after another, so a generation of n takes about its slowest build plus n GPU
    evaluations; and never less than n times the slowest generation per candidate
    measured so far, whatever the model says.
    """

    def __init__(self) -> None:
        self.builds: deque[float] = deque(maxlen=RECENT)
        self.gpus: deque[float] = deque(maxlen=RECENT)
        self.per_candidate: deque[float] = deque(maxlen=RECENT)

    def evaluated(self, build_s: float, gpu_s: float) -> None:
        self.builds.append(max(0.0, build_s))
        self.gpus.append(max(0.0, gpu_s))

    def generation(self, candidates: int, wall_s: float) -> None:
        if candidates > 0:
            self.per_candidate.append(wall_s / candidates)

    @property
    def known(self) -> bool:
        return bool(self.gpus or self.per_candidate)

    def generation_s(self, candidates: int) -> float:
        """Seconds a generation of `candidates` evaluations is expected to take."""
        if candidates <= 0:
            return 0.0
        model = (max(self.builds, default=0.0)
                 + candidates * (statistics.fmean(self.gpus) if self.gpus else 0.0))
        measured = candidates * max(self.per_candidate, default=0.0)
        return max(model, measured)

    def again_s(self) -> float:
        """Seconds one more evaluation of a candidate already built takes (the winner's
        second evaluation): the quickest build seen (a cached one is quicker still) and
        the slowest GPU evaluation."""
        return min(self.builds, default=0.0) + max(self.gpus, default=0.0)


class Budget:
    def __init__(self, limits: Limits, clock: Callable[[], float] = time.monotonic,
                 spent: Mapping[str, float] | None = None,
                 started: float | None = None, reserve_s: float = 0.0) -> None:
        self.limits = limits
        self._clock = clock
        self.pace = Pace()
        # Kept back from the time limit for what follows the search in the same run.
        self.reserve_s = reserve_s
        earlier = dict(spent or {})
        self.evaluations = int(earlier.get("evaluations", 0))
        self.tokens = int(earlier.get("tokens", 0))
        self.usd = float(earlier.get("usd", 0.0))
        # Time spent before a resume counts too: the clock restarts, the total does not.
        # `started`: when the run began, before the budget was made (its set-up counts).
        self._before = float(earlier.get("seconds", 0.0))
        self._started = clock() if started is None else started

    def now(self) -> float:
        return self._clock()

    @property
    def seconds(self) -> float:
        return self._before + self._clock() - self._started

    def charge(self, evaluations: int = 0, tokens: int = 0, usd: float = 0.0) -> None:
        if evaluations < 0 or tokens < 0 or usd < 0:
            raise ValueError("a budget is only ever charged, never refunded")
        self.evaluations += evaluations
        self.tokens += tokens
        self.usd += usd

    def exhausted(self) -> str | None:
        """Which limit is spent, in words, or None while every limit has room."""
        lim = self.limits
        if lim.evaluations is not None and self.evaluations >= lim.evaluations:
            return f"evaluations spent ({self.evaluations}/{lim.evaluations})"
        if lim.seconds is not None and self.seconds >= lim.seconds:
            return f"time spent ({self.seconds:.0f}/{lim.seconds:.0f} s)"
        if lim.tokens is not None and self.tokens >= lim.tokens:
            return f"LLM tokens spent ({self.tokens}/{lim.tokens})"
        if lim.usd is not None and self.usd >= lim.usd:
            return f"money spent (${self.usd:.2f}/${lim.usd:.2f})"
        return None

    def seconds_left(self) -> float | None:
        if self.limits.seconds is None:
            return None
        return self.limits.seconds - self.seconds

    def time_for_again(self) -> bool:
        """Whether the time left allows one more evaluation of a candidate already built
        (the winner's second one, its variants' timing)."""
        left = self.seconds_left()
        return left is None or left > self.pace.again_s()

    def room(self, wanted: int) -> tuple[int, str]:
        """How many of `wanted` evaluations can start now and still finish, with the
        end of the run's reserve kept; when none can, why, in words."""
        left = self.seconds_left()
        if left is None or wanted <= 0:
            return wanted, ""
        usable = left - self.reserve()
        fits = 0
        while fits < wanted and self.pace.generation_s(fits + 1) <= usable:
            fits += 1
        if not self.pace.known and usable > 0:
            fits = wanted  # nothing measured yet: the first generation shows the pace
        if fits:
            return fits, ""
        return 0, (f"time nearly spent ({left:.0f} s of {self.limits.seconds:.0f} s left; an "
                   f"evaluation takes about {self.pace.generation_s(1):.0f} s and "
                   f"{self.reserve():.0f} s are kept to confirm the best and finish)")

    def reserve(self) -> float:
        """What the end of the run needs: the winner's second evaluation, its timing at
        held-out shapes, and what the command keeps (`reserve_s`)."""
        return 2 * self.pace.again_s() + self.reserve_s

    def evaluations_left(self) -> int | None:
        if self.limits.evaluations is None:
            return None
        return max(0, self.limits.evaluations - self.evaluations)

    def spent(self) -> dict[str, Any]:
        return {"evaluations": self.evaluations, "seconds": round(self.seconds, 3),
                "tokens": self.tokens, "usd": round(self.usd, 6)}


def spent_words(spent: Mapping[str, Any]) -> str:
    """What a run spent, as a person says it: `23 evaluations in 4m13s, 0 tokens, $0.00`."""
    evaluations = int(spent.get("evaluations", 0))
    tokens = int(spent.get("tokens", 0))
    return (f"{evaluations} evaluation{'s' if evaluations != 1 else ''} in "
            f"{duration_words(float(spent.get('seconds', 0.0)))}, {tokens:,} token"
            f"{'s' if tokens != 1 else ''}, ${float(spent.get('usd', 0.0)):.2f}")


def duration_words(seconds: float) -> str:
    """42s, 4m13s, 1h02m: the units a person reads a run's length in."""
    whole = round(seconds)
    if whole < 60:
        return f"{seconds:.1f}s" if seconds < 10 else f"{whole}s"
    minutes, secs = divmod(whole, 60)
    if minutes < 60:
        return f"{minutes}m{secs:02d}s"
    hours, minutes = divmod(minutes, 60)
    return f"{hours}h{minutes:02d}m"


def parse_duration(text: str) -> float:
    """'90s', '30m', '2h' or '1h30m' -> seconds. A bare number is refused: `30` could as
    well mean minutes as seconds, and a budget read the wrong way is hours of GPU time."""
    units = {"h": 3600.0, "m": 60.0, "s": 1.0}
    total, number = 0.0, ""
    for ch in text.strip().lower():
        if ch.isdigit() or ch == ".":
            number += ch
        elif ch in units and number:
            total += float(number) * units[ch]
            number = ""
        else:
            raise ValueError(f"not a duration: {text!r} (try 90s, 30m, 2h or 1h30m)")
    if number:
        raise ValueError(f"not a duration: {text!r} needs a unit (try {number}s or {number}m)")
    if total <= 0:
        raise ValueError(f"not a duration: {text!r} (try 90s, 30m, 2h or 1h30m)")
    return total


def parse_percent(text: str) -> float:
    """'5%' -> 0.05. The sign is required, as a duration's unit is: `5` could be read
    as 5 % or as 500 %."""
    number = text.strip().removesuffix("%")
    if number == text.strip():
        raise ValueError(f"not a percentage: {text!r} needs a % sign (try {text.strip()}%)")
    try:
        value = float(number)
    except ValueError:
        raise ValueError(f"not a percentage: {text!r} (try 5%)") from None
    if not 0 <= value < 1000:
        raise ValueError(f"not a percentage from 0% to 1000%: {text!r}")
    return value / 100
