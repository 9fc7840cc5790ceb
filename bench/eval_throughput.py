"""Evaluation throughput: 32 variants of a fixture kernel, end to end, on one GPU.

Each variant is built (cached objects, builds on every core), verified against the
reference on fresh inputs and benchmarked against the original. Printed: the one-off
set-up (original build, input capture, baseline check), the amortized seconds per
candidate, where the time goes, and in the same run the plain path that benchmark
suites use: one `torch.utils.cpp_extension.load_inline` build per variant, serially.

    python bench/eval_throughput.py [--variants 32] [--plain 2]
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from kfbot.config import load_config  # noqa: E402
from kfbot.evaluate.candidate import Candidate  # noqa: E402
from kfbot.evaluate.engine import Engine, EngineSettings  # noqa: E402
from kfbot.evaluate.task import make_task  # noqa: E402
from kfbot.scan.scanner import scan  # noqa: E402
from kfbot.scan.select import select_kernel  # noqa: E402

FIXTURE = ROOT / "fixtures" / "load_elementwise"
KERNEL_FILE = "csrc/gelu_kernel.cu"
BLOCKS = (32, 64, 96, 128, 160, 192, 224, 256, 320, 384, 448, 512, 640, 768, 896, 1024)


def variants(count: int) -> list[Candidate]:
    """Block-size variants, with and without restrict-qualified pointers."""
    source = (FIXTURE / KERNEL_FILE).read_text()
    out = []
    for restrict in (False, True):
        for block in BLOCKS:
            text = source.replace("constexpr int kBlockSize = 128;",
                                  f"constexpr int kBlockSize = {block};")
            if restrict:
                text = text.replace("(const float* x, float* y, int64_t n) {",
                                    "(const float* __restrict__ x, float* __restrict__ y, "
                                    "int64_t n) {", 1)
            out.append(Candidate(files={KERNEL_FILE: text}, origin="params",
                                 rationale=f"block {block}{' restrict' if restrict else ''}"))
    return out[:count]


def run_engine(count: int, cache: Path) -> None:
    config = load_config(None, FIXTURE)
    kernel = select_kernel(scan(FIXTURE, config).kernels, "gelu_kernel")
    settings = EngineSettings(cache_dir=cache, timing={"max_trials": 30, "min_trials": 10})
    with Engine(make_task(kernel, FIXTURE, config), settings) as engine:
        t0 = time.monotonic()
        engine.probe()
        base = engine.baseline()
        setup = time.monotonic() - t0
        assert base.ok, base.reason
        print(f"set-up (GPU probe, original build, input capture, baseline check): {setup:.1f} s")
        t1 = time.monotonic()
        results = list(engine.evaluate_many(variants(count)))
        total = time.monotonic() - t1
    ok = sum(ev.ok for _, ev in results)
    build = sum(ev.build_seconds for _, ev in results)
    print(f"{len(results)} variants end to end: {total:.1f} s wall, {ok} correct")
    print(f"amortized: {total / len(results):.2f} s per candidate "
          "(target <= 3 s on a 16-core, 1-GPU machine)")
    gpu = sum(ev.eval_seconds - ev.build_seconds for _, ev in results)
    print(f"  verify + benchmark, serial on the GPU: {gpu:.1f} s "
          f"({gpu / len(results):.2f} s per candidate)")
    print(f"  builds ran on all cores while the GPU worked; left on the critical path: "
          f"{build:.1f} s")
    best = max((ev for _, ev in results if ev.ok), key=lambda e: e.speedup or 0.0)
    print(f"  best variant: {best.speedup:.3f}x ({best.verdict})")


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
    times = []
    for i, candidate in enumerate(variants(count)):
        with tempfile.TemporaryDirectory() as tmp:
            src = Path(tmp) / "k.cu"
            src.write_text(candidate.files[KERNEL_FILE])
            build = Path(tmp) / "build"
            build.mkdir()
            out = subprocess.run([sys.executable, "-c", textwrap.dedent(PLAIN), str(src),
                                  f"plain_gelu_{i}", str(build)],
                                 capture_output=True, text=True, check=True)
            times.append(float(out.stdout.strip().splitlines()[-1]))
    mean = sum(times) / len(times)
    print(f"plain path (load_inline per variant, serial), {len(times)} variants: "
          f"{', '.join(f'{t:.1f}' for t in times)} s -> {mean:.1f} s per candidate")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--variants", type=int, default=32)
    parser.add_argument("--plain", type=int, default=2,
                        help="variants to build the plain way (each takes most of a minute)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="kfbot-throughput-") as cache:
        run_engine(args.variants, Path(cache))
    if args.plain:
        run_plain(args.plain)


if __name__ == "__main__":
    main()
