"""The worker's state between candidates: numeric flags pinned, the device checked.

Three things one candidate could leave behind for the next, or for the reference that
judges it, and what the worker does about each:

- **Numeric flags.** `torch.backends.cuda.matmul.allow_tf32` is off by default while
  cuDNN's `allow_tf32` is on, and `set_float32_matmul_precision` changes both: a
  float32 reference computed under TF32 is not a float32 reference. Every job pins
  them (`pin_numerics`), the values go into the result's environment for both sides,
  and a candidate that changes one (its library can, from C++) is named
  (`flag_records`): the reference after it would have been computed under its flags.
- **A broken context.** A job starts by checking that the device still works
  (`stale_context`): an error a previous job left behind (a fault from work it left
  running) is answered with a fresh worker, not charged to the job that found it.
  It ends by waiting for the whole device (`settle`), so work a candidate left
  running is waited for, and a fault in it charged, while the candidate's job runs.
- **Any CUDA error.** Sticky errors raise and retire the worker already; any other
  CUDA error a call returned (a bad launch configuration, a cuBLAS status) also asks
  for a fresh worker after the job (`saw_cuda_error`): the context it leaves is not
  one the next candidate should be measured in.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

import torch

# What every job runs under: true float32 everywhere.
PINNED: dict[str, Any] = {
    "matmul_allow_tf32": False,
    "cudnn_allow_tf32": False,
    "float32_matmul_precision": "highest",
    "cudnn_benchmark": False,
}

# Error texts that name CUDA, cuBLAS or cuDNN, beyond the sticky kinds `worker` knows.
_CUDA_WORDS = ("cuda error", "cudaerror", "cublas_status", "cudnn_status",
               "invalid configuration argument", "too many resources requested",
               "no kernel image is available", "invalid device function",
               "illegal memory access", "misaligned address", "unspecified launch failure")


def numeric_flags() -> dict[str, Any]:
    """The flags as they are now."""
    return {
        "matmul_allow_tf32": bool(torch.backends.cuda.matmul.allow_tf32),
        "cudnn_allow_tf32": bool(torch.backends.cudnn.allow_tf32),
        "float32_matmul_precision": str(torch.get_float32_matmul_precision()),
        "cudnn_benchmark": bool(torch.backends.cudnn.benchmark),
    }


def pin_numerics() -> dict[str, Any]:
    """Set the flags to `PINNED` and return them as read back."""
    torch.set_float32_matmul_precision(PINNED["float32_matmul_precision"])
    torch.backends.cuda.matmul.allow_tf32 = PINNED["matmul_allow_tf32"]
    torch.backends.cudnn.allow_tf32 = PINNED["cudnn_allow_tf32"]
    torch.backends.cudnn.benchmark = PINNED["cudnn_benchmark"]
    return numeric_flags()


def changed_flags(pinned: Mapping[str, Any]) -> dict[str, tuple[Any, Any]]:
    """Flags that differ from `pinned`: name -> (pinned, now)."""
    now = numeric_flags()
    return {k: (v, now.get(k)) for k, v in pinned.items() if now.get(k) != v}


def flag_records(pinned: Mapping[str, Any], label: str) -> list[dict[str, Any]]:
    """A failed `numeric-flags` record when the candidate changed a pinned flag (the
    flags are pinned again, for whatever the job does next)."""
    changed = changed_flags(pinned)
    if not changed:
        return []
    pin_numerics()
    said = ", ".join(f"{k} {old!r} -> {new!r}" for k, (old, new) in sorted(changed.items()))
    return [{"input": label, "against": "reference", "passed": False, "check": "numeric-flags",
             "error": f"the candidate changed torch's numeric flags ({said}): the reference "
                      "computed after it would not be a true float32 reference",
             "comparisons": [], "run": "flags read after the candidate's calls"}]


def stale_context() -> str | None:
    """Why the device cannot be used as it is (an error left by an earlier job), or None.
    A tiny computation, waited for and read back."""
    try:
        probe = torch.arange(4, device="cuda", dtype=torch.float32).mul_(2).sum()
        torch.cuda.synchronize()
        value = float(probe.item())
    except RuntimeError as exc:
        return f"{type(exc).__name__}: {exc}"[:300]
    if value != 12.0:
        return f"the device computed 2 * (0 + 1 + 2 + 3) = {value}"
    return None


def settle() -> None:
    """Wait for the whole device: work still queued or running anywhere (a side stream,
    a thread's launch) finishes, or faults, inside the job that started it."""
    try:
        torch.cuda.synchronize()
    except RuntimeError as exc:
        raise RuntimeError(f"after the candidate's last call the device reports: {exc}") \
            from None


def is_cuda_error(text: str) -> bool:
    lowered = text.lower()
    return any(word in lowered for word in _CUDA_WORDS)


def saw_cuda_error(records: Iterable[Mapping[str, Any]]) -> bool:
    """Whether any check's error names CUDA: the worker is replaced after the job."""
    return any(is_cuda_error(str(r.get("error") or "")) for r in records)
