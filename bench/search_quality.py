"""Search quality: params + rules (no LLM) against an exhaustive sweep and Kernel Tuner.

For each fixture kernel, in one run on one GPU:

1. the exhaustive sweep: every point of the kernel's tunables (capped), each built,
   verified and benchmarked by kfbot's engine: the optimum over the params alone;
2. kfbot's search (params + rules mutators, no LLM) with a 64-evaluation budget, once
   per seed; the best speedup after 16, 32 and 64 evaluations is read off each run's
   history and the median over the seeds is reported;
3. Kernel Tuner's strategies in simulation mode over a cache file filled with the
   sweep's own measurements (so both see the same timings), with the same budgets.

Targets: at least 95% of the exhaustive optimum within 32 evaluations, and at least
Kernel Tuner's result at equal budget. Exit 0 when every target passes, 1 otherwise,
3 without a CUDA GPU.

With `--naive`, the naive-kernel section instead (bench/naive_kernels.py): `kfbot
optimize --no-llm` with at most 32 evaluations on one naive fixture per kernel class,
each result reproduced by `kfbot reproduce` and printed beside the fixture's best
hand-written version; target: a geometric mean of the reproduced speedups of at least 5x.

    python bench/search_quality.py [--kernels softmax,gelu] [--seeds 3] [--quick]
    python bench/search_quality.py --naive [--kernels softmax,matmul] [--budget 32]
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import json
import shutil
import statistics
import sys
import tempfile
import warnings
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import git
from rich.console import Console
from rich.table import Table

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

import naive_kernels  # noqa: E402

from kfbot.cache import cache_dir  # noqa: E402
from kfbot.config import load_config  # noqa: E402
from kfbot.errors import EXIT_MISSING_TOOL, KfbotError  # noqa: E402
from kfbot.evaluate.candidate import ORIGINAL, Candidate  # noqa: E402
from kfbot.evaluate.engine import Engine, EngineSettings  # noqa: E402
from kfbot.evaluate.evaluation import Evaluation  # noqa: E402
from kfbot.evaluate.task import KernelTask, make_task  # noqa: E402
from kfbot.scan.scanner import scan  # noqa: E402
from kfbot.scan.select import select_kernel  # noqa: E402
from kfbot.search.archive import Individual  # noqa: E402
from kfbot.search.params import Knob, apply_point, knobs, space_size  # noqa: E402
from kfbot.search.plan import OptimizeSettings  # noqa: E402
from kfbot.search.runner import optimize  # noqa: E402

EXIT_OK, EXIT_FAIL, EXIT_NO_GPU = 0, 1, 3
BUDGETS = (16, 32, 64)
QUICK_BUDGETS = (4, 8)
SWEEP_CAP = 256
TARGET_FRACTION = 0.95  # of the exhaustive optimum, within the middle budget
TARGET_BUDGET = 32
STRATEGIES = ("random_sample", "genetic_algorithm", "bayes_opt")


@dataclass(frozen=True)
class Bench:
    key: str  # the --kernels name
    repo: str  # fixture folder under the repository root
    kernel: str
    what: str  # the kind of kernel, for the "gets faster" lines


BENCHES = (
    Bench("softmax", "fixtures/example", "softmax_kernel", "naive softmax"),
    Bench("matmul_tiled", "fixtures/tunables_matmul", "matmul_tiled", "naive tiled matmul"),
    Bench("gelu", "fixtures/load_elementwise", "gelu_kernel", "elementwise (GELU)"),
    Bench("saxpy", "fixtures/example", "saxpy_kernel", "elementwise (saxpy)"),
    Bench("matmul", "fixtures/example", "matmul_kernel", "naive tiled matmul (example)"),
)


# --- the GPU-free parts ---------------------------------------------------------------


def pick(names: str | None, quick: bool) -> list[Bench]:
    """The benches named on the command line (comma-separated keys), in table order."""
    if names is None:
        return [BENCHES[0]] if quick else list(BENCHES)
    wanted = [n.strip() for n in names.split(",") if n.strip()]
    known = {b.key: b for b in BENCHES}
    unknown = [n for n in wanted if n not in known]
    if unknown:
        raise SystemExit(f"search_quality: unknown kernel(s) {', '.join(unknown)}; "
                         f"known: {', '.join(known)}")
    return [known[n] for n in wanted]


def load_task(root: Path, bench: Bench) -> KernelTask:
    """The kernel's task, scanned from the fixture folder at `root` (no GPU needed)."""
    config = load_config(None, root)
    return make_task(select_kernel(scan(root, config).kernels, bench.kernel), root, config)


