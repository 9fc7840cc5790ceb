"""How a search shows its progress, wherever its output goes.

    progress = for_stream(sys.stdout, islands=4, budget=64)  # a live table in a terminal,
    executor = Watched(executor, progress)                    # else one line per evaluation
    optimize(..., on_result=progress.on_result(executor), executor=executor)

In a terminal the live table shows each island's evaluations, best speedup and
failures. Anywhere else (a CI log, a file, a pipe) every evaluation is one plain line
(its number, island, origin, verdict, speedup and seconds), and while candidates build
and run a heartbeat line comes at least every minute, so a log never goes silent.
In a GitHub Actions log each kernel's search is a folded group (`log_group`).
"""

from __future__ import annotations

import contextlib
import logging
import os
import sys
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import IO, TYPE_CHECKING

from kfbot.text import printable

if TYPE_CHECKING:  # the Action imports this module before it knows a search will run
    from rich.console import Console
    from rich.table import Table

    from kfbot.evaluate.candidate import Candidate
    from kfbot.evaluate.evaluation import Evaluation
    from kfbot.search.archive import Individual
    from kfbot.search.executor import Executor

log = logging.getLogger(__name__)

HEARTBEAT_S = 60.0


def build_heartbeat(line: str) -> None:
    """A long build's progress (the repository's own build): one line on stderr, which
    reaches a terminal, a pipe and a CI log alike, whatever the command prints."""
    sys.stderr.write(f"kfbot: {printable(line)}\n")
    sys.stderr.flush()


class Progress:
    """What a search tells its watchers; every method does nothing unless overridden."""

    def batch_started(self, size: int) -> None:
        """`size` candidates were handed to the executor (to build, verify and time)."""

    def batch_done(self) -> None:
        """The executor answered for the whole batch."""

    def evaluated(self, individual: Individual, evaluation: Evaluation | None) -> None:
        """One evaluation was recorded; `evaluation` is None for one replayed from the
        run log of a resumed run."""

    def close(self) -> None:
        """The search is over."""


class Watched:
    """An executor that tells a progress what it does, and keeps each evaluation so the
    progress can show more than the search's record of it (verdict, seconds)."""

    def __init__(self, inner: Executor, progress: Progress) -> None:
        self.inner = inner
        self.progress = progress
        self.evaluations: dict[str, Evaluation] = {}

    def evaluate(self, candidates: Sequence[Candidate]) -> list[tuple[Candidate, Evaluation]]:
        self.progress.batch_started(len(candidates))
        try:
            results = self.inner.evaluate(candidates)
        finally:
            self.progress.batch_done()
        for cand, ev in results:
            self.evaluations[cand.hash] = ev
        return results

    def close(self) -> None:
        self.inner.close()

    def on_result(self, individual: Individual) -> None:
        """For the search's `on_result`: the progress hears of every recorded one."""
        self.progress.evaluated(individual, self.evaluations.get(individual.hash))


class Tee(Progress):
    """Several watchers of one search."""

    def __init__(self, *watchers: Progress) -> None:
        self.watchers = watchers

    def batch_started(self, size: int) -> None:
        for w in self.watchers:
            w.batch_started(size)

    def batch_done(self) -> None:
        for w in self.watchers:
            w.batch_done()

    def evaluated(self, individual: Individual, evaluation: Evaluation | None) -> None:
        for w in self.watchers:
            w.evaluated(individual, evaluation)

    def close(self) -> None:
        for w in self.watchers:
            w.close()


# --- what is known so far ---------------------------------------------------------------


@dataclass
class Tally:
    """Evaluations so far, the best speedup and where it came from."""

    budget: int | None
    done: int = 0
    best: float | None = None
    best_from: str = ""
    started: float = field(default_factory=time.monotonic)

    def add(self, ind: Individual) -> bool:
        """Count one; True when it is faster than the original and every one before."""
        self.done += 1
        if ind.fitness is not None and ind.fitness > (self.best or 1.0):
            self.best = ind.fitness
            self.best_from = f"island {ind.island}, {ind.origin}"
            return True
        return False

    def count(self) -> str:
        return f"{self.done}/{self.budget}" if self.budget else str(self.done)

    def summary(self) -> str:
        best = f"best so far {self.best:.3f}x ({self.best_from})" if self.best is not None \
            else "no correct candidate faster than the original yet"
        return (f"{self.count()} evaluations, {best}, "
                f"{duration(time.monotonic() - self.started)} elapsed")


def duration(seconds: float) -> str:
    """`42s`, `3m05s`, `1h02m`."""
    s = int(seconds)
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    return f"{s // 3600}h{s % 3600 // 60:02d}m"


def line_of(n: str, ind: Individual, ev: Evaluation | None) -> str:
    """One evaluation in one line: number, island, origin, verdict, speedup, seconds."""
    if ev is None:
        verdict = "correct" if ind.fitness is not None else f"failed at {ind.stage}"
        tail = "replayed from the run log"
    else:
        verdict = (ev.verdict or "correct") if ev.ok else f"failed at {ev.stage}"
        tail = f"{ev.build_seconds + ev.eval_seconds:.1f} s"
    speed = f"{ind.fitness:.3f}x" if ind.fitness is not None else "-"
    # A reason can quote a compiler or the repository's tests: shown, never obeyed.
    why = "" if ind.fitness is not None or not ind.reason else \
        f" ({printable(' '.join(ind.reason.split())[:100])})"
    return f"evaluation {n}: island {ind.island}, {ind.origin}: {verdict}{why}, {speed}, {tail}"


