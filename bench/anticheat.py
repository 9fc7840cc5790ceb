"""How well does kfbot catch cheats, and what do the checks cost honest candidates?

Runs the corpus in `fixtures/cheats/` on the GPU with the real engine and prints:

* every entry with its expected and actual verdict and the checks that named it;
* the catch rate (cheats rejected by the check they target) and the false-rejection
  rate (honest candidates rejected), with every layer on;
* the same for the runtime layer alone (static rules off) on the cheats it targets;
* the cost of the runtime checks: the evaluation time of the honest candidates with
  the runtime probes on and off (builds cached, so only GPU-side work is compared);
* the cost of the redrawn inputs and of the clean room per candidate: the honest
  candidates' evaluation time with each on and off (`--parts distributions`).

    .venv/bin/python bench/anticheat.py [--parts corpus,runtime,overhead] [--only new]
"""

from __future__ import annotations

import argparse
import math
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from rich.console import Console
from rich.table import Table

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.corpus import Entry, Outcome, load_corpus, named_checks, run_corpus  # noqa: E402
from kfbot.evaluate.engine import EngineSettings  # noqa: E402

FIXTURES = ROOT / "fixtures"
TIMING = {"max_trials": 40, "min_trials": 10, "max_seconds": 5.0}
OVERHEAD_TARGET = 0.20
# The entries of the redrawn inputs and the isolation checks, and the honest twins
# beside them: what `--only new` runs.
NEW = {"cheat-softmax-no-max", "honest-softmax-online-rows", "cheat-softmax-closed-form",
       "cheat-softmax-strided", "cheat-nan-wildcard", "cheat-tf32-matmul", "cheat-tf32-flag",
       "cheat-batch-and-skip", "cheat-broken-context", "honest-softmax-slow-original",
       "honest-matmul-smem-tiling"}


def settings(cache: Path, static: bool = True, runtime: bool = True,
             timing: dict[str, float] = TIMING, distributions: bool = True,
             clean_room: bool = True) -> EngineSettings:
    return EngineSettings(cache_dir=cache, timing=timing, job_timeout_s=120,
                          static_checks=static, runtime_checks=runtime,
                          distributions=distributions, clean_room=clean_room)


def show(console: Console, title: str, outcomes: list[Outcome]) -> None:
    table = Table(title=title)
    for col in ("entry", "expected", "got", "named by", "right?", "eval s"):
        table.add_column(col)
    for o in sorted(outcomes, key=lambda o: o.entry.name):
        ev = o.evaluation
        expected = f"rejected by {o.expected_check}" if o.entry.cheat else "accepted"
        got = "accepted" if ev.ok else f"rejected at {ev.stage}"
        if ev.needs_review:
            got += " (flagged for review)"
        table.add_row(o.entry.name, expected, got, ", ".join(sorted(named_checks(ev))) or "-",
                      "yes" if o.correct else "NO", f"{ev.eval_seconds:.1f}")
    console.print(table)
    cheats = [o for o in outcomes if o.entry.cheat]
    honest = [o for o in outcomes if not o.entry.cheat]
    caught = sum(o.correct for o in cheats)
    rejected_any = sum(not o.evaluation.ok for o in cheats)
    false = sum(not o.evaluation.ok for o in honest)
    console.print(f"{title}: catch rate {caught}/{len(cheats)} = "
                  f"{caught / max(1, len(cheats)):.0%} by the targeted check "
                  f"({rejected_any}/{len(cheats)} rejected at all); false rejections "
                  f"{false}/{len(honest)} = {false / max(1, len(honest)):.0%}", highlight=False)


def overhead(console: Console, cache: Path, honest: list[Entry], timing: dict[str, float],
             what: str) -> None:
    """Evaluation seconds per honest candidate, probes on vs off; the first pass builds
    (and is not counted), the others reuse the builds.

    The first evaluation in each worker session also pays one-off costs (modules and
    the profiler loading), so the steady state, later evaluations only, is shown apart:
    it is what a search pays per candidate. Where the time goes inside the worker is
    shown per phase."""
    totals: dict[bool, list[float]] = {True: [], False: []}
    steady: dict[bool, list[float]] = {True: [], False: []}
    phases: dict[bool, dict[str, float]] = {True: {}, False: {}}
    console.print(f"overhead with {what} timing settings", highlight=False)
    for runtime in (True, False, True):
        started = time.monotonic()
        outcomes = run_corpus(FIXTURES, honest, settings(cache, runtime=runtime, timing=timing))
        wall = time.monotonic() - started
        totals[runtime].append(sum(o.evaluation.eval_seconds for o in outcomes))
        later = _after_first_per_session(outcomes)
        steady[runtime].append(statistics.fmean(later) if later else math.nan)
        this: dict[str, float] = {}
        trials = sum(t.speedup.baseline.n for o in outcomes for t in o.evaluation.timings)
        for o in outcomes:
            for name, seconds in o.evaluation.phases.items():
                this[name] = this.get(name, 0.0) + seconds
                phases[runtime][name] = phases[runtime].get(name, 0.0) + seconds
        console.print(f"  runtime checks {'on ' if runtime else 'off'}: "
                      f"{totals[runtime][-1]:.1f} s of evaluation over {len(honest)} candidates, "
                      f"{steady[runtime][-1]:.2f} s each after the first in a session "
                      f"({wall:.1f} s wall incl. worker start and baselines)", highlight=False)
        console.print("    worker phases (s): " + ", ".join(
            f"{k} {v:.2f}" for k, v in sorted(this.items()))
            + f"; {trials} timed trials", highlight=False)
    _show_phases(console, phases)
    for label, data in (("on the GPU, builds cached", totals),
                        ("on the GPU, steady state", steady)):
        on, off = statistics.fmean(data[True][1:]), statistics.fmean(data[False])
        _verdict(console, on / off - 1, label)


