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

Then the same change (a define of `csrc/softmax.cu` and a tolerance of
`tests/test_ops.py`, staged) through a real `pre-commit run`, kfbot's hook next to
ruff's and clang-format's, each installed from PyPI into a virtual environment of its
own as pre-commit's `language: python` would: the time of `pre-commit run HOOK` and of
the hook's command alone, the size of what each environment installs, and what each
prints on a pass. Without network (no pip install), or with `--no-compare`, that part
is skipped and says so.

Every figure is the median of `--repeat` runs, with the fastest and slowest shown.

    .venv/bin/python bench/hook_speed.py
    .venv/bin/python bench/hook_speed.py --repeat 10
    .venv/bin/python bench/hook_speed.py --no-compare   # kfbot alone, no pip install
"""

from __future__ import annotations

import argparse
import os
import shlex
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
    from scan_tree import generate  # the same generator as the scan benchmark

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


# --- kfbot's hook beside ruff's and clang-format's, through pre-commit ------------------------

# (id, what pip installs, the command in the environment, the files it takes, always_run)
HOOKS = (("kfbot-check", str(ROOT), "kfbot check --staged", None, True),
         ("ruff", "ruff", "ruff check", ["python"], False),
         ("clang-format", "clang-format", "clang-format -i", ["c", "c++", "cuda"], False))


def make_env(where: Path, name: str, spec: str) -> Path | str:
    """A virtual environment holding `spec` and what it needs; the reason when pip fails."""
    venv = where / f"env-{name}"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    done = subprocess.run([str(venv / "bin" / "python"), "-m", "pip", "install", "-q",
                           "--disable-pip-version-check", spec], capture_output=True,
                          text=True, timeout=900, check=False)
    if done.returncode != 0:
        said = (done.stderr.strip().splitlines() or ["no message"])[-1]
        return f"pip install {spec} failed (exit {done.returncode}): {said}"
    return venv


def installed_size(venv: Path, bare: Path) -> int:
    """Bytes the hook's packages take in `venv`: what its site-packages and bin folder
    hold beyond a bare environment's (pip). ruff's wheel is one binary in bin/."""
    total = 0
    for sub in ("lib/python*/site-packages", "bin"):
        (here,) = venv.glob(sub)
        (there,) = bare.glob(sub)
        base = {p.name for p in there.iterdir()}
        total += sum(f.stat().st_size for top in here.iterdir() if top.name not in base
                     for f in ([top] if top.is_file() else top.rglob("*"))
                     if f.is_file() and not f.is_symlink())
    return total


def compare_repo(where: Path, clang_format: Path | None) -> Path:
    """The example, formatted as clang-format would have it (its hook then passes on an
    unchanged style), committed; the change staged."""
    repo = where / "compare"
    shutil.copytree(FIXTURE, repo)
    if clang_format is not None:
        subprocess.run([str(clang_format), "-i", *map(str, (repo / "csrc").iterdir())],
                       check=True)
    commit(repo)
    kernel = repo / "csrc" / "softmax.cu"
    kernel.write_text(kernel.read_text().replace("#define BLOCK 128", "#define BLOCK 256"))
    tests = repo / "tests" / "test_ops.py"
    tests.write_text(tests.read_text().replace("atol=1e-4)", "atol=2e-4)", 1))
    subprocess.run([*GIT, "add", "-A"], cwd=repo, check=True)
    return repo


def pre_commit_config(repo: Path, envs: dict[str, Path]) -> None:
    hooks = []
    for name, _, command, types, always in HOOKS:
        if name not in envs:
            continue
        entry = f"{envs[name] / 'bin'}/{command}"
        hook = {"id": name, "name": name, "entry": entry, "language": "system",
                "require_serial": True}
        hook.update({"always_run": True, "pass_filenames": False} if always else
                    {"types_or": types})
        hooks.append(hook)
    import yaml

    (repo / ".pre-commit-config.yaml").write_text(yaml.safe_dump(
        {"repos": [{"repo": "local", "hooks": hooks}]}, sort_keys=False))


def timed(command: list[str], cwd: Path, env: dict[str, str],
          repeat: int) -> tuple[list[float], subprocess.CompletedProcess[str]]:
    times, proc = [], None
    for _ in range(repeat):
        started = time.perf_counter()
        proc = subprocess.run(command, cwd=cwd, env=env, capture_output=True, text=True,
                              check=False)
        times.append(time.perf_counter() - started)
    assert proc is not None
    return times, proc


def compare(where: Path, env: dict[str, str], repeat: int) -> None:
    print("\nthe same change through pre-commit: kfbot's hook beside ruff's and clang-format's")
    try:
        import pre_commit  # noqa: F401
    except ImportError:
        print("  skipped: pre-commit is not installed for this Python (pip install pre-commit)")
        return
    bare = where / "env-bare"
    subprocess.run([sys.executable, "-m", "venv", str(bare)], check=True)
    envs: dict[str, Path] = {}
    for name, spec, *_ in HOOKS:
        made = make_env(where, name, spec)
        if isinstance(made, str):
            print(f"  {name}: skipped: {made}")
        else:
            envs[name] = made
    if not envs:
        print("  nothing to compare: no hook could be installed (no network?)")
        return
    formatter = envs["clang-format"] / "bin" / "clang-format" if "clang-format" in envs else None
    repo = compare_repo(where, formatter)
    pre_commit_config(repo, envs)
    run_env = {**env, "PRE_COMMIT_HOME": str(where / "pre-commit-home"),
               "PRE_COMMIT_COLOR": "never"}
    subprocess.run([sys.executable, "-m", "pre_commit", "run"], cwd=repo, env=run_env,
                   capture_output=True, check=False)  # pre-commit's own first-run set-up
    print(f"  {'hook':<14} {'pre-commit run':>15} {'command alone':>14} {'installs':>10}  "
          "output on a pass")
    staged = ["tests/test_ops.py", "csrc/softmax.cu"]
    for name, _, command, types, always in HOOKS:
        if name not in envs:
            continue
        hooked, proc = timed([sys.executable, "-m", "pre_commit", "run", name], repo, run_env,
                             repeat)
        files = [] if always else [f for f in staged
                                   if (f.endswith(".py")) == (types == ["python"])]
        alone = timed([*shlex.split(f"{envs[name] / 'bin'}/{command}"), *files], repo, run_env,
                      repeat)[0]
        size = installed_size(envs[name], bare) / 1e6
        said = proc.stdout.strip().splitlines()
        verdict = "" if proc.returncode == 0 else f" (FAILED, exit {proc.returncode})"
        print(f"  {name:<14} {statistics.median(hooked):13.3f} s "
              f"{statistics.median(alone):12.3f} s {size:7.1f} MB  {len(said)} line"
              f"{'s' if len(said) != 1 else ''}{verdict}")
        for line in said:
            print(f"  {'':<14} | {line}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeat", type=int, default=7)
    parser.add_argument("--no-compare", action="store_true",
                        help="skip the comparison with ruff and clang-format (no pip install)")
    parser.add_argument("--compare-only", action="store_true",
                        help="only the comparison with ruff and clang-format")
    args = parser.parse_args()
    if args.compare_only:
        env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT),
                                                            os.environ.get("PYTHONPATH", "")])}
        with tempfile.TemporaryDirectory(prefix="kfbot-hook-speed-") as tmp:
            env["KFBOT_CACHE"] = os.path.join(tmp, "cache")
            compare(Path(tmp), env, args.repeat)
        return
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
        if args.no_compare:
            print("\n(the comparison with ruff and clang-format: skipped, --no-compare)")
        else:
            compare(Path(tmp), env, args.repeat)


if __name__ == "__main__":
    main()
