"""Scaling: evaluations per minute on 1 GPU, on 2 local GPUs, and on a local Ray cluster.

The same candidates (block-size and restrict variants of the softmax kernel in
fixtures/example) are evaluated three ways in one run, on one machine with two GPUs:

    1 GPU        EngineExecutor, one engine on GPU 0
    2 GPUs       LocalGpuExecutor, one engine per GPU, builds shared
    Ray 2 GPUs   RayExecutor on a Ray cluster this script starts here: a head with no
                 GPU and two worker nodes (separate `ray start` processes) holding
                 GPU 0 and GPU 1; or the cluster at --address

Builds are made first (cached by content) and every executor is warmed up (GPU probe,
original build, input capture, baseline) before the clock starts, so the numbers are
evaluation throughput: verify + benchmark, the GPU-bound part. Target: at least 1.8x
the single-GPU throughput with two GPUs.

    python bench/scaling.py [--candidates 48] [--chart scaling.png] [--address HOST:PORT]

Exit status: 0 all targets met, 1 a target missed, 3 fewer than two GPUs or no Ray.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, replace
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from kfbot.config import load_config  # noqa: E402
from kfbot.evaluate.build import Builder  # noqa: E402
from kfbot.evaluate.candidate import Candidate  # noqa: E402
from kfbot.evaluate.engine import Engine, EngineSettings  # noqa: E402
from kfbot.evaluate.evaluation import Evaluation  # noqa: E402
from kfbot.evaluate.task import KernelTask, make_task  # noqa: E402
from kfbot.scan.scanner import scan  # noqa: E402
from kfbot.scan.select import select_kernel  # noqa: E402
from kfbot.search import executor as executors  # noqa: E402

FIXTURE = ROOT / "fixtures" / "example"
KERNEL_FILE = "csrc/softmax.cu"
TARGET = 1.8
WARM = 2  # candidates evaluated untimed first, one per GPU


@dataclass(frozen=True)
class Row:
    name: str
    evaluations: int
    ok: int
    seconds: float

    @property
    def per_minute(self) -> float:
        return 60.0 * self.evaluations / self.seconds


def variants(count: int) -> list[Candidate]:
    """Block sizes 32..1024, with and without restrict-qualified pointers: all distinct."""
    source = (FIXTURE / KERNEL_FILE).read_text()
    assert "#define BLOCK 128" in source
    out = []
    for restrict in (False, True):
        for block in range(32, 1025, 32):
            text = source.replace("#define BLOCK 128", f"#define BLOCK {block}")
            if restrict:
                text = text.replace("const float* x, float* y", "const float* __restrict__ x, "
                                    "float* __restrict__ y", 1)
            out.append(Candidate(files={KERNEL_FILE: text}, origin="params",
                                 rationale=f"block {block}{' restrict' if restrict else ''}"))
    if count + WARM > len(out):
        raise SystemExit(f"at most {len(out) - WARM} candidates")
    return out[:count + WARM]


def gpu_count() -> int:
    try:
        out = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, check=True)
    except (OSError, subprocess.CalledProcessError):
        return 0
    return sum(line.startswith("GPU ") for line in out.stdout.splitlines())


def softmax_task() -> KernelTask:
    config = load_config(None, FIXTURE)
    kernel = select_kernel(scan(FIXTURE, config).kernels, "softmax_kernel")
    return make_task(kernel, FIXTURE, config)


def prebuild(task: KernelTask, settings: EngineSettings, candidates: Sequence[Candidate]) -> None:
    engine = Engine(task, settings, Builder(settings.cache_dir / "build"))
    t0 = time.monotonic()
    with ThreadPoolExecutor(max_workers=os.cpu_count() or 2) as pool:
        built = list(pool.map(engine.build, candidates))
    bad = [c.rationale for c, b in zip(candidates, built, strict=True) if not b.ok]
    print(f"prebuilt {len(candidates)} variants in {time.monotonic() - t0:.1f} s"
          + (f"; failed: {', '.join(bad)}" if bad else ""))


def timed(name: str, run: executors.Executor, candidates: Sequence[Candidate]) -> Row:
    """Warm up (untimed), then evaluate the batch against the clock."""
    warm = run.evaluate(candidates[:WARM])
    if not all(ev.ok for _, ev in warm):
        print(f"  {name}: warm-up failed: {_reasons(warm)}")
    t0 = time.monotonic()
    results = run.evaluate(candidates[WARM:])
    seconds = time.monotonic() - t0
    ok = sum(ev.ok for _, ev in results)
    print(f"  {name}: {len(results)} evaluations in {seconds:.1f} s, {ok} correct; "
          f"{busy_line([ev for _, ev in results], seconds)}")
    print(f"    {where_line([ev for _, ev in results])}")
    if ok < len(results):
        print(f"    failures: {_reasons(results)}")
    return Row(name, len(results), ok, seconds)


def where_line(evaluations: Sequence[Evaluation]) -> str:
    """Mean milliseconds per evaluation: the worker's phases, the worker's time outside
    them plus the pipe, this process's payload and judging, and the rest (waiting for
    the interpreter lock, thread hand-over): the parts that grow when GPUs are added."""
    n = max(1, len(evaluations))
    sums: dict[str, float] = {}
    for ev in evaluations:
        for phase, seconds in ev.phases.items():
            sums[phase] = sums.get(phase, 0.0) + seconds
    driver = {k: sums.pop(k, 0.0) for k in ("driver-payload", "driver-round-trip",
                                             "driver-judge")}
    # A Ray actor's chunk, before its GPU: checks and builds, then waiting for the GPU.
    actor = {k: sums.pop(k) for k in ("actor-prepare", "actor-gpu-wait") if k in sums}
    worker = sum(v for k, v in sums.items() if ":" not in k)  # "a:b" is part of a
    total = sum(ev.eval_seconds for ev in evaluations)
    parts = {**sums, "worker-unphased+pipe": driver["driver-round-trip"] - worker,
             "payload": driver["driver-payload"], "judge": driver["driver-judge"],
             "rest": total - sum(driver.values()), **actor}
    return "ms each: " + ", ".join(f"{k} {1000 * v / n:.0f}" for k, v in parts.items())


def busy_line(evaluations: Sequence[Evaluation], wall_s: float) -> str:
    """Where the wall time went: the evaluations' own seconds (verify and benchmark,
    summed over the GPUs) against the wall clock, so an executor that leaves its GPUs
    idle (transfers, planning, waiting) shows it."""
    inside = sum(ev.eval_seconds for ev in evaluations)
    per = inside / max(1, len(evaluations))
    return (f"{inside:.1f} s inside evaluations ({per:.2f} s each), "
            f"{inside / wall_s:.2f} GPU-seconds per second of wall time" if wall_s > 0
            else "no wall time")


def _reasons(results: Sequence[tuple[Candidate, Evaluation]]) -> str:
    return "; ".join(f"{c.rationale}: {ev.stage}: {ev.reason}" for c, ev in results
                     if not ev.ok)[:600]


def one_gpu(task: KernelTask, settings: EngineSettings, cands: Sequence[Candidate]) -> Row:
    with Engine(task, replace(settings, gpu=0)) as engine:
        return timed("1 GPU", executors.EngineExecutor(engine), cands)


def two_gpus(task: KernelTask, settings: EngineSettings, cands: Sequence[Candidate]) -> Row:
    local = getattr(executors, "LocalGpuExecutor", None)
    if local is None:
        print("  2 GPUs: kfbot.search.executors.local has no LocalGpuExecutor; skipped")
        return Row("2 GPUs (missing)", 0, 0, float("nan"))
    run = local([0, 1], executors.engines_per_gpu(task, settings))
    try:
        return timed("2 GPUs", run, cands)
    finally:
        run.close()


def on_ray(task: KernelTask, settings: EngineSettings, cands: Sequence[Candidate],
           address: str, chunk: int) -> Row:
    from kfbot.search.executors.ray import RayExecutor

    run = RayExecutor(task, settings, address, chunk=chunk)
    try:
        print(f"  Ray: {len(run.actors)} actors on {address}")
        run.preflight()  # as `kfbot optimize` does: every actor starts its GPU worker
        return timed(f"Ray, {len(run.actors)} GPU actors", run, cands)
    finally:
        run.close()


@contextmanager
def local_ray_cluster(gpus: int) -> Iterator[str]:
    """A head with no GPU plus one worker node per GPU, each a `ray start --block`
    process that sees only its own GPU. Each node runs in its own session, so stopping
    it stops every process it started: none is left to block the next cluster."""
    ray = shutil.which("ray") or str(Path(sys.executable).with_name("ray"))
    port = _free_port()
    address = f"127.0.0.1:{port}"
    common = ["--block", "--disable-usage-stats", "--num-cpus", str(os.cpu_count() or 2)]
    procs = [_start([ray, "start", "--head", "--port", str(port), "--num-gpus", "0",
                     "--include-dashboard", "false", *common], {})]
    time.sleep(5)  # the head's GCS must be up before workers join
    try:
        for gpu in range(gpus):  # one at a time: nodes started together can race for ports
            procs.append(_start([ray, "start", "--address", address, "--num-gpus", "1",
                                 *common], {"CUDA_VISIBLE_DEVICES": str(gpu)}))
            _wait_for_gpus(address, gpu + 1)
        yield address
    finally:
        for proc in reversed(procs):
            _stop(proc)


def _start(command: list[str], env: dict[str, str]) -> subprocess.Popen[bytes]:
    # The actors import kfbot from this checkout, installed or not.
    path = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))
    return subprocess.Popen(command, env={**os.environ, "PYTHONPATH": path, **env},
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            start_new_session=True)


def _stop(proc: subprocess.Popen[bytes]) -> None:
    """SIGTERM to the node's whole process group, then SIGKILL what is left."""
    for sig, wait in ((signal.SIGTERM, 30), (signal.SIGKILL, 10)):
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, sig)
        try:
            proc.wait(timeout=wait)
            break
        except subprocess.TimeoutExpired:
            continue
    with contextlib.suppress(ProcessLookupError):  # the node's children, if it left any
        os.killpg(proc.pid, signal.SIGKILL)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _wait_for_gpus(address: str, gpus: int, timeout_s: float = 120.0) -> None:
    import ray

    ray.init(address=address, include_dashboard=False, log_to_driver=False)
    try:
        deadline = time.monotonic() + timeout_s
        while ray.cluster_resources().get("GPU", 0) < gpus:
            if time.monotonic() > deadline:
                raise SystemExit(f"the local Ray cluster at {address} did not reach {gpus} GPUs")
            time.sleep(1)
    finally:
        ray.shutdown()