# --- a log: one line per evaluation, and a heartbeat ---------------------------------------


class LogLines(Progress):
    """One plain line per evaluation, and a heartbeat while a batch runs quietly."""

    def __init__(self, stream: IO[str], budget: int | None,
                 heartbeat_s: float = HEARTBEAT_S) -> None:
        self.stream = stream
        self.tally = Tally(budget)
        self.heartbeat_s = heartbeat_s
        self._lock = threading.Lock()
        self._said = time.monotonic()  # when the last line was written
        self._batch: tuple[int, float] | None = None  # its size, when it started
        self._stop = threading.Event()
        self._beat = threading.Thread(target=self._beats, name="kfbot-heartbeat", daemon=True)
        self._beat.start()

    def batch_started(self, size: int) -> None:
        with self._lock:
            self._batch = (size, time.monotonic())
        log.debug("a batch of %d candidates handed to the executor", size)

    def batch_done(self) -> None:
        with self._lock:
            self._batch = None

    def evaluated(self, individual: Individual, evaluation: Evaluation | None) -> None:
        best = self.tally.add(individual)
        line = line_of(self.tally.count(), individual, evaluation)
        self._say(f"{line}{' (best so far)' if best else ''}")

    def close(self) -> None:
        self._stop.set()
        self._beat.join()

    def _say(self, line: str) -> None:
        with self._lock:
            self.stream.write(line + "\n")
            self.stream.flush()
            self._said = time.monotonic()

    def _beats(self) -> None:
        while not self._stop.wait(self._next_beat()):
            with self._lock:
                batch, quiet = self._batch, time.monotonic() - self._said
            if batch is not None and quiet >= self.heartbeat_s:
                size, since = batch
                self._say(f"still working: {size} candidate{'s' if size != 1 else ''} "
                          f"building, verifying or timing for "
                          f"{duration(time.monotonic() - since)}; {self.tally.summary()}")

    def _next_beat(self) -> float:
        with self._lock:
            due = self._said + self.heartbeat_s - time.monotonic()
        return max(0.05, min(due, self.heartbeat_s))


# --- a terminal: the live table -------------------------------------------------------------


@dataclass
class _Row:
    evaluations: int = 0
    best: float = 1.0
    failed: dict[str, int] = field(default_factory=dict)


class LiveTable(Progress):
    """Per island: evaluations, best speedup, failures by stage; redrawn in place."""

    def __init__(self, console: Console, islands: int, budget: int | None) -> None:
        from rich.live import Live

        self.rows = {i: _Row() for i in range(islands)}
        self.tally = Tally(budget)
        self._running: tuple[int, float] | None = None
        self.live = Live(get_renderable=self.table, console=console, refresh_per_second=4)
        self.live.start()

    def batch_started(self, size: int) -> None:
        self._running = (size, time.monotonic())

    def batch_done(self) -> None:
        self._running = None

    def evaluated(self, individual: Individual, evaluation: Evaluation | None) -> None:
        self.tally.add(individual)
        row = self.rows.setdefault(individual.island, _Row())
        row.evaluations += 1
        if individual.fitness is not None:
            row.best = max(row.best, individual.fitness)
        else:
            row.failed[individual.stage] = row.failed.get(individual.stage, 0) + 1

    def close(self) -> None:
        self.live.stop()

    def table(self) -> Table:
        from rich.table import Table

        caption = self.tally.summary()
        if self._running is not None:
            size, since = self._running
            caption += f"; {size} running for {duration(time.monotonic() - since)}"
        table = Table(title="kfbot optimize", caption=caption, caption_justify="left")
        for col in ("island", "evaluations", "best speedup", "failures by stage"):
            table.add_column(col)
        for i, row in sorted(self.rows.items()):
            failed = ", ".join(f"{k} {v}" for k, v in sorted(row.failed.items())) or "-"
            table.add_row(str(i), str(row.evaluations), f"{row.best:.3f}x", failed)
        return table


# --- a status somewhere else, every few minutes ----------------------------------------------


class Every(Progress):
    """Says the tally to `say` after an evaluation, at most once every `seconds`: for a
    pull request's status comment, which people read and GitHub rate-limits."""

    def __init__(self, say: Callable[[str], None], seconds: float, budget: int | None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.say, self.seconds, self.clock = say, seconds, clock
        self.tally = Tally(budget)
        self._last = clock()

    def evaluated(self, individual: Individual, evaluation: Evaluation | None) -> None:
        self.tally.add(individual)
        if self.clock() - self._last >= self.seconds:
            self._last = self.clock()
            self.say(self.tally.summary())


# --- choosing, and GitHub Actions log groups -------------------------------------------------


def for_stream(stream: IO[str], islands: int, budget: int | None,
               console: Console | None = None) -> Progress:
    """The live table on a terminal; one line per evaluation anywhere else."""
    if stream.isatty():
        from rich.console import Console

        return LiveTable(console or Console(file=stream), islands, budget)
    return LogLines(stream, budget)


def in_github_actions() -> bool:
    return os.environ.get("GITHUB_ACTIONS") == "true"


@contextlib.contextmanager
def log_group(title: str, stream: IO[str]) -> Iterator[None]:
    """A folded group in a GitHub Actions log (`::group::`); nothing elsewhere."""
    if not in_github_actions():
        yield
        return
    # A title is one line: a newline would end the command and print the rest.
    stream.write(f"::group::{' '.join(title.split())}\n")
    stream.flush()
    try:
        yield
    finally:
        stream.write("::endgroup::\n")
        stream.flush()
