"""How fast is `kfbot scan`? Times it on a generated repository against a `grep` floor.

The script writes a synthetic repository (bench/scan_tree.py: CUDA sources with
kernels, launchers and bindings, the pytest modules that test them, and the setup.py,
bindings and wrapper modules real packages have), then times:

* `grep -r __global__ TREE` -- the cost of merely reading every byte once (the floor);
* parsing alone: every file read and parsed (tree-sitter for C/C++/CUDA, `ast` for
  Python) in a pool of one process per core, nothing extracted or linked: what a scan
  cannot do without. The target: a first scan within twice this;
* `kfbot.scan.scanner.scan(TREE, Config(), jobs=J)` in this process, J = 1 and all cores;
* `python -m kfbot scan TREE --json --no-cache` as a subprocess, interpreter start-up
  included: every file read (a first scan);
* `python -m kfbot scan TREE --json`, the facts cache warm (a later scan: no file
  changed since the one before); its cache lives in a scratch folder.

The CLI is timed twice: first with kfbot's own modules compiled from source at every
start (as in a checkout run with PYTHONDONTWRITEBYTECODE; their .pyc files are kept out
of the way with PYTHONPYCACHEPREFIX), then after `python -m compileall` has compiled
them into the package, as `pip install` does.

Every figure is the best of `--repeat` runs with a warm page cache; all runs are shown.
Below the table, the in-process one-core scan is split into reading every file (walk,
parse, extract: the part a pool of workers shares) and linking, beside the CPU of
writing the JSON and of parsing alone in one process: what a pool cannot shorten gives
the least first scan these costs allow, as a multiple of parse only.
The targets: >= 2000 source files/s on a 2-core machine, and a first scan (the CLI,
`--no-cache`) within twice the time of parsing alone.

Run it from the repository root with the project's environment:

    .venv/bin/python bench/scan_speed.py            # 2,000 .cu + 2,000 .py files
    .venv/bin/python bench/scan_speed.py --cu 200 --py 200 --tree /tmp/kfb-small
"""

from __future__ import annotations

import argparse
import hashlib
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from kfbot.scan.model import ScanReport

from scan_tree import FILES_PER_FOLDER, TreeInfo, prepare_tree

TARGET_FILES_PER_S = 2000.0
TARGET_LINE = "target: >= 2000 source files/s on a 2-core machine"

# ---- timing -------------------------------------------------------------------------------


@dataclass
class Row:
    method: str
    runs: list[tuple[float, float]]  # (wall seconds, CPU seconds) per run
    counts: bool = True  # False: shown for context, no files/s figure

    @property
    def best(self) -> float:
        return min(wall for wall, _ in self.runs)

    @property
    def best_cpu(self) -> float:
        return min(self.runs)[1]


def cpu_seconds() -> float:
    """User + system CPU of this process and of the children it has waited for."""
    t = os.times()
    return t.user + t.system + t.children_user + t.children_system


def best_of(repeat: int, once: Callable[[], None]) -> list[tuple[float, float]]:
    runs = []
    for _ in range(repeat):
        cpu = cpu_seconds()
        started = time.perf_counter()
        once()
        runs.append((time.perf_counter() - started, cpu_seconds() - cpu))
    return runs


def load_average() -> str:
    try:
        return " ".join(f"{x:.2f}" for x in os.getloadavg())
    except OSError:
        return "unknown"


class RunFailed(Exception):
    """A timed command exited with an unexpected status."""


def run_quiet(cmd: Sequence[str], ok: Sequence[int] = (0,),
              env: dict[str, str] | None = None) -> None:
    done = subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                          check=False, env=env)
    if done.returncode not in ok:
        raise RunFailed(f"{' '.join(cmd)} exited {done.returncode}:\n{done.stderr.strip()}")


def cpu_model() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown CPU"


