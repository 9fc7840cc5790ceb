"""What the sandbox costs: the start-up of one sandboxed process, per method.

Every untrusted process kfbot starts goes through the sandbox: per candidate that is its
compile and its link (two processes; the GPU worker is started once and reused), per
baseline the capture's pytest and scripts, per finalist its build and tests. The cost is
paid at start-up (making the namespaces, the mounts, the launcher's interpreter) and at
exit (the namespace's teardown); inside, the process runs at full speed. This prints,
for each method that works here, the median and 90th percentile wall time of

* `true` alone and sandboxed: the sandbox's own cost;
* `python -c pass` alone and sandboxed: what a Python step (a test run, setup.py) pays;
* the GPU worker's start and one job (no torch preloaded), sandboxed by each method or
  by none (a kfbot process whose PATH offers no sandbox);

and the added time per candidate (two sandboxed compiles). The worker rows give the
median and the slowest of a few starts. Measured on a 2-core machine under load 6-7
(python -c pass: 172 ms there): bwrap and unshare each added 170-190 ms to a process,
about one interpreter start (the launcher), and 220-270 ms to a worker's start. The
separate user (kfbot as root) pays the launcher's start and, after each process, a second
one that kills what is left of its id.

    .venv/bin/python bench/sandbox_cost.py [--runs 20]
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from functools import partial
from pathlib import Path

from kfbot.evaluate.sandbox import Sandbox, View, separate_user, untrusted_env
from kfbot.evaluate.sandbox.methods import CHOICE_VARIABLE, LAUNCHER, Method

PROGRAMS = {"true": ["true"], "python": [sys.executable, "-c", "pass"]}


def timed(action: Callable[[], object], runs: int) -> tuple[float, float]:
    """Median and 90th percentile wall seconds of `runs` calls (after one warm-up)."""
    action()
    seconds = []
    for _ in range(runs):
        started = time.perf_counter()
        action()
        seconds.append(time.perf_counter() - started)
    seconds.sort()
    return statistics.median(seconds), seconds[min(len(seconds) - 1, int(0.9 * len(seconds)))]


def run(argv: Sequence[str], cwd: str) -> None:
    subprocess.run(list(argv), cwd=cwd, env=untrusted_env(), check=True,
                   stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL)


def confined_run(box: Sandbox, argv: Sequence[str], view: View) -> None:
    """As a spawn point does: the command made for this run, and the clean-up after it
    (a separate user's: a fresh id, its folders, and killing what is left of it)."""
    wrapped = box.command(argv, view)
    try:
        run(wrapped, view.cwd)
    finally:
        box.finished(wrapped)


WORKER = """
import time
from kfbot.evaluate.sandbox import sandbox
from kfbot.evaluate.worker.session import run_job
method = sandbox().method  # found before the clock starts: once per kfbot process
started = time.perf_counter()
result = run_job("builtins:dict", {}, 60.0)
print(method, time.perf_counter() - started, result.status)
"""


def worker_starts(runs: int) -> None:
    """A GPU worker's start and one trivial job (no torch preloaded), in a kfbot process
    whose PATH offers bubblewrap, only unshare, or neither."""
    with tempfile.TemporaryDirectory(prefix="kfbot-bench-bin-") as tmp:
        plain = os.environ["PATH"]
        envs = {"bwrap": {"PATH": plain},
                "unshare": {"PATH": _path_without(Path(tmp, "a"), {"bwrap"})},
                "separate-user": {"PATH": plain, CHOICE_VARIABLE: "separate-user"},
                "none": {"PATH": _path_without(Path(tmp, "b"), {"bwrap", "unshare"}),
                         CHOICE_VARIABLE: "bwrap,unshare"}}
        for wanted, env in envs.items():
            seconds = []
            for _ in range(max(3, runs // 4)):
                done = subprocess.run([sys.executable, "-c", WORKER], capture_output=True,
                                      text=True, env={**os.environ, **env}, check=True)
                method, elapsed, status = done.stdout.split()
                seconds.append(float(elapsed))
            if method == wanted and status == "ok":
                print(f"{'worker':8} {method:13} {statistics.median(seconds) * 1e3:10.1f} "
                      f"{max(seconds) * 1e3:8.1f}")


def _path_without(folder: Path, left_out: set[str]) -> str:
    folder.mkdir()
    for directory in os.environ["PATH"].split(os.pathsep):
        if os.path.isdir(directory):
            for name in os.listdir(directory):
                if name not in left_out and not (folder / name).exists():
                    (folder / name).symlink_to(os.path.join(directory, name))
    return str(folder)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=20)
    args = parser.parse_args()
    boxes: list[Sandbox] = []
    for method in ("bwrap", "unshare"):
        tool = shutil.which(method)
        if tool is not None:
            boxes.append(Sandbox(_method(method), tool))
    if separate_user.problem() is None:
        boxes.append(Sandbox("separate-user", LAUNCHER))
    with tempfile.TemporaryDirectory(prefix="kfbot-bench-") as folder:
        view = View.of(folder, writable=[folder])
        print(f"{'program':8} {'method':13} {'median ms':>10} {'p90 ms':>8} {'added ms':>9}")
        added: dict[str, float] = {}
        for name, argv in PROGRAMS.items():
            alone, alone90 = timed(partial(run, argv, folder), args.runs)
            print(f"{name:8} {'none':13} {alone * 1e3:10.1f} {alone90 * 1e3:8.1f} {'':>9}")
            for box in boxes:
                median, p90 = timed(partial(confined_run, box, argv, view), args.runs)
                extra = (median - alone) * 1e3
                added[box.method] = max(added.get(box.method, 0.0), extra)
                print(f"{name:8} {box.method:13} {median * 1e3:10.1f} {p90 * 1e3:8.1f} "
                      f"{extra:9.1f}")
        worker_starts(args.runs)
        for method, extra in added.items():
            print(f"per candidate ({method}): about {2 * extra:.0f} ms added "
                  "(a compile and a link, each sandboxed)")
    print(f"cpus: {os.cpu_count()}, load average: {os.getloadavg()[0]:.2f}")


def _method(name: str) -> Method:
    return "bwrap" if name == "bwrap" else "unshare"


if __name__ == "__main__":
    main()