def sweep_points(ks: Sequence[Knob], cap: int = SWEEP_CAP) -> tuple[list[dict[str, str]], bool]:
    """Every point of the knobs' product in a fixed order, at most `cap`; and whether capped."""
    grid = itertools.product(*(k.choices for k in ks))
    points = [dict(zip((k.name for k in ks), p, strict=True))
              for p in itertools.islice(grid, cap)]
    return points, space_size(ks) > cap


def point_key(ks: Sequence[Knob], point: Mapping[str, str]) -> tuple[str, ...]:
    return tuple(point[k.name] for k in ks)


def best_after(history: Iterable[Individual], budgets: Sequence[int]) -> dict[int, float]:
    """The best speedup among the first N evaluations, for each N; the original counts 1.0."""
    done = [(i.step, i.fitness) for i in history if i.fitness is not None]
    return {n: max([1.0, *(f for s, f in done if s <= n)]) for n in budgets}


def median_by_budget(runs: Sequence[Mapping[int, float]], budgets: Sequence[int]
                     ) -> dict[int, float]:
    return {n: statistics.median(r[n] for r in runs) for n in budgets if runs}


def percent_of(found: float | None, optimum: float | None) -> float | None:
    if found is None or optimum is None or optimum <= 0:
        return None
    return 100.0 * found / optimum


def safe_name(name: str) -> str:
    """A Kernel Tuner parameter name: identifiers only (knob names may hold ':')."""
    out = "".join(c if c.isalnum() or c == "_" else "_" for c in name)
    return out if out and not out[0].isdigit() else f"p_{out}"


def kt_params(ks: Sequence[Knob]) -> dict[str, list[int]]:
    """The knobs as Kernel Tuner tunables, in the knobs' order (the cache keys follow it)."""
    return {safe_name(k.name): [int(c) for c in k.choices] for k in ks}


def kt_cache(kernel: str, ks: Sequence[Knob],
             speedups: Mapping[tuple[str, ...], float | None]) -> dict[str, Any]:
    """A Kernel Tuner cache file holding kfbot's sweep measurements.

    `time` is the point's time in units of the original's (1 / speedup): Kernel Tuner
    minimises it exactly as kfbot maximises the speedup. A point that failed to build,
    verify or benchmark (speedup None) is a failed configuration to Kernel Tuner too."""
    params = kt_params(ks)
    names = list(params)
    cache: dict[str, dict[str, Any]] = {}
    for key, speedup in speedups.items():
        values = [int(v) for v in key]
        record: dict[str, Any] = dict(zip(names, values, strict=True))
        if speedup is None or speedup <= 0:
            record["time"] = "RuntimeFailedConfig"
        else:
            record["time"] = 1.0 / speedup
            record["times"] = [1.0 / speedup]
        record.update(compile_time=0.0, verification_time=0.0, benchmark_time=0.0)
        cache[",".join(str(v) for v in values)] = record
    return {"device_name": "kfbot sweep", "kernel_name": kernel, "problem_size": [1],
            "tune_params_keys": names, "tune_params": params, "objective": "time",
            "cache": cache}


def kt_best(results: Sequence[Mapping[str, Any] | None], names: Sequence[str],
            budget: int) -> float:
    """The best speedup among the first `budget` distinct configurations Kernel Tuner
    tried (it also returns repeats served from its cache, which cost nothing)."""
    seen: set[tuple[Any, ...]] = set()
    best = 0.0
    for r in results:
        if r is None:
            continue
        key = tuple(r.get(n) for n in names)
        if key in seen:
            continue
        if len(seen) == budget:
            break
        seen.add(key)
        t = r.get("time")
        if "__error__" not in r and isinstance(t, (int, float)) and t > 0:
            best = max(best, 1.0 / float(t))
    return best


def kernel_tuner_version() -> str | None:
    try:
        import kernel_tuner
    except ImportError:
        return None
    return str(getattr(kernel_tuner, "__version__", "unknown version"))


