"""Timing quality: the same kernel pair timed in 10 separate worker sessions.

Prints the reported speedup of each session per shape and its spread
((max - min) / median). Target: under 2 % for shapes whose kernels take 20 µs or more.

    python bench/timing_noise.py [--sessions 10]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from kfbot.config import load_config  # noqa: E402
from kfbot.evaluate.candidate import Candidate  # noqa: E402
from kfbot.evaluate.engine import Engine, EngineSettings  # noqa: E402
from kfbot.evaluate.task import KernelTask, make_task  # noqa: E402
from kfbot.scan.scanner import scan  # noqa: E402
from kfbot.scan.select import select_kernel  # noqa: E402

FIXTURE = ROOT / "fixtures" / "example"
CANDIDATE = ROOT / "tests" / "data" / "candidates" / "softmax_block_per_row" / "csrc" / "softmax.cu"


def task() -> KernelTask:
    config = load_config(None, FIXTURE)
    return make_task(select_kernel(scan(FIXTURE, config).kernels, "softmax_kernel"), FIXTURE,
                     config)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sessions", type=int, default=10)
    args = parser.parse_args()
    candidate = Candidate(files={"csrc/softmax.cu": CANDIDATE.read_text()}, origin="user")
    ratios: dict[str, list[float]] = defaultdict(list)
    durations: dict[str, float] = {}
    with tempfile.TemporaryDirectory(prefix="kfbot-noise-") as cache:
        settings = EngineSettings(cache_dir=Path(cache), measure_peaks=False)
        for session in range(args.sessions):
            with Engine(task(), settings) as engine:  # a new worker process each time
                result = engine.evaluate(candidate)
            assert result.ok, result.reason
            for t in result.timings:
                ratios[t.input].append(t.speedup.ratio)
                durations[t.input] = min(t.speedup.baseline.median, t.speedup.candidate.median)
            line = ", ".join(f"{t.speedup.ratio:.3f}" for t in result.timings)
            print(f"session {session + 1}: speedups per shape {line}", flush=True)
    print(f"\n{'shape':40} {'faster µs':>12} {'median x':>9} {'spread':>8}  target")
    for shape, values in ratios.items():
        median = statistics.median(values)
        spread = (max(values) - min(values)) / median
        applies = durations[shape] >= 20.0
        verdict = ("PASS" if spread < 0.02 else "FAIL") if applies else "n/a (< 20 µs)"
        print(f"{shape:40} {durations[shape]:12.1f} {median:9.3f} {spread:8.2%}  {verdict}")


if __name__ == "__main__":
    main()
