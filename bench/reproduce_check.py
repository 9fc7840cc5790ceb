"""Publish, then reproduce: the numbers kfbot reports are the patch's own (GPU).

On a temporary git copy of fixtures/naive_row_softmax_publish (a naive row softmax,
one thread per row, in a .cu beside an elementwise kernel), this runs, as a user would:

1. `kfbot optimize softmax_rows_kernel --no-llm --publish-dry-run OUT`: the search, the
   reproduction it makes before publishing, and the pull request written to OUT;
2. `kfbot reproduce RUN_DIR --json`: a second, separate reproduction of the run folder.

It prints the committed candidate, the pull request's draft flag and labels (a result
over 10x opens as a draft labelled `kfbot: needs review`), and per shape the reported
speedup beside both reproductions and the % of the speed of light (the candidate's and
the original's, and the floor), then checks that the pull request, report.json and
the reproductions all name one candidate, that the reproduced speedup is at most 5%
below the reported one, and that the pull request's table gives the % of the speed of
light on every shape. Exit 0 when all of that holds, 1 when not, 3 without a GPU.

    python bench/reproduce_check.py [--budget 12] [--gpu N] [--keep DIR]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
FIXTURE = ROOT / "fixtures" / "naive_row_softmax_publish"
KERNEL = "softmax_rows_kernel"
TOLERANCE = 0.05
EXIT_OK, EXIT_FAIL, EXIT_NO_GPU = 0, 1, 3


@dataclass
class Check:
    """What one run showed, and the problems found in it (none: it passed)."""

    root: Path
    optimize: subprocess.CompletedProcess[str] | None = None
    reproduce: subprocess.CompletedProcess[str] | None = None
    report: dict[str, Any] = field(default_factory=dict)
    pr: dict[str, Any] = field(default_factory=dict)
    body: str = ""
    second: dict[str, Any] = field(default_factory=dict)
    seconds: dict[str, float] = field(default_factory=dict)
    problems: list[str] = field(default_factory=list)
    no_gpu: bool = False


def repository(dest: Path) -> Path:
    """A git repository holding the fixture, committed, as a user's clone would be."""
    shutil.copytree(FIXTURE, dest)
    (dest / ".gitignore").write_text(".kfbot/runs/\n")
    for args in (["init", "-q", "-b", "main"], ["add", "-A"],
                 ["-c", "user.name=kfbot-check", "-c", "user.email=check@example.com",
                  "commit", "-qm", "naive row softmax"]):
        subprocess.run(["git", *args], cwd=dest, check=True, capture_output=True)
    return dest


def kfbot(*args: str, cwd: Path, timeout: float, stream: bool = False
          ) -> subprocess.CompletedProcess[str]:
    """kfbot as a user runs it; with `stream`, its output is shown as it comes (stdout and
    stderr together), so a run cut short by the timeout still says how far it got."""
    env = {k: v for k, v in os.environ.items() if k != "ANTHROPIC_API_KEY"}
    env["COLUMNS"] = "200"
    command = [sys.executable, "-m", "kfbot", *args]
    if not stream:
        return subprocess.run(command, cwd=cwd, env=env, capture_output=True, text=True,
                              timeout=timeout, check=False)
    lines = []
    with subprocess.Popen(command, cwd=cwd, env=env, stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, text=True) as proc:
        timer = threading.Timer(timeout, proc.kill)
        timer.start()
        try:
            assert proc.stdout is not None
            for line in proc.stdout:
                print(f"  | {line.rstrip()}", flush=True)
                lines.append(line)
        finally:
            timer.cancel()
    return subprocess.CompletedProcess(command, proc.returncode, "".join(lines), "")


def run_check(work: Path, budget: int = 12, gpu: int | None = None) -> Check:
    """The whole check in `work` (a fresh folder): optimize, publish dry-run, reproduce."""
    check = Check(repository(work / "repo"))
    out = work / "pr"
    gpu_args = ["--gpu", str(gpu)] if gpu is not None else []
    started = time.monotonic()
    check.optimize = kfbot("optimize", KERNEL, "--repo", str(check.root), "--no-llm",
                           "--budget", str(budget), "--islands", "2", "--seed", "1",
                           "--publish-dry-run", str(out), *gpu_args, cwd=check.root,
                           timeout=1500, stream=True)
    check.seconds["optimize"] = time.monotonic() - started
    if check.optimize.returncode == EXIT_NO_GPU:
        check.no_gpu = True
        return check
    run_dir = check.root / ".kfbot" / "runs" / f"{KERNEL}-1"
    check.report = _json(run_dir / "report.json", check)
    check.pr = _json(out / "pr.json", check)
    check.body = (out / "pr-body.md").read_text() if (out / "pr-body.md").is_file() else ""
    started = time.monotonic()
    check.reproduce = kfbot("reproduce", str(run_dir), "--json", *gpu_args, cwd=check.root,
                            timeout=900)
    check.seconds["reproduce"] = time.monotonic() - started
    try:
        check.second = json.loads(check.reproduce.stdout)
    except ValueError:
        check.problems.append("kfbot reproduce --json printed no JSON")
    _judge(check)
    return check


def _json(path: Path, check: Check) -> dict[str, Any]:
    if not path.is_file():
        check.problems.append(f"{path.name} was not written")
        return {}
    data: dict[str, Any] = json.loads(path.read_text())
    return data