def usable_cores() -> int | None:
    affinity = getattr(os, "sched_getaffinity", None)
    return len(affinity(0)) if affinity else None


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="scan_speed.py",
        description="Time `kfbot scan` on a generated repository of CUDA sources and pytest "
                    "modules, against `grep -r __global__` as a floor. Prints a table of "
                    f"seconds and source files/s and checks the {TARGET_LINE[8:]} target.")
    dflt = " (default: %(default)s)"
    p.add_argument("--cu", type=int, default=2000, help=".cu files to generate" + dflt)
    p.add_argument("--py", type=int, default=2000, help="Python test modules to generate" + dflt)
    p.add_argument("--packages", type=int, default=40,
                   help="top-level packages the files are spread over, each nested in folders "
                        f"of {FILES_PER_FOLDER} files" + dflt)
    p.add_argument("--seed", type=int, default=1234, help="seed for the generated content" + dflt)
    p.add_argument("--tree", metavar="DIR",
                   help="generate the tree here, or reuse it if this script made it before "
                        "(default: a temporary folder, deleted afterwards)")
    p.add_argument("--repeat", type=int, default=3,
                   help="runs per method; the best is reported" + dflt)
    p.add_argument("--generate-only", action="store_true",
                   help="write the tree (needs --tree) and stop")
    args = p.parse_args(argv)
    if min(args.cu, args.py) < 0 or args.cu + args.py == 0:
        p.error("--cu and --py must be >= 0 and not both 0")
    if args.repeat < 1 or args.packages < 1:
        p.error("--repeat and --packages must be >= 1")
    if args.generate_only and not args.tree:
        p.error("--generate-only needs --tree")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="kfbot-scan-bench-") as scratch:
        info = prepare_tree(args, Path(scratch) / "repo")
        if args.generate_only:
            print(f"wrote {info.root}: {info.cu} .cu + {info.py} .py files, "
                  f"{info.kernels} kernels, {info.lines} lines")
            return 0
        return bench(info, args.repeat, Path(scratch) / "cache")


def say(text: str = "") -> None:
    print(text, flush=True)  # flushed, so a long run can be watched through a pipe or file


def sources_digest(package_dir: Path) -> str:
    """A short hash of the kfbot sources, to say which version was measured."""
    h = hashlib.sha256()
    for path in sorted(package_dir.rglob("*.py")):
        h.update(path.relative_to(package_dir).as_posix().encode())
        h.update(path.read_bytes())
    return h.hexdigest()[:12]


def uncompiled_env(package_dir: Path, prefix: Path, command: list[str]) -> dict[str, str]:
    """An environment in which kfbot's modules are compiled from source at every start,
    and every other module is read from its .pyc, as in a checkout.

    With PYTHONPYCACHEPREFIX, Python reads and writes .pyc files only under `prefix`:
    one untimed run of `command` fills it with those of every module the run imports,
    then kfbot's are deleted (and no run after it writes them again).
    """
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    env["PYTHONPYCACHEPREFIX"] = str(prefix)
    run_quiet(command, env=env)
    shutil.rmtree(prefix / package_dir.relative_to(package_dir.anchor), ignore_errors=True)
    return {**env, "PYTHONDONTWRITEBYTECODE": "1"}


class Table:
    WIDTH = 62

    def __init__(self, files: int) -> None:
        self.files = files
        self.rows: list[Row] = []
        self.failures: list[str] = []
        say(f"{'method':<{self.WIDTH}}  {'best s':>8}  {'files/s':>8}  {'cpu s':>8}  "
            "all runs (s)")

    def measure(self, method: str, repeat: int, once: Callable[[], None],
                counts: bool = True) -> Row | None:
        try:
            row = Row(method, best_of(repeat, once), counts)
        except RunFailed as exc:
            say(f"{method:<{self.WIDTH}}  FAILED (see below)")
            self.failures.append(str(exc))
            return None
        per_s = f"{self.files / row.best:8.0f}" if counts else f"{'-':>8}"
        runs = " ".join(f"{wall:.3f}" for wall, _ in row.runs)
        say(f"{method:<{self.WIDTH}}  {row.best:8.3f}  {per_s}  {row.best_cpu:8.3f}  {runs}")
        self.rows.append(row)
        return row


def _parse_files(paths: list[str]) -> int:
    """Read and parse `paths` as the scan's extractors do, and nothing else."""
    import ast

    from kfbot.scan.files import source_kind
    from kfbot.scan.treesitter import parse_cuda

    for path in paths:
        with open(path, "rb") as f:
            data = f.read()
        if source_kind(path) == "cuda":
            parse_cuda(data)
        elif path.endswith(".py"):
            ast.parse(data)
    return len(paths)


def parse_only(root: Path, jobs: int) -> None:
    """Every source file parsed in a fork pool of `jobs` processes, in batches as the
    scan hands them out."""
    import multiprocessing

    from kfbot.scan.files import source_kind

    paths = sorted(str(p) for p in root.rglob("*") if p.is_file() and source_kind(p.name))
    batches = [paths[i:i + 64] for i in range(0, len(paths), 64)]
    with multiprocessing.get_context("fork").Pool(jobs) as pool:
        assert sum(pool.map(_parse_files, batches)) == len(paths)


