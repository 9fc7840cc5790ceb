"""On a GPU: what kfbot publishes is reproduced from its patch alone, and a candidate
that special-cases a size the tests never call is caught at that size.

    pytest -m gpu -s tests/evaluate/test_reproduce_gpu.py      (a few minutes; prints its figures)
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

pytestmark = pytest.mark.gpu

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "fixtures" / "example"


def _bench() -> ModuleType:
    spec = importlib.util.spec_from_file_location("reproduce_check",
                                                  ROOT / "bench" / "reproduce_check.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["reproduce_check"] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


def test_the_published_patch_reproduces_within_five_percent(tmp_path: Path) -> None:
    bench = _bench()
    check = bench.run_check(tmp_path, budget=12)
    bench.show(check)  # the figures, for the record (pytest -s)
    assert not check.no_gpu
    assert check.problems == []
    assert check.pr["draft"] == bool((check.report["best"] or {}).get("needs_review"))


def test_a_special_case_for_an_untested_size_is_rejected_there(tmp_path: Path) -> None:
    root = tmp_path / "example"
    shutil.copytree(EXAMPLE, root)
    launch = "    if (rows == 0 || cols == 0) return cudaSuccess;\n"
    source = (root / "csrc" / "softmax.cu").read_text()
    candidate = tmp_path / "softmax.cu"
    candidate.write_text(source.replace(launch, launch + (
        "    const int64_t launched = (rows == 4096 && cols == 4096) ? rows / 2 : rows;\n"
        "    rows = launched;\n")))
    env = {**os.environ, "COLUMNS": "200"}
    done = subprocess.run([sys.executable, "-m", "kfbot", "verify", "softmax_kernel", "--repo",
                           str(root), "--candidate", str(candidate), "--json"],
                          capture_output=True, text=True, timeout=900, env=env, check=False)
    print(done.stdout[-4000:], done.stderr[-2000:])
    assert done.returncode == 1, done.stderr[-2000:]
    ev = json.loads(done.stdout)["candidate"]
    assert not ev["ok"] and ev["stage"] in ("correctness", "anticheat"), ev["reason"]
    assert "compared size (4096, 4096)" in ev["reason"]
    assert any(f["check"] == "size-literal" for f in ev["findings"])
