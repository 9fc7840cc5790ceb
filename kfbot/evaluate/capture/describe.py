"""The record of one argument of a recorded call: a tensor's layout and the range of
its values, a scalar's value, a list's items (see `kfbot.evaluate.capture.signature`).

torch is imported only once the repository's code has imported it.
"""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING

from kfbot.evaluate.capture.signature import ArgSpec, ScalarSpec, SequenceSpec, TensorSpec

if TYPE_CHECKING:
    import torch

# Above this many elements the mean and spread are skipped: they need float64 passes.
STATS_MAX_ELEMENTS = 1 << 26
# Longer lists and deeper nesting are recorded as opaque "other" values.
MAX_SEQUENCE_ITEMS = 1024
MAX_DEPTH = 4
# min, max, mean, std, has NaN, has Inf
Stats = tuple[float | None, float | None, float | None, float | None, bool, bool]
_NO_STATS: Stats = (None, None, None, None, False, False)


def describe(value: object, depth: int = 0) -> ArgSpec:
    """The record of one argument."""
    if "torch" in sys.modules:
        import torch

        if isinstance(value, torch.Tensor):
            return describe_tensor(value)
        if isinstance(value, torch.dtype):
            return ScalarSpec("dtype", str(value).removeprefix("torch."))
        if isinstance(value, torch.device):
            return ScalarSpec("device", str(value))
    plain = _describe_plain(value)
    if plain is not None:
        return plain
    if isinstance(value, (list, tuple)) and len(value) <= MAX_SEQUENCE_ITEMS and depth < MAX_DEPTH:
        items = tuple(describe(item, depth + 1) for item in value)
        return SequenceSpec("list" if isinstance(value, list) else "tuple", items)
    return ScalarSpec("other", f"{type(value).__module__}.{type(value).__qualname__}")


def _describe_plain(value: object) -> ScalarSpec | None:
    # Subclasses (IntEnum, numpy's float64) are kept as the plain value they stand for.
    if value is None:
        return ScalarSpec("none")
    if isinstance(value, bool):  # before int: True is an int too
        return ScalarSpec("bool", value)
    if isinstance(value, int):
        return ScalarSpec("int", int(value))
    if isinstance(value, float):
        return ScalarSpec("float", float(value))
    if isinstance(value, str):
        return ScalarSpec("str", str(value))
    return None


def describe_tensor(t: torch.Tensor) -> ArgSpec:
    import torch

    if t.layout != torch.strided:
        return ScalarSpec("other", f"torch.Tensor({str(t.layout).removeprefix('torch.')})")
    try:
        lo, hi, mean, std, has_nan, has_inf = value_stats(t)
    except RuntimeError:  # a dtype without reductions (float8...): the layout still counts
        lo, hi, mean, std, has_nan, has_inf = _NO_STATS
    return TensorSpec(
        shape=tuple(t.shape),
        dtype=str(t.dtype).removeprefix("torch."),
        strides=tuple(t.stride()),
        contiguous=t.is_contiguous(),
        device=t.device.type,
        min=lo,
        max=hi,
        mean=mean,
        has_nan=has_nan,
        has_inf=has_inf,
        requires_grad=t.requires_grad,
        storage_offset=int(t.storage_offset()),
        std=std,
    )


def value_stats(t: torch.Tensor) -> Stats:
    """min, max, mean and standard deviation of the finite values, and whether NaN or
    Inf are present."""
    import torch

    if t.numel() == 0 or t.is_complex() or t.device.type == "meta" or _capturing(t):
        return _NO_STATS
    with torch.no_grad():
        x = t.detach()
        has_nan = has_inf = False
        if x.is_floating_point():
            has_nan = bool(torch.isnan(x).any())
            has_inf = bool(torch.isinf(x).any())
            if has_nan or has_inf:
                x = x[torch.isfinite(x)]
                if x.numel() == 0:
                    return (None, None, None, None, has_nan, has_inf)
        lo, hi = torch.aminmax(x)
        mean = std = None
        if x.numel() <= STATS_MAX_ELEMENTS:
            wide = x.double()
            mean = float(wide.mean())
            std = float(wide.std(correction=0))
        return (float(lo), float(hi), mean, std, has_nan, has_inf)


def _capturing(t: torch.Tensor) -> bool:
    # Reading a value back inside CUDA graph capture would break the capture.
    import torch

    return t.is_cuda and torch.cuda.is_current_stream_capturing()


def compiling() -> bool:
    # Inside torch.compile tracing the arguments are fakes: nothing to describe.
    if "torch" not in sys.modules:
        return False
    import torch

    return bool(torch.compiler.is_compiling())