class Phases:
    """Where a first scan's time goes, in CPU seconds of runs in this process on one core
    (less disturbed by other load than wall time): reading the files (walk, parse,
    extract: what a pool of workers shares), linking them into kernels and writing the
    JSON (both in one process, after the last file is read), and parsing alone. What a
    pool cannot shorten sets the least time a first scan takes."""

    def __init__(self) -> None:
        self.read: list[float] = []  # walk + parse + extract, seconds per run
        self.link: list[float] = []  # the last file's facts in, to the report returned
        self.json: list[float] = []
        self.parse: list[float] = []
        self.report_made: ScanReport | None = None

    def scan(self, root: Path, jobs: int) -> ScanReport:
        from kfbot.config import Config
        from kfbot.scan.scanner import scan

        last = [0.0]

        def progress(done: int, total: int) -> None:
            last[0] = time.process_time()

        started = time.process_time()
        report = scan(root, Config(), progress=progress, jobs=jobs)
        ended = time.process_time()
        self.read.append(last[0] - started)
        self.link.append(ended - last[0])
        self.report_made = report
        return report

    def measure_rest(self, root: Path, repeat: int) -> None:
        from kfbot.scan.files import source_kind
        from kfbot.scan.show.render import write_json

        paths = sorted(str(p) for p in root.rglob("*") if p.is_file() and source_kind(p.name))
        for _ in range(repeat):
            started = time.process_time()
            _parse_files(paths)
            self.parse.append(time.process_time() - started)
            if self.report_made is not None:
                with open(os.devnull, "w", encoding="utf-8") as out:
                    started = time.process_time()
                    write_json(self.report_made, out)
                    self.json.append(time.process_time() - started)

    def report(self, parsing: Row | None, start: Row | None, cores: int) -> None:
        if not (self.read and self.parse and self.json) or parsing is None or start is None:
            say("  (no breakdown of the first scan: a run it needs failed)")
            return
        read, link, out, parse = (min(x) for x in (self.read, self.link, self.json,
                                                   self.parse))
        from kfbot.scan.show.render import FORK_KERNELS

        # A large report's JSON is written half by a forked child, half by the scan.
        forked = self.report_made is not None and len(self.report_made.kernels) >= FORK_KERNELS
        serial = link + (out / 2 if forked else out) + start.best_cpu
        floor = read / cores + serial
        ideal = parse / cores  # parse only, shared by the cores at no cost
        half = " (half forked)" if forked else ""
        say(f"  first scan, where the time goes (CPU s, one core): reading every file "
            f"{read:.2f} s = {read / parse:.2f}x parsing alone ({parse:.2f} s); then, in one "
            f"process, linking {link:.2f} s, JSON {out:.2f} s{half}, "
            f"start-up {start.best_cpu:.2f} s")
        say(f"  least first scan those allow on {cores} cores: {read:.2f}/{cores} + "
            f"{serial:.2f} = {floor:.2f} s = {floor / ideal:.2f}x parse only shared alike "
            f"({parse:.2f}/{cores} s; measured with its pool: {parsing.best:.2f} s wall)")


