"""The per-shape picture (kfbot/search/outcome/pershape.py) and the held-out shapes
(kfbot/search/outcome/heldout.py): captured and held-out rows, bars, a Mermaid chart, the lines
for shapes where the candidate loses, and the scaled signatures."""

from __future__ import annotations

import random

from kfbot.evaluate.capture.signature import CallSignature
from kfbot.evaluate.evaluation import ShapeTiming
from kfbot.evaluate.verdict.stats import compare_times
from kfbot.search.outcome.heldout import held_out_signatures
from kfbot.search.outcome.pershape import (
    CAPTURED,
    HELD_OUT,
    held_out_slower,
    markdown,
    prompt_lines,
    rows_of,
)


def _timing(shape: str, original: float, candidate: float) -> ShapeTiming:
    base = [original * (1 + 0.001 * (i % 3 - 1)) for i in range(41)]  # median: original
    cand = [candidate * (1 + 0.001 * (i % 3 - 1)) for i in range(41)]
    return ShapeTiming(shape, compare_times(base, cand, random.Random(0)))


def test_rows_mark_captured_and_held_out_and_the_losses() -> None:
    captured = [_timing("(4096, 1024) float32", 400.0, 40.0)]
    held = [_timing("(4096, 1024) float32", 1.0, 1.0),  # a repeat of a captured one
            _timing("(1024, 1024) float32", 100.0, 20.0),
            _timing("(16384, 1024) float32", 1000.0, 1500.0)]
    rows = rows_of(captured, held, variants={"(1024, 1024) float32": 10.0})
    assert [(r.shape.split()[0], r.kind) for r in rows] == [
        ("(4096,", CAPTURED), ("(1024,", HELD_OUT), ("(16384,", HELD_OUT)]
    assert [r.shape for r in held_out_slower(rows)] == ["(16384, 1024) float32"]
    text = markdown(rows)
    assert "| `(4096, 1024) float32` | captured | 400.00 µs | 40.00 µs | 10.00x (" in text
    assert "`" + "█" * 20 + "`" in text  # the largest speedup has the full bar
    assert "```mermaid\nxychart-beta" in text and '"c1", "h2", "h3"' in text
    assert "bar [10.00, 5.00, 0.67]" in text
    assert ("- slower than the original at `(16384, 1024) float32` (held-out): 1000.00 µs -> "
            "1500.00 µs (0.67x)") in text
    assert ("- slower than the repository's own fastest variant at `(1024, 1024) float32` "
            "(held-out): 10.00 µs against 20.00 µs") in text
    assert prompt_lines(rows)[2].startswith("(16384, 1024) float32 (held-out): 0.67x [")


def _sig(rows: int, cols: int) -> CallSignature:
    return CallSignature.from_json({"op": "ops.softmax", "args": [
        {"kind": "tensor", "shape": [rows, cols], "dtype": "float32",
         "strides": [cols, 1], "contiguous": True, "device": "cuda:0"}],
        "kwargs": {}})


def test_held_out_shapes_scale_the_leading_size_down_and_up() -> None:
    sig = _sig(4096, 1024)
    shapes = [tuple(s.tensors()[0].shape) for s in held_out_signatures([sig])]
    assert shapes == [(1024, 1024), (16384, 1024)]
    # A shape the tests already use is not held out; too large ones are left out.
    small, huge = _sig(1024, 1024), _sig(65536, 4096)
    shapes = [tuple(s.tensors()[0].shape) for s in held_out_signatures([sig, small, huge])]
    # 4096 x 1024 down is 1024 x 1024, which the tests use; 65536 x 4096 down is over the
    # memory limit; a square shape scales both its sides.
    assert shapes == [(16384, 1024), (256, 256), (4096, 4096)]