def report(rows: Sequence[Row], chart: Path | None) -> bool:
    base = rows[0].per_minute
    print()
    print(f"{'executor':<22} {'evals':>6} {'correct':>8} {'wall s':>8} {'evals/min':>10} "
          f"{'vs 1 GPU':>9}  target")
    passed = True
    for i, row in enumerate(rows):
        ratio = row.per_minute / base
        verdict = "" if i == 0 else ("PASS" if ratio >= TARGET else "FAIL")
        passed = passed and (i == 0 or ratio >= TARGET)
        print(f"{row.name:<22} {row.evaluations:>6} {row.ok:>8} {row.seconds:>8.1f} "
              f"{row.per_minute:>10.1f} {ratio:>8.2f}x  {verdict}"
              + (f" (>= {TARGET}x)" if verdict else ""))
    if chart is not None:
        _chart(rows, chart)
    return passed


def _chart(rows: Sequence[Row], path: Path) -> None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib is not installed: no chart")
        return
    fig, ax = plt.subplots(figsize=(6, 3.5))
    ax.bar([r.name for r in rows], [r.per_minute for r in rows], color="#4c72b0")
    ax.axhline(rows[0].per_minute * TARGET, color="#c44e52", linestyle="--",
               label=f"{TARGET}x one GPU")
    ax.set_ylabel("evaluations / minute")
    ax.set_title("kfbot evaluation throughput (softmax, fixtures/example)")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    print(f"chart: {path}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--candidates", type=int, default=48, help="timed evaluations per run")
    parser.add_argument("--address", help="use this Ray cluster instead of starting one")
    parser.add_argument("--ray-chunk", type=int, default=2, help="candidates per Ray call")
    parser.add_argument("--chart", type=Path, default=ROOT / "bench" / "scaling.png")
    args = parser.parse_args()
    if gpu_count() < 2:
        print("bench/scaling.py needs a machine with at least two CUDA GPUs "
              f"(nvidia-smi lists {gpu_count()})", file=sys.stderr)
        return 3
    try:
        import ray  # noqa: F401
    except ImportError:
        print("bench/scaling.py needs Ray: pip install 'kfbot[ray]'", file=sys.stderr)
        return 3
    return 0 if run_all(args) else 1


def run_all(args: argparse.Namespace) -> bool:
    task = softmax_task()
    cands = variants(args.candidates)
    with tempfile.TemporaryDirectory(prefix="kfbot-scaling-") as cache:
        settings = EngineSettings(cache_dir=Path(cache),
                                  timing={"max_trials": 30, "min_trials": 10})
        prebuild(task, settings, cands)
        runs: list[Callable[[], Row]] = [
            lambda: one_gpu(task, settings, cands),
            lambda: two_gpus(task, settings, cands),
            lambda: ray_row(task, settings, cands, args),
        ]
        rows = [run() for run in runs]
    return report(rows, args.chart)


def ray_row(task: KernelTask, settings: EngineSettings, cands: Sequence[Candidate],
            args: argparse.Namespace) -> Row:
    if args.address:
        return on_ray(task, settings, cands, args.address, args.ray_chunk)
    with local_ray_cluster(2) as address:
        return on_ray(task, settings, cands, address, args.ray_chunk)


if __name__ == "__main__":
    sys.exit(main())