def bench(info: TreeInfo, repeat: int, scratch_cache: Path) -> int:
    # Imported here so that --help and --generate-only work while kfbot is half-written.
    import kfbot
    from kfbot.config import Config
    from kfbot.scan.scanner import scan

    package_dir = Path(kfbot.__file__).parent
    digest = sources_digest(package_dir)
    cores = os.cpu_count() or 1
    tree = str(info.root)
    say("kfbot scan speed")
    say(f"machine: {platform.platform()} ({platform.machine()}), {cpu_model()}")
    say(f"os.cpu_count(): {os.cpu_count()}, usable by this process: {usable_cores()}")
    say(f"python: {platform.python_implementation()} {platform.python_version()} "
        f"({sys.executable})")
    say(f"kfbot: {kfbot.__version__} from {package_dir}, sources sha256 {digest}")
    made = (f"generated in {info.generated_s:.2f} s" if info.generated_s is not None
            else "reused")
    say(f"tree: {tree} ({made}): {info.cu} .cu + {info.py} .py = {info.files} source files, "
        f"{info.lines:,} lines, {info.bytes / 1e6:.1f} MB, {info.kernels} kernels")
    for note in info.notes:
        say(f"note: {note}")
    say(f"each figure: best of {repeat} runs, warm page cache; "
        f"load average before the runs: {load_average()}")
    say()

    table = Table(info.files)
    grep = shutil.which("grep")
    if grep:
        # grep exits 1 when nothing matches, which would still be a valid timing.
        table.measure("grep -r __global__ (floor)",
                      repeat, lambda: run_quiet([grep, "-r", "__global__", tree], ok=(0, 1)))
    else:
        say("(grep not found: no floor)")

    parsing = table.measure(f"parse only: tree-sitter + ast, {cores} processes (floor)",
                            repeat, lambda: parse_only(info.root, cores))

    found: dict[int, tuple[int, int]] = {}
    phases = Phases()
    scans: list[Row] = []
    for jobs in sorted({1, cores}):
        def once(jobs: int = jobs) -> None:
            report = phases.scan(info.root, jobs) if jobs == 1 else \
                scan(info.root, Config(), jobs=jobs)
            found[jobs] = (len(report.kernels), report.files_scanned)
        row = table.measure(f"kfbot scan(), in-process, jobs={jobs}", repeat, once)
        if row:
            scans.append(row)

    cold = [sys.executable, "-m", "kfbot", "scan", tree, "--json", "--no-cache"]
    source_env = uncompiled_env(package_dir, scratch_cache.parent / "pycache", cold)
    cold_row = table.measure(f"kfbot CLI `scan --json --no-cache` (jobs={cores}), incl. start-up",
                             repeat, lambda: run_quiet(cold, env=source_env))
    # The warm scan's cache lives in a scratch folder: one scan fills it, not timed.
    cache_env = {**source_env, "KFBOT_CACHE": str(scratch_cache)}
    warm = [sys.executable, "-m", "kfbot", "scan", tree, "--json"]
    run_quiet(warm, env=cache_env)
    warm_row = table.measure("kfbot CLI `scan --json`, facts cache warm, incl. start-up",
                             repeat, lambda: run_quiet(warm, env=cache_env))
    # `kfbot --help` imports every command; `kfbot scan --help` what a scan needs.
    start = [sys.executable, "-m", "kfbot", "scan", "--help"]
    table.measure("  of which start-up: `-m kfbot scan --help`", repeat,
                  lambda: run_quiet(start, env=source_env), counts=False)
    say(f"(byte-compiling {package_dir} with `python -m compileall`, as `pip install` does)")
    run_quiet([sys.executable, "-m", "compileall", "-q", str(package_dir)])
    compiled_row = table.measure("kfbot CLI `scan --json --no-cache`, kfbot byte-compiled",
                                 repeat, lambda: run_quiet(cold))
    table.measure("  of which start-up, kfbot byte-compiled", repeat,
                  lambda: run_quiet(start), counts=False)
    say("(cpu s: user+system CPU of the best run, this process and its waited-for children; "
        "a jobs=1 wall time well above it means other load on the machine)")
    phases.measure_rest(info.root, repeat)
    say(f"load average after the runs: {load_average()}")
    if sources_digest(package_dir) != digest:
        say(f"WARNING: the kfbot sources changed during the run (sha256 was {digest}); "
            "the CLI runs may have measured different code from the in-process ones")
    say()

    for jobs, (kernels, files) in sorted(found.items()):
        verdict = "as expected" if kernels == info.kernels else f"EXPECTED {info.kernels}"
        say(f"in-process jobs={jobs}: {kernels} kernels found ({verdict}), "
            f"{files} files scanned (generated {info.files})")
    say()

    say(TARGET_LINE + ("" if cores == 2 else f" (this machine has {cores} cores)"))
    best = min(scans, key=lambda r: r.best) if scans else None
    for label, r in (("best in-process", best), ("CLI, first scan", cold_row),
                     ("CLI, compiled", compiled_row), ("CLI, cache warm", warm_row)):
        if r is None:
            say(f"  {label:<18} no figure (failed)  FAIL")
            continue
        per_s = info.files / r.best
        verdict = "PASS" if per_s >= TARGET_FILES_PER_S else "FAIL"
        say(f"  {label:<18} {per_s:7.0f} files/s  {verdict}   ({r.method.strip()})")

    if parsing is not None and cold_row is not None:
        ratio = cold_row.best / parsing.best
        say(f"  first scan / parse only: {ratio:.2f}x (target <= 2.00x)  "
            f"{'PASS' if ratio <= 2.0 else 'FAIL'}   (byte-compiled: "
            f"{(compiled_row.best if compiled_row else float('nan')) / parsing.best:.2f}x)")

    start_row = next((r for r in table.rows if r.method.startswith("  of which start-up: ")),
                     None)
    phases.report(parsing, start_row, cores)

    status = 0
    for failure in table.failures:
        print(f"\nscan_speed: {failure}", file=sys.stderr)
        status = 1
    if not any(kernels for kernels, _ in found.values()):
        print("scan_speed: the in-process scan found no kernels; the timings are meaningless",
              file=sys.stderr)
        status = 1
    return status


if __name__ == "__main__":
    sys.exit(main())
