"""How long does the light pre-commit hook take on a typical change?

Every figure times `python -m kfbot check FILES` as a fresh process, interpreter start-up
included, as pre-commit runs it, with the scan's facts cache in a temporary folder.

In a copy of `fixtures/example` (committed to a temporary git repository):

* one changed kernel (`csrc/softmax.cu`), with nvcc's front-end check when nvcc is on PATH;
* the same with nvcc hidden (scan, tree-sitter's syntax check and the pairing alone);
* a change to a file that holds no kernel source (README.md): the floor;
* the changed kernel with `-X importtime`, to check that torch is never imported.

In a generated repository of 300 source files (150 `.cu` with 298 kernels and 150 pytest
modules, as bench/scan_speed.py writes them), one line of one test changed (a
tolerance): the first run, which fills the cache, and the runs after it. The target:
under one second for that one-line `.py` change.

Every figure is the median of `--repeat` runs, with the fastest and slowest shown.

    .venv/bin/python bench/hook_speed.py
    .venv/bin/python bench/hook_speed.py --repeat 10
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
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
FIXTURE = ROOT / "fixtures" / "example"
TARGET_S = 1.0
GIT = ["git", "-c", "user.name=bench", "-c", "user.email=bench@example.com"]


def commit(repo: Path) -> None:
    subprocess.run([*GIT, "init", "-q"], cwd=repo, check=True)
    subprocess.run([*GIT, "add", "-A"], cwd=repo, check=True)
    subprocess.run([*GIT, "commit", "-q", "-m", "initial"], cwd=repo, check=True)


def make_repo(where: Path) -> Path:
    repo = where / "example"
    shutil.copytree(FIXTURE, repo)
    commit(repo)
    kernel = repo / "csrc" / "softmax.cu"
    kernel.write_text(kernel.read_text().replace("#define BLOCK 128", "#define BLOCK 256"))
    (repo / "README.md").write_text("edited\n")
    return repo


def time_check(repo: Path, files: list[str], env: dict[str, str], repeat: int,
               extra: tuple[str, ...] = ()) -> tuple[list[float], subprocess.CompletedProcess[str]]:
    times = []
    proc = None
    for _ in range(repeat):
        started = time.perf_counter()
        proc = subprocess.run([sys.executable, *extra, "-m", "kfbot", "check", *files], cwd=repo,
                              env=env, capture_output=True, text=True, check=False)
        times.append(time.perf_counter() - started)
    assert proc is not None
    if proc.returncode != 0:
        raise SystemExit(f"kfbot check failed (exit {proc.returncode}):\n{proc.stdout}"
                         f"{proc.stderr}")
    return times, proc


def make_large_repo(where: Path) -> tuple[Path, str]:
    """300 source files, committed; one line of one test changed. The changed file."""
    from scan_speed import generate  # the same generator as the scan benchmark

    repo = where / "large"
    generate(repo, cu=150, py=150, packages=3, seed=1)
    commit(repo)
    test = sorted(repo.glob("pkg*/tests/**/test_*.py"))[0]
    text = test.read_text()
    assert "atol=2e-2" in text, test
    test.write_text(text.replace("atol=2e-2", "atol=3e-2", 1))
    return repo, test.relative_to(repo).as_posix()


def without_nvcc(env: dict[str, str]) -> dict[str, str]:
    nvcc = shutil.which("nvcc", path=env.get("PATH"))
    hidden = dict(env)
    hidden.pop("CUDA_HOME", None)
    hidden.pop("CUDA_PATH", None)
    if nvcc is not None:
        folder = os.path.dirname(nvcc)
        hidden["PATH"] = os.pathsep.join(p for p in env["PATH"].split(os.pathsep) if p != folder)
    return hidden


def show(label: str, times: list[float]) -> None:
    print(f"{label:<52} median {statistics.median(times):6.3f} s   "
          f"(min {min(times):.3f}, max {max(times):.3f}, n={len(times)})")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeat", type=int, default=7)
    args = parser.parse_args()
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")])
    nvcc = shutil.which("nvcc")
    print(f"python {sys.version.split()[0]}, {os.cpu_count()} cores, "
          f"nvcc: {nvcc or 'not found'}; target: < {TARGET_S:.1f} s for a one-line .py change "
          "in 300 files")
    with tempfile.TemporaryDirectory(prefix="kfbot-hook-speed-") as tmp:
        env["KFBOT_CACHE"] = os.path.join(tmp, "cache")
        repo = make_repo(Path(tmp))
        typical, proc = time_check(repo, ["csrc/softmax.cu"], env, args.repeat)
        show("one changed .cu file (scan + nvcc + pairing)", typical)
        show("one changed .cu file, nvcc hidden", time_check(
            repo, ["csrc/softmax.cu"], without_nvcc(env), args.repeat)[0])
        show("README.md only (no kernel source)", time_check(
            repo, ["README.md"], env, args.repeat)[0])
        traced = time_check(repo, ["csrc/softmax.cu"], env, 1, ("-X", "importtime"))[1]
        torch = [line for line in traced.stderr.splitlines() if line.rstrip().endswith(" torch")]
        print(f"torch imported: {'YES' if torch else 'no'}")
        print("\noutput of the typical run:\n" + proc.stdout.rstrip())
        large, changed = make_large_repo(Path(tmp))
        cold = time_check(large, [changed], env, 1)[0]
        show("300 files, one line of a test changed, first run", cold)
        warm, proc = time_check(large, [changed], env, args.repeat)
        show("300 files, one line of a test changed", warm)
        print("\noutput of the 300-file run:\n" + proc.stdout.rstrip())
        verdict = "met" if statistics.median(warm) < TARGET_S else "MISSED"
        print(f"\ntarget {verdict}: one-line .py change in 300 files, median "
              f"{statistics.median(warm):.3f} s (< {TARGET_S:.1f} s)")


if __name__ == "__main__":
    main()