def _judge(check: Check) -> None:
    assert check.optimize is not None and check.reproduce is not None
    p = check.problems
    if check.optimize.returncode != EXIT_OK:
        p.append(f"kfbot optimize exited {check.optimize.returncode}")
    if check.reproduce.returncode != EXIT_OK:
        p.append(f"kfbot reproduce exited {check.reproduce.returncode}")
    candidate = check.report.get("candidate")
    first = check.pr.get("reproduction") or {}
    named = {"report.json": candidate, "pr.json": check.pr.get("candidate"),
             "the publish reproduction": first.get("candidate"),
             "kfbot reproduce": check.second.get("candidate")}
    if not candidate or len(set(named.values())) != 1:
        p.append(f"not one candidate: {named}")
    elif f"Candidate `{candidate[:10]}`" not in check.body:
        p.append("the pull request body does not name the candidate")
    if "## Reproduced" not in check.body:
        p.append("the pull request body has no Reproduced section")
    for who, figures in (("the publish reproduction", first), ("kfbot reproduce",
                                                              check.second)):
        speed = figures.get("speedup") or {}
        reported, reproduced = speed.get("reported", 0.0), speed.get("reproduced", 0.0)
        if not reported or reproduced < reported * (1 - TOLERANCE):
            p.append(f"{who}: {reproduced:.3f}x reproduced against {reported:.3f}x reported, "
                     f"more than {TOLERANCE:.0%} below")
    p += light_problems(check.body, (check.report.get("best") or {}).get("timings", []))
    headline = (check.report.get("best") or {}).get("speedup")
    if headline and first and abs(first["speedup"]["reported"] - headline) > 1e-9:
        p.append(f"the reproduction's reported {first['speedup']['reported']} is not the "
                 f"headline's {headline}")


def light_problems(body: str, timings: list[dict[str, Any]]) -> list[str]:
    """The pull request's benchmark table must say, per shape, the % of the speed of
    light beside the speedup (the candidate's, then the original's)."""
    if "% of speed of light" not in body:
        return ["the pull request's benchmark table has no % of speed of light column"]
    out = []
    for t in timings:
        row = next((line for line in body.splitlines()
                    if line.startswith(f"| `{t['input']}` |")), None)
        light = t.get("percent_of_light")
        if row is None or light is None or f"| {light:.0f}% (" not in row:
            out.append(f"{t['input']}: no % of speed of light in the pull request "
                       f"(report: {light})")
    return out


def show(check: Check) -> None:
    """Everything needed to tell what went wrong, on one screen or two."""
    for name, proc in (("optimize", check.optimize), ("reproduce", check.reproduce)):
        if proc is not None:
            print(f"--- kfbot {name}: exit {proc.returncode} in "
                  f"{check.seconds.get(name, 0):.0f} s; last lines:")
            print("\n".join((proc.stdout + proc.stderr).splitlines()[-25:]))
    best = check.report.get("best") or {}
    print(f"--- committed candidate {str(check.report.get('candidate'))[:10]}: "
          f"{best.get('speedup') or 0:.3f}x ({best.get('verdict')}); pull request draft="
          f"{check.pr.get('draft')} labels={check.pr.get('labels')}")
    flags = [f["reason"] for f in best.get("findings", []) if f.get("layer") == "physics"]
    for flag in flags:
        print(f"    physics floor: {flag}")
    first = {s["shape"]: s for s in (check.pr.get("reproduction") or {}).get("shapes", [])}
    second = {s["shape"]: s for s in check.second.get("shapes", [])}
    print(f"{'shape':28} {'reported':>9} {'publish':>9} {'reproduce':>9} "
          f"{'orig µs':>10} {'cand µs':>10} {'% light':>8} {'(orig)':>7} {'floor µs':>9}")
    for t in best.get("timings", []):
        a, b = first.get(t["input"], {}), second.get(t["input"], {})
        light, orig = t.get("percent_of_light"), t.get("original_percent_of_light")
        print(f"{t['input']:28} {t['speedup']:9.3f} {a.get('reproduced', 0):9.3f} "
              f"{b.get('reproduced', 0):9.3f} {b.get('original_us', 0):10.2f} "
              f"{b.get('candidate_us', 0):10.2f} "
              f"{'-' if light is None else f'{light:.0f}%':>8} "
              f"{'-' if orig is None else f'{orig:.0f}%':>7} "
              f"{t.get('floor_us') or 0:9.2f} {t.get('floor_bound') or ''}")
    rows = [line for line in check.body.splitlines() if line.startswith("| `")]
    print("the pull request's benchmark rows:")
    print("\n".join(rows[:12]))
    for who, figures in (("publish", check.pr.get("reproduction") or {}),
                         ("reproduce", check.second)):
        speed = figures.get("speedup") or {}
        if speed.get("reported"):
            gap = speed["reproduced"] / speed["reported"] - 1
            print(f"geometric mean ({who}): reported {speed['reported']:.3f}x, reproduced "
                  f"{speed['reproduced']:.3f}x ({gap:+.1%})")
    print("PASS" if not check.problems else "FAIL:\n  " + "\n  ".join(check.problems))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--budget", type=int, default=12, metavar="N",
                        help="evaluations of the search (default 12)")
    parser.add_argument("--gpu", type=int, default=None)
    parser.add_argument("--keep", type=Path, help="work in this folder and keep it")
    args = parser.parse_args(argv)
    if args.keep is not None:
        args.keep.mkdir(parents=True, exist_ok=False)
        check = run_check(args.keep, args.budget, args.gpu)
    else:
        with tempfile.TemporaryDirectory(prefix="kfbot-reproduce-check-") as tmp:
            check = run_check(Path(tmp), args.budget, args.gpu)
    if check.no_gpu:
        print("no CUDA GPU: kfbot optimize exited 3", file=sys.stderr)
        return EXIT_NO_GPU
    show(check)
    return EXIT_OK if not check.problems else EXIT_FAIL


if __name__ == "__main__":
    sys.exit(main())