def simulate(cache: Mapping[str, Any], budgets: Sequence[int], seeds: Sequence[int],
             strategies: Sequence[str] = STRATEGIES, workdir: Path | None = None
             ) -> dict[str, dict[int, float]]:
    """Each strategy's median (over seeds) best speedup at each budget, in simulation mode.

    One tuning run per budget: some strategies size themselves by the budget."""
    from kernel_tuner import tune_kernel

    names = list(cache["tune_params_keys"])
    with tempfile.TemporaryDirectory(prefix="kfbot-kt-", dir=workdir) as tmp:
        path = Path(tmp) / "cache.json"
        path.write_text(json.dumps(cache))
        source = f"__global__ void {cache['kernel_name']}() {{}}"
        out: dict[str, dict[int, float]] = {}
        for strategy in strategies:
            try:
                out[strategy] = {n: statistics.median(
                    kt_best(_tune(tune_kernel, cache, source, str(path), strategy, n, seed),
                            names, n) for seed in seeds) for n in budgets}
            except ValueError as exc:  # bayes_opt: "Can't sample more than the size of
                # the search space" where the space is smaller than its initial sample
                print(f"  Kernel Tuner {strategy} skipped: {exc}")
    return out


def _tune(tune_kernel: Any, cache: Mapping[str, Any], source: str, path: str, strategy: str,
          budget: int, seed: int) -> list[Any]:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        results, _ = tune_kernel(
            cache["kernel_name"], source, 1, [], dict(cache["tune_params"]), cache=path,
            simulation_mode=True, strategy=strategy, strategy_options={"max_fevals": budget},
            quiet=True, seed=seed)
    return list(results)


@dataclass
class Row:
    label: str
    what: str
    space: int
    swept: int
    capped: bool
    original_us: float | None = None
    found: dict[int, float] = field(default_factory=dict)  # kfbot, median over seeds
    optimum: float | None = None
    optimum_point: str = ""
    kt: dict[str, dict[int, float]] | None = None  # per strategy; None: not installed
    best_change: str = ""
    error: str = ""

    def kt_best(self, n: int) -> tuple[float, str] | None:
        """The strongest Kernel Tuner strategy at budget n (chosen after the fact)."""
        if not self.kt:
            return None
        strategy = max(self.kt, key=lambda s: self.kt[s].get(n, 0.0) if self.kt else 0.0)
        return self.kt[strategy].get(n, 0.0), strategy

    def optimum_target(self, budget: int) -> bool | None:
        pct = percent_of(self.found.get(budget), self.optimum)
        return None if pct is None else pct >= 100.0 * TARGET_FRACTION

    def kt_target(self, budgets: Sequence[int], tolerance: float) -> bool | None:
        """kfbot at least Kernel Tuner's best at every budget, within the timing noise."""
        if not self.kt or not self.found:
            return None
        return all(self.found[n] >= (1.0 - tolerance) * (self.kt_best(n) or (0.0, ""))[0]
                   for n in budgets)


def _x(v: float | None) -> str:
    return "-" if v is None else f"{v:.2f}x"


def _verdict(ok: bool | None) -> str:
    return {True: "[green]PASS[/]", False: "[red]FAIL[/]", None: "[yellow]n/a[/]"}[ok]


def _kt_cell(row: Row, n: int) -> str:
    if row.kt is None:
        return "not installed"
    best = row.kt_best(n)
    return "-" if best is None else f"{best[0]:.2f}x {best[1]}"


