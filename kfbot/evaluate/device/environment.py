"""The device a measurement was taken on, and its measured peaks."""

from __future__ import annotations

import functools
import os
import shutil
import subprocess
from typing import Any

import torch


def describe() -> dict[str, Any]:
    """The device's facts, for every result the worker sends back (a copy each time)."""
    return dict(_described())


@functools.cache
def _described() -> dict[str, Any]:
    # Read once per worker: a worker holds one GPU for life, and asking nvidia-smi
    # took about 25 ms, some 7% of an evaluation on an H100.
    props = torch.cuda.get_device_properties(0)
    return {
        "gpu": props.name,
        "sm_count": props.multi_processor_count,
        "l2_bytes": int(getattr(props, "L2_cache_size", 0)),
        "memory_bytes": int(props.total_memory),
        "capability": f"{props.major}.{props.minor}",
        "cuda": torch.version.cuda,
        "torch": torch.__version__,
        **_nvidia_smi(),
    }


def _nvidia_smi() -> dict[str, str]:
    """Driver version and the highest SM clock, when nvidia-smi is there."""
    exe = shutil.which("nvidia-smi")
    if exe is None:
        return {}
    query = "--query-gpu=driver_version,clocks.max.sm"
    try:
        out = subprocess.run(
            [exe, query, "--format=csv,noheader", "-i", _visible_gpu()],
            capture_output=True,
            text=True,
            timeout=10,
            check=True,
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return {}
    parts = [p.strip() for p in out.strip().splitlines()[0].split(",")] if out.strip() else []
    keys = ("driver", "sm_clock_max")
    return dict(zip(keys, parts, strict=False))


def _visible_gpu() -> str:
    """nvidia-smi's name for this process's device 0: the first visible GPU (an index
    or a UUID, both of which `-i` takes), since nvidia-smi ignores CUDA_VISIBLE_DEVICES."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",")[0].strip()
    return visible or "0"


def measured_peaks() -> dict[str, float]:
    """Device-to-device copy bandwidth (bytes/s) and matmul FLOP/s in float32 (TF32 off),
    float16 and bfloat16, measured now: the speed of light of a shape is read off them."""
    return {"bandwidth_bytes_per_s": _copy_bandwidth(),
            "fp32_flop_per_s": _matmul_flops(torch.float32),
            "fp16_flop_per_s": _matmul_flops(torch.float16),
            "bf16_flop_per_s": _matmul_flops(torch.bfloat16)}


def _copy_bandwidth() -> float:
    src = torch.empty(1 << 28, dtype=torch.float32, device="cuda")  # 1 GiB
    dst = torch.empty_like(src)
    return 2 * src.numel() * 4 / _best_seconds(lambda: dst.copy_(src))


def _matmul_flops(dtype: torch.dtype) -> float:
    a = torch.randn(8192, 8192, device="cuda", dtype=dtype)
    b = torch.randn(8192, 8192, device="cuda", dtype=dtype)
    tf32 = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = False  # true float32, as kfbot's workers run
    try:
        return 2 * 8192**3 / _best_seconds(lambda: torch.mm(a, b))
    finally:
        torch.backends.cuda.matmul.allow_tf32 = tf32


def _best_seconds(fn: Any, repeats: int = 5) -> float:
    fn()
    torch.cuda.synchronize()
    best = float("inf")
    for _ in range(repeats):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        best = min(best, start.elapsed_time(end) / 1e3)
    return best
