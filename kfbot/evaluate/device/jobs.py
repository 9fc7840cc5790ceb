"""Worker entry points (`kfbot.evaluate.device.jobs:<name>`), called with a JSON payload.

Payload fields are written by `kfbot.evaluate.engine`; results go back as JSON.
"""

from __future__ import annotations

import importlib
import inspect
import sys
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch

from kfbot.evaluate.compare import Tolerance
from kfbot.evaluate.device import environment
from kfbot.evaluate.device.loading import Op, load_op, load_reference
from kfbot.evaluate.device.timing import TimingSettings, interleaved
from kfbot.evaluate.device.verify import InputSet, call, tensors, verify
from kfbot.evaluate.inputs import edge_signatures, make_args
from kfbot.evaluate.signature import CallSignature


def probe(payload: Mapping[str, Any]) -> dict[str, Any]:
    """Is there a CUDA GPU, and what is it."""
    if not torch.cuda.is_available():
        return {"cuda": False, "reason": f"torch {torch.__version__} sees no CUDA GPU"}
    info: dict[str, Any] = {"cuda": True, **environment.describe()}
    if payload.get("peaks"):
        info["peaks"] = environment.measured_peaks()
    return info


def evaluate(payload: Mapping[str, Any]) -> dict[str, Any]:
    sys.path[:0] = [p for p in payload.get("sys_path", []) if p not in sys.path]
    original = load_op(payload["original"], payload["op"])
    candidate = load_op(payload["candidate"], payload["op"]) if payload.get("candidate") else None
    references = _references(payload.get("references", []))
    overrides = {k: Tolerance(*v) for k, v in payload.get("tolerances", {}).items()}
    block = payload.get("block")
    signatures = [CallSignature.from_json(s) for s in payload.get("signatures", [])]
    seeds = list(payload["seeds"])
    checked = _input_sets(signatures, seeds, payload) + _edge_sets(
        signatures, seeds[0], block, original
    )
    result: dict[str, Any] = {
        "inputs": [s.label for s in checked],
        "environment": environment.describe(),
    }
    if payload.get("baseline"):
        result["baseline"] = verify(original, None, references, checked, overrides, block)
    if candidate is not None:
        result["verify"] = verify(candidate, original, references, checked, overrides, block)
        if payload.get("bench") and all(r["passed"] for r in result["verify"]):
            result["bench"] = _bench(original, candidate, signatures, seeds, payload["bench"])
    return result


def _references(specs: Sequence[Mapping[str, Any]]) -> Callable[[InputSet], Op | None]:
    loaded = [(spec, load_reference(spec)) for spec in specs]

    def for_inputs(inputs: InputSet) -> Op | None:
        for spec, fn in loaded:
            if spec.get("callable_ref") or _arity(fn) == len(inputs.args):
                return fn
        return None

    return for_inputs


def _arity(fn: Op) -> int:
    try:
        return len(inspect.signature(fn).parameters)
    except (TypeError, ValueError):
        return -1


def _input_sets(
    signatures: Sequence[CallSignature], seeds: Sequence[int], payload: Mapping[str, Any]
) -> list[InputSet]:
    sets = [
        InputSet(f"{_shape_label(sig)} seed#{i}", *make_args(sig, seed, "cuda"))
        for sig in signatures
        for i, seed in enumerate(seeds)
    ]
    declared = payload.get("declared") or {}
    if payload.get("inputs_ref") and declared.get("shapes"):
        sets += _declared_sets(str(payload["inputs_ref"]), declared, seeds)
    return sets


def _declared_sets(ref: str, declared: Mapping[str, Any], seeds: Sequence[int]) -> list[InputSet]:
    module, _, name = ref.partition(":")
    make = getattr(importlib.import_module(module), name)
    sets = []
    for shape in declared["shapes"]:
        for dtype in declared.get("dtypes") or ["float32"]:
            for i, seed in enumerate(seeds):
                torch.manual_seed(seed)
                args = list(make(tuple(shape), dtype))
                sets.append(InputSet(f"{tuple(shape)} {dtype} seed#{i} (declared)", args, {}))
    return sets


def _edge_sets(
    signatures: Sequence[CallSignature], seed: int, block: int | None, original: Op
) -> list[InputSet]:
    """Edge shapes the original accepts (size 1, odd, not a multiple of the block)."""
    sets = []
    for sig in signatures[:2]:
        for edge in edge_signatures(sig, block):
            inputs = InputSet(f"edge {_shape_label(edge)}", *make_args(edge, seed, "cuda"))
            try:
                call(original, inputs)
            except (RuntimeError, ValueError, TypeError) as exc:
                if "CUDA" in str(exc):
                    raise
                continue  # the op does not accept this shape
            sets.append(inputs)
    return sets


def _shape_label(sig: CallSignature) -> str:
    shapes = [str(tuple(a.shape)) for a in sig.args if hasattr(a, "shape")]
    dtypes = sorted({a.dtype for a in sig.args if hasattr(a, "dtype")})
    return f"{' x '.join(shapes) or 'scalars'} {'/'.join(dtypes)}".strip()


def _bench(
    original: Op,
    candidate: Op,
    signatures: Sequence[CallSignature],
    seeds: Sequence[int],
    settings: Mapping[str, Any],
) -> list[dict[str, Any]]:
    timing = TimingSettings(**settings.get("timing", {}))
    out = []
    for sig in signatures[: int(settings.get("max_shapes", 8))]:
        arg_sets = [make_args(sig, seed, "cuda") for seed in seeds]
        samples = interleaved(
            {"original": original, "candidate": candidate}, arg_sets, timing, seed=seeds[0]
        )
        out.append(
            {
                "input": _shape_label(sig),
                "bytes": _bytes(original, arg_sets[0]),
                "flops": _flops(settings.get("flops"), arg_sets[0]),
                "original_us": samples["original"],
                "candidate_us": samples["candidate"],
            }
        )
    return out


def _flops(expression: str | None, args: tuple[list[Any], dict[str, Any]]) -> float | None:
    """FLOPs of one call from the task's declared expression over `args`, if any."""
    if not expression:
        return None
    value = eval(expression, {"__builtins__": {}}, {"args": args[0]})  # the user's own config
    return float(value)


def _bytes(fn: Op, args: tuple[list[Any], dict[str, Any]]) -> int:
    """Bytes read and written by one call: inputs plus outputs (a simple estimate)."""
    ins = [a for a in [*args[0], *args[1].values()] if isinstance(a, torch.Tensor)]
    outs = [t for t in tensors(fn(*args[0], **args[1])) if isinstance(t, torch.Tensor)]
    return sum(t.numel() * t.element_size() for t in [*ins, *outs])
