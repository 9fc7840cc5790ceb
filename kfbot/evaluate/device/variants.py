"""Worker entry point `kfbot.evaluate.device.variants:time_variants`: the repository's
other versions of the op, each checked against the original and timed beside it.

A repository often keeps several kernels for one op (a first and a tuned softmax, the
tests calling both against the same reference). Where such a variant is faster than
the original, a candidate that beats the original may still lose to the repository's
own best, and the report should say so. Each variant is called with the same inputs
as the original on every shape; one whose output differs is not timed there (it is
another op after all, or one for other inputs); the others are timed with the second
timer, original and variant alternating, so the ratio of their medians is measured in
one session and can be applied to the original's time from the search's evaluation.

torch is imported here: this module runs inside the worker only.
"""

from __future__ import annotations

import statistics
import sys
from collections.abc import Mapping
from typing import Any

from kfbot.evaluate.device.loading import Op, load_op
from kfbot.evaluate.device.retime import RetimeSettings, measure, retime_shapes
from kfbot.evaluate.device.verify import InputSet, call, compare_outputs
from kfbot.evaluate.verdict.tolerances import Tolerance
from kfbot.evaluate.worker.session import cuda_error_kind


def time_variants(payload: Mapping[str, Any]) -> dict[str, Any]:
    sys.path[:0] = [p for p in payload.get("sys_path", []) if p not in sys.path]
    original = load_op(payload["original"], payload["op"])
    variants = {str(v["text"]): load_op(payload["original"], v) for v in payload["variants"]}
    overrides = {k: Tolerance(*v) for k, v in payload.get("tolerances", {}).items()}
    settings = RetimeSettings(**payload.get("retime", {}))
    shapes = []
    for shape in retime_shapes(payload):
        label, arg_sets, inputs = shape.label, shape.arg_sets, shape.inputs
        found: dict[str, Any] = {}
        for name, op in variants.items():
            wrong = _differs(op, original, inputs, overrides)
            if wrong is not None:
                found[name] = {"error": wrong}
                continue
            samples = measure({"original": original, "variant": op}, arg_sets, settings)
            found[name] = {"original_us": statistics.median(samples["original"]),
                           "variant_us": statistics.median(samples["variant"])}
        shapes.append({"label": label, "variants": found})
    return {"shapes": shapes}


def _differs(variant: Op, original: Op, inputs: InputSet,
             overrides: Mapping[str, Tolerance]) -> str | None:
    """Why the variant's output is not the original's on these inputs, or None."""
    try:
        comps = compare_outputs(call(variant, inputs), call(original, inputs), overrides, None)
    except (RuntimeError, ValueError, TypeError) as exc:
        if cuda_error_kind(str(exc)) is not None:
            raise  # a fault: the worker restarts, the search goes on without variants
        return f"{type(exc).__name__}: {exc}"[:300]
    bad = next((c for c in comps if not c.passed), None)
    return None if bad is None else (bad.description or "its output differs")[:300]
