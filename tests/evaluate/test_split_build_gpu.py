"""Same kernel, same numbers: the fast and the full build of one candidate give the same
outputs, bit for bit, and the same speed within noise, on both torch layouts.

Each candidate is built twice by kfbot's builder: the fast way (its kernel alone,
linked to the host part of its unit) and whole. A fresh process loads both extensions
and calls each on the same inputs, then times them in turn with CUDA events. The
finalist is not built here: it runs the repository's own build (`setup.py`), which
the fast path never touches (kfbot.evaluate.finalist).
"""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from bench.layouts import LAYOUTS  # noqa: E402
from kfbot.config import load_config  # noqa: E402
from kfbot.evaluate.build import Builder, BuildResult  # noqa: E402
from kfbot.evaluate.engine import Engine, EngineSettings  # noqa: E402
from kfbot.evaluate.task import make_task  # noqa: E402
from kfbot.scan.scanner import scan  # noqa: E402
from kfbot.scan.select import select_kernel  # noqa: E402

pytestmark = pytest.mark.gpu

COMPARE = r"""
import importlib.machinery, importlib.util, json, statistics, sys, torch
def load(name, path):
    loader = importlib.machinery.ExtensionFileLoader(name, path)
    spec = importlib.util.spec_from_file_location(name, path, loader=loader)
    module = importlib.util.module_from_spec(spec)
    loader.exec_module(module)
    return module
fast, full = (load(n, p) for n, p in json.loads(sys.argv[1]))
same = []
for shape in [(1, 1), (7, 33), (128, 1000), (4096, 1024)]:
    x = torch.randn(shape, device="cuda")
    same.append(bool(torch.equal(fast.softmax(x), full.softmax(x))))
x = torch.randn(8192, 1024, device="cuda")
start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
times = {"fast": [], "full": []}
for _ in range(3):
    fast.softmax(x); full.softmax(x)
for _ in range(15):
    for name, module in (("fast", fast), ("full", full)):
        start.record()
        for _ in range(20):
            module.softmax(x)
        end.record()
        torch.cuda.synchronize()
        times[name].append(start.elapsed_time(end) / 20)
print(json.dumps({"same": same, "fast_ms": statistics.median(times["fast"]),
                  "full_ms": statistics.median(times["full"])}))
"""


NAMES = ("torch-files", "one-unit")


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[BuildResult, ...]]:
    """Per layout, its candidate built the fast way and whole: all four builds at once,
    by one builder (about as long as one full build)."""
    cache = tmp_path_factory.mktemp("split-gpu")
    builder = Builder(cache / "build")
    requests = []
    for name in NAMES:
        layout = LAYOUTS[name]
        config = load_config(None, layout.fixture)
        kernel = select_kernel(scan(layout.fixture, config).kernels, layout.kernel)
        task = make_task(kernel, layout.fixture, config)
        engine = Engine(task, EngineSettings(cache_dir=cache), builder=builder)
        request = engine.request(layout.candidates(32)[-1])  # every change at once
        requests += [replace(request, tag="fast"), replace(request, tag="full", kernel="")]
    found = builder.build_many(requests)
    return {name: (found[2 * i], found[2 * i + 1]) for i, name in enumerate(NAMES)}


@pytest.mark.parametrize("name", NAMES)
def test_fast_and_full_builds_agree_bit_for_bit_and_in_speed(
        name: str, built: dict[str, tuple[BuildResult, ...]]) -> None:
    fast, full = built[name]
    assert fast.ok and full.ok, [d.message for d in (*fast.diagnostics, *full.diagnostics)]
    assert fast.path == "fast" and full.path == "full"
    modules = [(b.module_name, str(b.artifact)) for b in (fast, full)]
    done = subprocess.run([sys.executable, "-c", COMPARE, json.dumps(modules)],
                          capture_output=True, text=True, timeout=600, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    found = json.loads(done.stdout.strip().splitlines()[-1])
    print(name, f"fast build {fast.seconds:.1f} s, full build {full.seconds:.1f} s", found)
    assert all(found["same"])
    assert abs(found["fast_ms"] / found["full_ms"] - 1.0) < 0.05
