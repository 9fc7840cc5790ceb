"""Evaluation throughput on one GPU: 32 candidates per repository layout, end to end.

Each candidate is built (the fast path where it applies: the kernel alone, linked to
the host part of its unit compiled once for the original; see kfbot.evaluate.build.fast.path),
verified against the reference on fresh inputs and benchmarked against the original,
in generations of 8 as the search runs them: builds on every core while the GPU works.
The layouts (bench/layouts.py): torch-files (each kernel in its own .cu with the torch
headers) and one-unit (one translation unit including every kernel's header), and on
request kernel-file (a kernel .cu without torch headers).

Printed per layout: the one-off set-up; per candidate the path its build took, its
build seconds and its GPU seconds; the amortized seconds per candidate with builds
overlapped and the GPU's busy share; and, from the same run, full builds of the first
`--full` candidates (the unit compiled whole, as without the fast path), with the
amortized figure a generation of 8 would take on them.

    python bench/eval_throughput.py [--layouts torch-files,one-unit] [--full 4] [--plain 0]

To keep the run short (about 3 minutes on a 16-core H100 machine) the layouts' set-ups
and the full builds run at the same time, before the fast candidates are timed one
layout after the other.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import textwrap
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.layouts import LAYOUTS, Layout  # noqa: E402
from kfbot.config import load_config  # noqa: E402
from kfbot.evaluate.build import BuildResult  # noqa: E402
from kfbot.evaluate.candidate import ORIGINAL, Candidate  # noqa: E402
from kfbot.evaluate.engine import Engine, EngineSettings  # noqa: E402
from kfbot.evaluate.evaluation import Evaluation  # noqa: E402
from kfbot.evaluate.task import make_task  # noqa: E402
from kfbot.scan.scanner import scan  # noqa: E402
from kfbot.scan.select import select_kernel  # noqa: E402

GENERATION = 8  # 4 islands x 2 candidates: what `kfbot optimize` evaluates at once
TARGETS = {"one-unit": 5.0, "torch-files": 1.5, "kernel-file": 3.0}


@dataclass
class Run:
    """One layout's engine and what was measured on it."""

    layout: Layout
    engine: Engine
    setup_s: float = 0.0
    full: list[tuple[Candidate, BuildResult]] = field(default_factory=list)
    full_wall_s: float = 0.0
    error: str = ""


def engine_for(layout: Layout, cache: Path) -> Engine:
    config = load_config(None, layout.fixture)
    kernel = select_kernel(scan(layout.fixture, config).kernels, layout.kernel)
    settings = EngineSettings(cache_dir=cache / layout.name,
                              timing={"max_trials": 30, "min_trials": 10})
    return Engine(make_task(kernel, layout.fixture, config), settings)


def set_up(run: Run) -> None:
    """GPU probe, the original's build (and the host part, beside it), input capture and
    the baseline check."""
    started = time.monotonic()
    try:
        run.engine.probe()
        base = run.engine.baseline()
        if not base.ok:
            run.error = f"the baseline failed: {base.reason}"
        run.engine.builder.warm(run.engine.request(ORIGINAL))  # joins the warm-up
    except Exception as exc:  # reported with the layout, the others still run
        run.error = f"{type(exc).__name__}: {exc}"
    run.setup_s = time.monotonic() - started


def full_builds(run: Run, count: int) -> None:
    """The first `count` candidates built whole, side by side, as without the fast path."""
    started = time.monotonic()
    candidates = run.layout.candidates(count)
    requests = [replace(run.engine.request(c), kernel="") for c in candidates]
    run.full = list(zip(candidates, run.engine.builder.build_many(requests), strict=True))
    run.full_wall_s = time.monotonic() - started


def path_of(ev: Evaluation) -> str:
    note = next((d.message for d in ev.diagnostics if d.kind == "build_path"), "")
    return note.split(" build", 1)[0] or ("full" if ev.stage != "build" else "-")


def fast_phase(run: Run, count: int) -> None:
    layout, engine = run.layout, run.engine
    candidates = layout.candidates(count)
    results: list[tuple[Candidate, Evaluation]] = []
    started = time.monotonic()
    for first in range(0, len(candidates), GENERATION):
        results += list(engine.evaluate_many(candidates[first:first + GENERATION]))
    wall = time.monotonic() - started
    print(f"\n{layout.name}: {len(results)} candidates of {layout.kernel} "
          f"({layout.fixture.name}/{layout.file}), arch {engine.builder.arch_list}")
    print(f"  set-up (GPU probe, original build and host part, capture, baseline): "
          f"{run.setup_s:.1f} s")
    for cand, ev in sorted(results, key=lambda r: candidates.index(r[0])):
        verdict = f"{ev.speedup:.2f}x {ev.verdict}" if ev.ok and ev.speedup else ev.stage
        print(f"  {cand.rationale:34s} {path_of(ev):5s} build {ev.build_seconds:6.2f} s  "
              f"GPU {ev.eval_seconds:5.2f} s  {verdict}")
    summary(run, results, wall)