def added_cost(console: Console, cache: Path, honest: list[Entry]) -> None:
    """Seconds per honest candidate with the redrawn inputs and the clean room on, and
    with each off (a first pass builds and is not counted); the worker's phases say
    where the difference goes (`clean-room`, `clean-room-save`, `verify`)."""
    run_corpus(FIXTURES, honest, settings(cache))  # builds, captures, contracts
    variants = {"both on": (True, True), "redrawn inputs off": (False, True),
                "clean room off": (True, False)}
    means: dict[str, float] = {}
    for label, (redrawn, clean) in variants.items():
        outcomes = run_corpus(FIXTURES, honest, settings(cache, distributions=redrawn,
                                                         clean_room=clean))
        seconds = [o.evaluation.eval_seconds for o in outcomes]
        means[label] = statistics.fmean(seconds)
        rejected = [o.entry.name for o in outcomes if not o.evaluation.ok]
        phases: dict[str, float] = {}
        for o in outcomes:
            for name, value in o.evaluation.phases.items():
                phases[name] = phases.get(name, 0.0) + value / len(outcomes)
        console.print(f"  {label}: {means[label]:.2f} s per candidate over {len(honest)} "
                      f"honest candidates{'; REJECTED ' + ', '.join(rejected) if rejected else ''}"
                      f"; per candidate: " + ", ".join(
                          f"{k} {v:.2f}" for k, v in sorted(phases.items())
                          if k in ("verify", "clean-room", "clean-room-save", "precision",
                                   "bench", "inputs")), highlight=False)
    for label in ("redrawn inputs off", "clean room off"):
        what = label.removesuffix(" off")
        extra = means["both on"] - means[label]
        console.print(f"the {what} cost {extra:+.2f} s per candidate "
                      f"({extra / means[label]:+.0%} of its evaluation)", highlight=False)


def _verdict(console: Console, extra: float, label: str) -> None:
    verdict = "PASS" if extra <= OVERHEAD_TARGET else "FAIL"
    console.print(f"runtime checks cost {extra:+.0%} evaluation time {label} "
                  f"(target <= +{OVERHEAD_TARGET:.0%}): {verdict}", highlight=False)


def _show_phases(console: Console, phases: dict[bool, dict[str, float]]) -> None:
    """Seconds per worker phase over all candidates: checks on (two passes) vs off."""
    table = Table(title="where the worker's time goes (s, summed over the candidates)")
    for col in ("phase", "checks on (mean of 2 passes)", "checks off"):
        table.add_column(col)
    for name in sorted(set(phases[True]) | set(phases[False])):
        table.add_row(name, f"{phases[True].get(name, 0.0) / 2:.2f}",
                      f"{phases[False].get(name, 0.0):.2f}")
    console.print(table)


def _after_first_per_session(outcomes: list[Outcome]) -> list[float]:
    """Evaluation seconds of every outcome but the first of each engine (worker session)."""
    seen: set[tuple[str, str, tuple[object, ...]]] = set()
    out = []
    for o in outcomes:
        key = (o.entry.fixture, o.entry.kernel, tuple(sorted(o.entry.tolerances.items())))
        if key in seen:
            out.append(o.evaluation.eval_seconds)
        seen.add(key)
    return out


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--parts", default="corpus,runtime,overhead",
                        help="comma-separated: corpus (every layer), runtime (static rules "
                             "off), overhead (runtime checks on vs off on honest candidates, "
                             "default timing), overhead-short (the same, short timing), "
                             "distributions (the redrawn inputs and the clean room, on vs off)")
    parser.add_argument("--only", default=None,
                        help="'new' (the entries of the redrawn inputs and the isolation "
                             "checks, with their honest twins) or comma-separated entry "
                             "names (default: the whole corpus)")
    args = parser.parse_args(argv)
    parts = set(args.parts.split(","))
    console = Console(width=160)
    entries = load_corpus(FIXTURES / "cheats")
    if args.only:
        wanted = NEW if args.only == "new" else set(args.only.split(","))
        unknown = wanted - {e.name for e in entries}
        if unknown:
            parser.error(f"--only: no entries {sorted(unknown)}")
        entries = [e for e in entries if e.name in wanted]
    with tempfile.TemporaryDirectory(prefix="kfbot-anticheat-") as tmp:
        cache = Path(os.environ.get("KFBOT_CACHE") or tmp)  # a kept cache skips captures
        outcomes: list[Outcome] = []
        if "corpus" in parts:
            full = run_corpus(FIXTURES, entries, settings(cache), on_result=_progress(console))
            show(console, "every layer", full)
            outcomes += full
        if "runtime" in parts:
            runtime = [e for e in entries if e.runtime_check]
            alone = run_corpus(FIXTURES, runtime, settings(cache, static=False),
                               on_result=_progress(console))
            show(console, "runtime layer alone", alone)
            outcomes += alone
        honest = [e for e in entries if not e.cheat]
        if "overhead" in parts:  # what kfbot runs: the default timing settings
            overhead(console, cache, honest, {}, "the default")
        if "overhead-short" in parts:  # short timing: the checks weigh more
            overhead(console, cache, honest, TIMING, f"short ({TIMING})")
        if "distributions" in parts:
            console.print("redrawn inputs and clean room, short timing", highlight=False)
            added_cost(console, cache, honest)
    return 0 if all(o.correct for o in outcomes) else 1


def _progress(console: Console) -> Callable[[Outcome], None]:
    def report(o: Outcome) -> None:
        mark = "ok " if o.correct else "BAD"
        console.print(f"  {mark} {o.entry.name}: {o.evaluation.stage} "
                      f"{o.evaluation.reason[:110]}", highlight=False, markup=False)

    return report


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
