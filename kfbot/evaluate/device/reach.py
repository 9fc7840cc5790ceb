"""Worker job: the kernels each captured call launches on the original."""

from __future__ import annotations

import sys
from collections.abc import Mapping
from typing import Any

from kfbot.evaluate.capture.signature import CallSignature
from kfbot.evaluate.device.loading import load_op
from kfbot.evaluate.device.probes import kernel_identifier, launches
from kfbot.evaluate.inputs.fresh import make_args
from kfbot.evaluate.worker.session import cuda_error_kind


def reaching(payload: Mapping[str, Any]) -> dict[str, Any]:
    sys.path[:0] = [p for p in payload.get("sys_path", []) if p not in sys.path]
    original = load_op(payload["original"], payload["op"])
    seed = int(payload["seed"])
    launched: list[list[str]] = []
    for data in payload["signatures"]:
        args, kwargs = make_args(CallSignature.from_json(data), seed, "cuda")
        try:
            seen = launches(original, args, kwargs)
        except (RuntimeError, ImportError, AttributeError) as exc:
            if cuda_error_kind(str(exc)) is not None:
                raise
            launched.append([])  # this call raised or the profiler failed: nothing seen
            continue
        launched.append(sorted({kernel_identifier(k.name) for k in seen}))
    return {"launched": launched}
