"""The naive-kernel section of bench/search_quality.py (`--naive`): structural speedups
without an LLM, reproduced, beside the best hand-written versions.

For each naive fixture kernel (fixtures/naive_*, one repository per kernel class), in one
run on one GPU, each step the command a user would type, on a private git copy:

1. `kfbot optimize <kernel> --no-llm --budget N` (N at most 32): the reported
   speedup of its best candidate (report.json), and the change that made it;
2. `kfbot reproduce <run folder> --json`: the committed patch re-timed against the
   original in a fresh worker with an independent timer;
3. `kfbot bench <kernel> --candidate <hand-written version> --json`: the fixture's
   `hand/<kernel>.cu` in place of the kernel's file, timed the same way as the search's
   candidates.

Target: the geometric mean of the reproduced speedups over the kernels is at least 5x.
Exit 0 when it is met, 1 when not (or when nothing could be reproduced), 3 without a
CUDA GPU.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import subprocess
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rich.table import Table

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from kfbot import git  # noqa: E402
from kfbot.search.experience import DEFAULT_PATH, read_lessons  # noqa: E402

TARGET = 5.0
MAX_BUDGET = 32
OPTIMIZE_TIMEOUT_S = 3600
STEP_TIMEOUT_S = 1200


@dataclass(frozen=True)
class NaiveBench:
    key: str  # the --kernels name
    fixture: str  # folder under fixtures/
    kernel: str
    file: str  # the kernel's file, which hand/<kernel>.cu replaces
    kind: str  # its class in the expert library


NAIVE = (
    NaiveBench("softmax", "naive_rows", "softmax_kernel", "csrc/softmax.cu", "row-reduction"),
    NaiveBench("log_softmax", "naive_rows", "log_softmax_kernel", "csrc/log_softmax.cu",
               "row-reduction"),
    NaiveBench("layer_norm", "naive_rows", "layer_norm_kernel", "csrc/layer_norm.cu",
               "row-reduction"),
    NaiveBench("rms_norm", "naive_rows", "rms_norm_kernel", "csrc/rms_norm.cu",
               "row-reduction"),
    NaiveBench("row_mean", "naive_rows", "row_mean_kernel", "csrc/row_reduce.cu",
               "row-reduction"),
    NaiveBench("row_max", "naive_rows", "row_max_kernel", "csrc/row_reduce.cu",
               "row-reduction"),
    NaiveBench("gelu", "naive_elementwise", "gelu_kernel", "csrc/gelu.cu", "elementwise"),
    NaiveBench("silu", "naive_elementwise", "silu_kernel", "csrc/silu.cu", "elementwise"),
    NaiveBench("matmul", "naive_matmul", "matmul_kernel", "csrc/matmul.cu", "matmul"),
    NaiveBench("transpose", "naive_transpose", "transpose_kernel", "csrc/transpose.cu",
               "transpose"),
    # Written as teaching repositories write them (fixtures/naive_real): helpers, a
    # conditional block size in the launcher, several kernels a file, templates.
    NaiveBench("real_softmax", "naive_real", "softmax_block_kernel", "csrc/softmax.cu",
               "row-reduction"),
    NaiveBench("real_layernorm", "naive_real", "layernorm_kernel", "csrc/layernorm.cu",
               "row-reduction"),
    NaiveBench("real_row_sum", "naive_real", "row_sum_kernel", "csrc/reduce.cu",
               "row-reduction"),
    NaiveBench("real_blur", "naive_real", "blur_rows_kernel", "csrc/stencil.cu", "elementwise"),
)


@dataclass
class NaiveRow:
    bench: NaiveBench
    original_us: float | None = None  # geometric mean over the timed shapes
    reported: float | None = None
    reproduced: float | None = None
    hand: float | None = None
    change: str = ""
    problems: list[str] = field(default_factory=list)

    @property
    def counted(self) -> float | None:
        """The speedup the target counts: the reproduced one."""
        return self.reproduced


# --- the GPU-free parts ---------------------------------------------------------------


# One naive kernel per class: the default set the target is measured on. The
# elementwise class's naive kernel is the GELU that walks a row per thread; SiLU, one
# coalesced element per thread, is already near the memory bound (about 1.5x is left in
# its instructions) and is timed only when named.
DEFAULT = ("softmax", "gelu", "matmul", "transpose")
# `--kernels real`: the kernels in real repositories' shapes, against their own target.
REAL = ("real_softmax", "real_layernorm", "real_row_sum", "real_blur")
REAL_TARGET = 3.0


def pick(names: str | None) -> list[NaiveBench]:
    """The named kernels; none named: one per class (DEFAULT); `all`: every one."""
    if names is not None and names.strip() == "real":
        return [b for b in NAIVE if b.key in REAL]
    if names is None or names.strip() == "all":
        wanted_keys = DEFAULT if names is None else tuple(b.key for b in NAIVE)
        return [b for b in NAIVE if b.key in wanted_keys]
    wanted = [n.strip() for n in names.split(",") if n.strip()]
    known = {b.key: b for b in NAIVE}
    unknown = [n for n in wanted if n not in known]
    if unknown:
        raise SystemExit(f"search_quality --naive: unknown kernel(s) {', '.join(unknown)}; "
                         f"known: {', '.join(known)}")
    return [known[n] for n in wanted]


def geomean(values: Sequence[float | None]) -> float | None:
    """The geometric mean of the values, or None when any is missing or not positive."""
    if not values or any(v is None or v <= 0 for v in values):
        return None
    return math.exp(sum(math.log(v) for v in values if v is not None) / len(values))


def reported_speedup(report: dict[str, Any]) -> tuple[float | None, float | None]:
    """(speedup, the original's geometric-mean time in us) of a run's report.json."""
    best = report.get("best") or {}
    timings = best.get("timings") or []
    original = geomean([t.get("original_median_us") for t in timings])
    speedup = best.get("speedup")
    return (float(speedup) if isinstance(speedup, (int, float)) else None), original


def reproduced_speedup(answer: dict[str, Any]) -> float | None:
    """The reproduced geometric-mean speedup of `kfbot reproduce --json`."""
    value = (answer.get("speedup") or {}).get("reproduced")
    return float(value) if isinstance(value, (int, float)) else None


def _reproduced(out: str) -> float | None:
    try:
        return reproduced_speedup(json.loads(out))
    except (json.JSONDecodeError, AttributeError):
        return None


def bench_speedup(answer: dict[str, Any]) -> tuple[float | None, str]:
    """(speedup, why not) of `kfbot bench --json` for a hand-written candidate."""
    if not answer.get("ok"):
        return None, f"{answer.get('stage')}: {answer.get('reason')}"
    value = answer.get("speedup")
    return (float(value) if isinstance(value, (int, float)) else None), ""


def target_of(rows: Sequence[NaiveRow]) -> float:
    """The real-shaped kernels alone answer to their own target; any other set to 5x."""
    real = bool(rows) and all(r.bench.key in REAL for r in rows)
    return REAL_TARGET if real else TARGET


def summary(rows: Sequence[NaiveRow], budget: int) -> tuple[list[str], bool]:
    """The verdict lines and whether the target is met."""
    target = target_of(rows)
    counted = [r.counted for r in rows]
    mean = geomean(counted)
    reported = geomean([r.reported for r in rows])
    hand = geomean([r.hand for r in rows])
    lines = [
        f"naive kernels: kfbot optimize --no-llm, {budget} evaluations, {len(rows)} kernels",
        f"  geometric mean reported:   {_x(reported)}",
        f"  geometric mean reproduced: {_x(mean)} (target >= {target:g}x) -> "
        + ("PASS" if mean is not None and mean >= target else
           "FAIL" if mean is not None else "n/a: not every kernel was reproduced"),
        f"  geometric mean hand-written: {_x(hand)}",
    ]
    for row in rows:
        lines += [f"  {row.bench.key}: {p}" for p in row.problems]
    return lines, mean is not None and mean >= target


def table(rows: Sequence[NaiveRow], budget: int) -> Table:
    t = Table(title=f"naive kernels: kfbot optimize --no-llm ({budget} evaluations), "
                    "reproduced, beside the hand-written versions")
    for name in ("kernel", "class", "original", f"kfbot @{budget} (reported)",
                 "reproduced", "hand-written", "kfbot / hand", "kfbot's change"):
        t.add_column(name, justify="left" if name in ("kernel", "class", "kfbot's change")
                     else "right")
    for r in rows:
        ratio = r.reproduced / r.hand if r.reproduced and r.hand else None
        t.add_row(f"{r.bench.kernel} ({r.bench.fixture})", r.bench.kind,
                  "-" if r.original_us is None else f"{r.original_us:.1f} us",
                  _x(r.reported), _x(r.reproduced), _x(r.hand),
                  "-" if ratio is None else f"{ratio:.2f}", r.change or "-")
    return t


def _x(v: float | None) -> str:
    return "-" if v is None else f"{v:.2f}x"


def best_change(root: Path, kernel: str) -> str:
    """What the run's best candidate changed, from the lesson the run appended, else
    from its report (a candidate with a warning, such as the physics floor's flag on a
    speedup over 10x, teaches no lesson)."""
    lessons = [lesson for lesson in read_lessons(root / DEFAULT_PATH)
               if lesson.kernel.endswith(f"::{kernel}") and lesson.speedup is not None] \
        if (root / DEFAULT_PATH).is_file() else []
    best = max(lessons, key=lambda lesson: lesson.speedup or 0.0, default=None)
    if best is not None:
        return best.change
    for report in sorted((root / ".kfbot" / "runs").glob("*/report.json")):
        data = json.loads(report.read_text())
        if data.get("kernel_name") == kernel and data.get("rationale"):
            return str(data["rationale"])
    return ""


def stage(fixture: str, into: Path) -> Path:
    """A private git copy of the fixture: the search writes its run folder, lessons and a
    winner's branch into its repository, which must never be this one."""
    dest = into / fixture
    if dest.exists():
        return dest
    shutil.copytree(ROOT / "fixtures" / fixture, dest, ignore=shutil.ignore_patterns(
        "build", "__pycache__", ".kfbot", "*.so"))
    git.run(dest, "init", "-q")
    git.run(dest, "add", "-A")
    git.run(dest, "-c", "user.name=search-quality bench", "-c", "user.email=bench@localhost",
            "commit", "-q", "-m", "fixture")
    return dest


def hand_candidate(bench: NaiveBench, repo: Path, into: Path) -> Path | None:
    """A candidate folder mirroring the repository: the hand-written kernel file (None
    when the fixture has none for this kernel)."""
    if not (repo / "hand" / f"{bench.kernel}.cu").is_file():
        return None
    folder = into / f"hand-{bench.key}"
    target = folder / bench.file
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text((repo / "hand" / f"{bench.kernel}.cu").read_text())
    return folder


# --- the GPU parts --------------------------------------------------------------------


def kfbot(args: Sequence[str], timeout_s: float) -> tuple[int, str, str]:
    """`python -m kfbot args`: (exit code, stdout, the last lines of stderr)."""
    try:
        proc = subprocess.run([sys.executable, "-m", "kfbot", *args], capture_output=True,
                              text=True, timeout=timeout_s, cwd=ROOT, env=dict(os.environ))
    except subprocess.TimeoutExpired:
        return 124, "", f"timed out after {timeout_s:.0f} s"
    tail = " | ".join(proc.stderr.strip().splitlines()[-3:])
    return proc.returncode, proc.stdout, tail


def measure(bench: NaiveBench, work: Path, budget: int, seed: int, gpu: int | None) -> NaiveRow:
    row = NaiveRow(bench)
    repo = stage(bench.fixture, work)
    where = ["--gpu", str(gpu)] if gpu is not None else []
    code, out, err = kfbot(["optimize", bench.kernel, "--repo", str(repo), "--no-llm",
                            "--budget", str(budget), "--seed", str(seed), *where],
                           OPTIMIZE_TIMEOUT_S)
    run_dir = repo / ".kfbot" / "runs" / f"{bench.kernel}-{seed}"
    report = run_dir / "report.json"
    if not report.is_file():
        row.problems.append(f"optimize left no report (exit {code}): {err or out[-300:]}")
        return row
    row.reported, row.original_us = reported_speedup(json.loads(report.read_text()))
    row.change = best_change(repo, bench.kernel)
    code, out, err = kfbot(["reproduce", str(run_dir), "--json", *where], STEP_TIMEOUT_S)
    row.reproduced = _reproduced(out)
    if code != 0:
        # Exit 1 with figures: reproduced, but more than 5% below the report; the
        # figure still counts (it is the patch's own), and the disagreement is said.
        said = "more than 5% below the report" if row.reproduced is not None else \
            (err or out[-300:])
        row.problems.append(f"kfbot reproduce exit {code}: {said}")
    hand = hand_candidate(bench, repo, work)
    if hand is None:
        return row
    code, out, err = kfbot(["bench", bench.kernel, "--repo", str(repo), "--candidate",
                            str(hand), "--json", *where], STEP_TIMEOUT_S)
    try:
        row.hand, why = bench_speedup(json.loads(out))
    except json.JSONDecodeError:
        row.hand, why = None, f"exit {code}: {err}"
    if why:
        row.problems.append(f"hand-written version: {why}")
    return row