def table(rows: Sequence[Row], budgets: Sequence[int], tolerance: float) -> Table:
    middle = budgets[len(budgets) // 2] if len(budgets) > 2 else budgets[-1]
    t = Table(title="search quality: kfbot params + rules (no LLM) vs exhaustive sweep "
                    "and Kernel Tuner")
    t.add_column("kernel")
    t.add_column("original")
    for n in budgets:
        t.add_column(f"kfbot @{n}", justify="right")
    t.add_column("exhaustive optimum (params only)")
    for n in budgets:
        t.add_column(f"Kernel Tuner @{n}", justify="right")
    t.add_column(f"% of optimum @{middle}", justify="right")
    t.add_column(f">= {TARGET_FRACTION:.0%} @{middle}")
    t.add_column(">= Kernel Tuner")
    for r in rows:
        if r.error:
            t.add_row(r.label, f"[red]{r.error}[/]", *[""] * (2 * len(budgets) + 4))
            continue
        pct = percent_of(r.found.get(middle), r.optimum)
        space = f"{r.swept}/{r.space} points{' (capped)' if r.capped else ''}"
        kts = [_kt_cell(r, n) for n in budgets]
        t.add_row(
            r.label,
            "-" if r.original_us is None else f"{r.original_us:.1f} us",
            *[_x(r.found.get(n)) for n in budgets],
            f"{_x(r.optimum)} at {r.optimum_point or '-'}; {space}",
            *kts,
            "-" if pct is None else f"{pct:.0f}%",
            _verdict(r.optimum_target(middle)),
            _verdict(r.kt_target(budgets, tolerance)),
        )
    return t


def summary(rows: Sequence[Row], budgets: Sequence[int], tolerance: float
            ) -> tuple[list[str], bool]:
    """One line per target and the 'gets faster' lines; and whether every target passed."""
    middle = budgets[len(budgets) // 2] if len(budgets) > 2 else budgets[-1]
    good = [r for r in rows if not r.error]
    opt = [r.optimum_target(middle) for r in good]
    kt = [r.kt_target(budgets, tolerance) for r in good]
    lines = [
        f"target >= {TARGET_FRACTION:.0%} of the exhaustive optimum within {middle} "
        f"evaluations: {sum(o is True for o in opt)}/{len(good)} kernels -> "
        f"{'PASS' if good and all(o is True for o in opt) else 'FAIL'}",
        f"target >= Kernel Tuner at equal budget (within {tolerance:.0%} timing noise): "
        + (f"{sum(k is True for k in kt)}/{len(good)} kernels -> "
           f"{'PASS' if good and all(k is True for k in kt) else 'FAIL'}"
           if any(k is not None for k in kt) else "Kernel Tuner not installed -> n/a"),
    ]
    last = budgets[-1]
    for r in good:
        got = r.found.get(last)
        lines.append(f"{r.label} ({r.what}): "
                     + (f"{got:.2f}x faster after {last} evaluations, params + rules alone"
                        f"{'; best change: ' + r.best_change if r.best_change else ''}"
                        if got is not None and got > 1.0 else "no faster version found"))
    lines += [f"{r.label}: {r.error}" for r in rows if r.error]
    passed = bool(good) and len(good) == len(rows) and all(o is True for o in opt) \
        and all(k is not False for k in kt)
    return lines, passed


NOTES = (
    "notes: kfbot's numbers are the median over the seeds of the best speedup among the "
    "first N evaluations of one run per seed (geometric mean over the benchmark shapes).",
    "  kfbot's search space is larger than the params space: the rules mutator also "
    "rewrites the source (__restrict__, __launch_bounds__, unrolling, vectorized loads, "
    "fast-math flags), so it can beat the exhaustive optimum, which is over the params only.",
    "  Kernel Tuner ran in simulation mode on kfbot's own sweep measurements (same timings "
    "for both); per budget the strongest of its strategies is shown, median over the seeds.",
    "  Where the params space is smaller than a budget, an exhaustive sweep fits in the "
    "budget and Kernel Tuner reaches the params optimum by construction.",
)


# --- the GPU parts --------------------------------------------------------------------


def gpu_missing() -> str | None:
    """Why there is no usable CUDA GPU here, or None."""
    try:
        import torch
    except ImportError:
        return "torch is not installed"
    if not torch.cuda.is_available():
        return "torch.cuda.is_available() is False"
    return None


def stage_fixture(bench: Bench, into: Path) -> Path:
    """A private git copy of the fixture: the search writes lessons and a winner's
    branch into its repository, which must never be this one."""
    dest = into / bench.key
    shutil.copytree(ROOT / bench.repo, dest, ignore=shutil.ignore_patterns(
        "build", "__pycache__", ".kfbot", "*.so"))
    repo = git.Repo.init(dest)
    with repo.config_writer() as cw:
        cw.set_value("user", "name", "search-quality bench")
        cw.set_value("user", "email", "bench@localhost")
    repo.git.add(A=True)
    repo.index.commit("fixture")
    return dest


def sweep(engine: Engine, task: KernelTask, ks: Sequence[Knob], points: Sequence[dict[str, str]]
          ) -> tuple[dict[tuple[str, ...], float | None], float | None]:
    """Each point's measured speedup (None: failed), and the original's time in us."""
    files = {rel: (task.root / rel).read_text(errors="replace") for rel in task.editable_files
             if (task.root / rel).is_file()}
    by_hash: dict[str, tuple[str, ...]] = {}
    cands: list[Candidate] = []
    out: dict[tuple[str, ...], float | None] = {}
    for p in points:
        cand = apply_point(ks, p, files, ORIGINAL)
        if cand is None:
            out[point_key(ks, p)] = None
            continue
        by_hash[cand.hash] = point_key(ks, p)
        cands.append(cand)
    original_us: float | None = None
    for cand, ev in engine.evaluate_many(cands):
        out[by_hash[cand.hash]] = ev.speedup if ev.ok else None
        if original_us is None and ev.timings:
            original_us = _original_us(ev)
    return out, original_us


def _original_us(ev: Evaluation) -> float:
    return statistics.geometric_mean([t.speedup.baseline.median for t in ev.timings])


def search(task: KernelTask, engine: Engine, seeds: Sequence[int], budgets: Sequence[int],
           work: Path) -> tuple[dict[int, float], str]:
    """kfbot's params + rules search, once per seed; the median best per budget."""
    runs: list[dict[int, float]] = []
    best_change, best = "", 0.0
    for seed in seeds:
        settings = OptimizeSettings(seed=seed, evaluations=max(budgets))
        outcome = optimize(task, engine, settings, work / f"run-seed{seed}", llm=None)
        runs.append(best_after(outcome.result.history, budgets))
        if outcome.best is not None and (outcome.best.speedup or 0.0) > best:
            best = outcome.best.speedup or 0.0
            best_change = outcome.best_candidate.rationale if outcome.best_candidate else ""
    return median_by_budget(runs, budgets), best_change


def measure(bench: Bench, args: argparse.Namespace, budgets: Sequence[int], work: Path) -> Row:
    root = stage_fixture(bench, work)
    task = load_task(root, bench)
    ks = knobs(task.tunables)
    points, capped = sweep_points(ks, args.cap)
    row = Row(f"{bench.kernel} ({bench.repo.split('/')[-1]})", bench.what, space_size(ks),
              len(points), capped)
    if not ks:
        row.error = "no tunables found"
        return row
    settings = EngineSettings(cache_dir=args.cache)
    with Engine(task, settings) as engine:
        base = engine.baseline()
        if not base.ok:
            row.error = f"the original fails its reference: {base.reason}"
            return row
        speedups, row.original_us = sweep(engine, task, ks, points)
        ok = {k: v for k, v in speedups.items() if v is not None}
        if ok:
            key = max(ok, key=lambda k: ok[k])
            row.optimum = ok[key]
            row.optimum_point = ", ".join(f"{k.name}={v}" for k, v in zip(ks, key, strict=True))
        row.found, row.best_change = search(task, engine, range(args.seeds), budgets,
                                            work / f"{bench.key}-runs")
    if kernel_tuner_version() is not None:
        row.kt = simulate(kt_cache(bench.kernel, ks, speedups), budgets, range(args.seeds),
                          workdir=work)
    return row


def parse(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--kernels", help=f"comma-separated subset of: "
                                     f"{', '.join(b.key for b in BENCHES)} (default: all)")
    p.add_argument("--seeds", type=int, default=3, help="search seeds per kernel (default 3)")
    p.add_argument("--quick", action="store_true",
                   help="smoke run: one kernel, budgets 4 and 8, one seed")
    p.add_argument("--cap", type=int, default=SWEEP_CAP,
                   help=f"most points in an exhaustive sweep (default {SWEEP_CAP})")
    p.add_argument("--tolerance", type=float, default=0.02,
                   help="timing noise allowed in the comparison with Kernel Tuner "
                        "(default 0.02: 2%%)")
    p.add_argument("--cache", type=Path, default=None,
                   help="kfbot build and input cache (default: kfbot's own, as for kfbot optimize)")
    p.add_argument("--json", type=Path, help="also write the rows and the verdict here")
    naive = p.add_argument_group("the naive-kernel section (--naive)")
    naive.add_argument("--naive", action="store_true",
                       help="kfbot optimize --no-llm on the naive fixtures, reproduced, beside "
                            f"hand-written versions (--kernels from: "
                            f"{', '.join(b.key for b in naive_kernels.NAIVE)}, all, or real "
                            "for the real-shaped ones; default: "
                            f"{','.join(naive_kernels.DEFAULT)}, one per class)")
    naive.add_argument("--budget", type=int, default=naive_kernels.MAX_BUDGET,
                       metavar="N", help=f"evaluations per kernel (at most "
                                         f"{naive_kernels.MAX_BUDGET}, the default)")
    naive.add_argument("--seed", type=int, default=0, help="the search's seed (default 0)")
    naive.add_argument("--keep", type=Path, default=None, metavar="DIR",
                       help="work in DIR and keep it: the runs' folders, with every "
                            "evaluation and its reason (default: a temporary folder)")
    args = p.parse_args(argv)
    if args.seeds < 1 or args.cap < 1:
        p.error("--seeds and --cap must be at least 1")
    if not 1 <= args.budget <= naive_kernels.MAX_BUDGET:
        p.error(f"--budget must be between 1 and {naive_kernels.MAX_BUDGET}")
    if args.quick and "--seeds" not in (argv if argv is not None else sys.argv[1:]):
        args.seeds = 1
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse(argv)
    if args.naive:
        naive_kernels.pick(args.kernels)  # a bad name is said before anything else
    else:
        benches = pick(args.kernels, args.quick)
    budgets = QUICK_BUDGETS if args.quick else BUDGETS
    # Wide whatever the terminal: the table has twelve columns, and a log or a batch
    # job's 80 columns would cut every figure to an ellipsis.
    console = Console(width=240)
    missing = gpu_missing()
    if missing:
        console.print(f"search_quality: needs a CUDA GPU: {missing}")
        return EXIT_NO_GPU
    if args.naive:
        return run_naive(args, console)
    version = kernel_tuner_version()
    console.print(f"Kernel Tuner: {version or 'not installed (its columns read not installed)'}")
    rows = []
    with tempfile.TemporaryDirectory(prefix="kfbot-search-quality-") as tmp:
        work = Path(tmp)
        if args.cache is None:
            args.cache = cache_dir()
        for bench in benches:
            console.print(f"[bold]{bench.kernel}[/] ({bench.repo}): sweep, "
                          f"{args.seeds} search run(s), Kernel Tuner ...")
            try:
                rows.append(measure(bench, args, budgets, work))
            except KfbotError as exc:
                if exc.exit_code == EXIT_MISSING_TOOL:
                    console.print(f"search_quality: needs a CUDA GPU: {exc}")
                    return EXIT_NO_GPU
                rows.append(Row(bench.kernel, bench.what, 0, 0, False, error=str(exc)))
            console.print(table(rows[-1:], budgets, args.tolerance))  # as each one ends
    console.print(table(rows, budgets, args.tolerance))
    lines, passed = summary(rows, budgets, args.tolerance)
    for line in [*lines, *NOTES]:
        console.print(line, highlight=False, markup=False)
    if args.json is not None:
        args.json.write_text(json.dumps({"budgets": list(budgets), "seeds": args.seeds,
                                         "kernel_tuner": version, "passed": passed,
                                         "summary": lines,
                                         "rows": [asdict(r) for r in rows]}, indent=1))
    return EXIT_OK if passed else EXIT_FAIL


def run_naive(args: argparse.Namespace, console: Console) -> int:
    """The naive-kernel section: each kernel's row as it ends, then the table and verdict."""
    benches = naive_kernels.pick(args.kernels)
    rows: list[naive_kernels.NaiveRow] = []
    with contextlib.ExitStack() as stack:
        tmp = str(args.keep) if args.keep is not None else stack.enter_context(
            tempfile.TemporaryDirectory(prefix="kfbot-naive-"))
        Path(tmp).mkdir(parents=True, exist_ok=True)
        for bench in benches:
            console.print(f"[bold]{bench.kernel}[/] ({bench.fixture}): optimize, reproduce, "
                          "hand-written ...")
            rows.append(naive_kernels.measure(bench, Path(tmp), args.budget, args.seed,
                                              None))
            console.print(naive_kernels.table(rows[-1:], args.budget))
            for problem in rows[-1].problems:
                console.print(f"  {bench.key}: {problem}", highlight=False, markup=False)
    console.print(naive_kernels.table(rows, args.budget))
    lines, passed = naive_kernels.summary(rows, args.budget)
    for line in lines:
        console.print(line, highlight=False, markup=False)
    if args.json is not None:
        args.json.write_text(json.dumps({
            "section": "naive", "budget": args.budget, "seed": args.seed,
            "passed": passed, "summary": lines,
            "rows": [{**asdict(r), "bench": asdict(r.bench)} for r in rows]}, indent=1))
    return EXIT_OK if passed else EXIT_FAIL


if __name__ == "__main__":
    sys.exit(main())