def summary(run: Run, results: Sequence[tuple[Candidate, Evaluation]], wall: float) -> None:
    name = run.layout.name
    evs = [ev for _, ev in results]
    gpu = sum(ev.eval_seconds for ev in evs)
    fast = [ev.build_seconds for ev in evs if path_of(ev) == "fast"]
    print(f"  {sum(ev.ok for ev in evs)}/{len(evs)} correct; {len(fast)} built the fast way "
          f"(build {_mean(fast)} s each); GPU {gpu / len(evs):.2f} s per candidate")
    print(f"  amortized: {wall / len(evs):.2f} s per candidate ({wall:.1f} s for {len(evs)} "
          f"in generations of {GENERATION}; target <= {TARGETS[name]} s); GPU busy "
          f"{100 * gpu / wall:.0f}% of the time")
    if run.full:
        builds = [b.seconds for _, b in run.full]
        model = (max(builds) + GENERATION * gpu / len(evs)) / GENERATION
        ok = sum(b.ok for _, b in run.full)
        print(f"  full builds of {len(builds)} of the same candidates, side by side: "
              f"{', '.join(f'{s:.1f}' for s in builds)} s ({ok} built; {run.full_wall_s:.1f} s "
              "wall)")
        print(f"  amortized with full builds: {model:.2f} s per candidate (a generation of "
              f"{GENERATION}: the slowest full build, then its GPU evaluations)")


def _mean(values: Sequence[float]) -> str:
    return f"{statistics.fmean(values):.2f}" if values else "-"


PLAIN = """
import sys, time, torch
from torch.utils.cpp_extension import load_inline
cuda = open(sys.argv[1]).read()
cpp = "torch::Tensor gelu(torch::Tensor x);"
glue = '''
torch::Tensor gelu(torch::Tensor x) {
    auto y = torch::empty_like(x);
    launch_gelu(x.data_ptr<float>(), y.data_ptr<float>(), x.numel());
    return y;
}
'''
t = time.monotonic()
ext = load_inline(name=sys.argv[2], cpp_sources=cpp, cuda_sources=cuda + glue,
                  functions=["gelu"], extra_cuda_cflags=["-O3"], build_directory=sys.argv[3])
x = torch.randn(1 << 20, device="cuda")
torch.testing.assert_close(ext.gelu(x), torch.nn.functional.gelu(x, approximate="tanh"))
print(time.monotonic() - t)
"""


def run_plain(count: int) -> None:
    """One load_inline build per variant, serially: what benchmark harnesses pay."""
    layout = LAYOUTS["kernel-file"]
    times = []
    for i, candidate in enumerate(layout.candidates(count)):
        with tempfile.TemporaryDirectory() as tmp:
            src = Path(tmp) / "k.cu"
            src.write_text(candidate.files[layout.file])
            build = Path(tmp) / "build"
            build.mkdir()
            out = subprocess.run([sys.executable, "-c", textwrap.dedent(PLAIN), str(src),
                                  f"plain_gelu_{i}", str(build)],
                                 capture_output=True, text=True, check=True)
            times.append(float(out.stdout.strip().splitlines()[-1]))
    mean = sum(times) / len(times)
    print(f"\nplain path (load_inline per variant, serial), {len(times)} variants: "
          f"{', '.join(f'{t:.1f}' for t in times)} s -> {mean:.1f} s per candidate")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--layouts", default="torch-files,one-unit",
                        help=f"comma-separated, of {', '.join(LAYOUTS)}")
    parser.add_argument("--variants", type=int, default=32)
    parser.add_argument("--full", type=int, default=4,
                        help="candidates per layout also built whole (0: none)")
    parser.add_argument("--plain", type=int, default=0,
                        help="kernel-file variants built with load_inline (a minute each)")
    args = parser.parse_args()
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="kfbot-throughput-") as cache:
        runs = [Run(LAYOUTS[name], engine_for(LAYOUTS[name], Path(cache)))
                for name in args.layouts.split(",")]
        try:
            together(runs, args.full)
            for run in runs:
                if run.error:
                    print(f"\n{run.layout.name}: {run.error}")
                else:
                    fast_phase(run, args.variants)
        finally:
            for run in runs:
                run.engine.__exit__(None, None, None)
    if args.plain:
        run_plain(args.plain)
    print(f"\nbench took {time.monotonic() - started:.0f} s")


def together(runs: Sequence[Run], full: int) -> None:
    """Every layout's set-up and full builds at once: compiles on every core."""
    threads = [threading.Thread(target=set_up, args=(run,)) for run in runs]
    if full:
        threads += [threading.Thread(target=full_builds, args=(run, full)) for run in runs]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()


if __name__ == "__main__":
    main()
