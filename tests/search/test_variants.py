"""The repository's own variants of the op (kfbot/search/outcome/variants.py): found as the other
ops of the extension its tests hold to the same reference, timed at the committed
candidate's shapes, and shown beside it per shape."""

from __future__ import annotations

import random
from collections.abc import Sequence
from pathlib import Path

from kfbot.config import load_config
from kfbot.evaluate.capture.signature import CallSignature, TensorSpec
from kfbot.evaluate.evaluation import ShapeTiming, shape_timings
from kfbot.evaluate.task import KernelTask, OpBinding, make_task
from kfbot.scan.scanner import scan
from kfbot.scan.select import select_kernel
from kfbot.search.outcome.pershape import markdown, rows_of
from kfbot.search.outcome.variants import variant_ops, variants_where_timed

REAL = Path(__file__).resolve().parents[2] / "fixtures" / "naive_real"


def _task(kernel: str) -> KernelTask:
    config = load_config(None, REAL)
    return make_task(select_kernel(scan(REAL, config).kernels, kernel), REAL, config)


def test_variants_are_the_ops_held_to_the_same_reference() -> None:
    assert variant_ops(_task("softmax_block_kernel")) == [
        OpBinding("module", "naive_real_ext", "softmax_v2")]
    assert variant_ops(_task("softmax_warp_kernel")) == [
        OpBinding("module", "naive_real_ext", "softmax")]
    assert variant_ops(_task("layernorm_kernel")) == []  # no other layer norm


def _timing(rows: int, original: float, speedup: float) -> ShapeTiming:
    sig = CallSignature("naive_real_ext.softmax",
                        (TensorSpec((rows, 1024), "float32", (1024, 1), True, "cuda"),))
    rng = random.Random(rows)
    base = [original + rng.gauss(0, 0.01) for _ in range(20)]
    [t] = shape_timings([{"input": f"({rows}, 1024) float32", "original_us": base,
                          "candidate_us": [b / speedup for b in base],
                          "signature": sig.to_json()}], 0, None)
    return t


class _Engine:
    def __init__(self) -> None:
        self.asked: list[tuple[list[str], list[int]]] = []

    def time_variants(self, variants: Sequence[OpBinding],
                      signatures: Sequence[CallSignature]) -> list[dict[str, float]]:
        self.asked.append(([v.name for v in variants],
                           [s.tensors()[0].shape[0] for s in signatures]))
        # softmax_v2 is 2x the original at 4096 rows, 20x at 16384; wrong at 64.
        return [{}, {"softmax_v2": 2.0}, {"softmax_v2": 20.0}]


def test_the_fastest_variant_beside_the_candidate_per_shape() -> None:
    task = _task("softmax_block_kernel")
    captured = [_timing(64, 10.0, 5.0), _timing(4096, 100.0, 10.0)]
    held = [_timing(16384, 400.0, 14.0)]
    engine = _Engine()
    found, note = variants_where_timed(engine, task, [*captured, *held])
    assert engine.asked == [(["softmax_v2"], [64, 4096, 16384])]
    assert note == "the repository's variants timed: `naive_real_ext.softmax_v2`"
    assert set(found) == {"(4096, 1024) float32", "(16384, 1024) float32"}
    assert abs(found["(16384, 1024) float32"] - 20.0) < 0.1  # 400 µs / 20
    text = markdown(rows_of(captured, held, found))
    assert "repository's best variant |" in text
    # 14x over the original, yet slower than the repository's own variant there.
    assert "- slower than the repository's own fastest variant at `(16384, 1024) float32` " \
           "(held-out): 20.00 µs against 28.57 µs" in text
    assert "variant at `(4096, 1024) float32`" not in text  # 10 µs: the candidate wins


def test_without_a_local_gpu_the_variants_are_not_timed() -> None:
    found, note = variants_where_timed(object(), _task("softmax_block_kernel"), [])
    assert found == {} and "only on the local GPU" in note
