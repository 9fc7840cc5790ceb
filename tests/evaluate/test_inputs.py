"""Inputs from recorded signatures: faithful layouts and ranges, and edge-size variants."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest
import torch

from kfbot.errors import KfbotError
from kfbot.evaluate.capture.signature import (
    ArgSpec,
    CallSignature,
    ScalarSpec,
    SequenceSpec,
    TensorSpec,
    contiguous_strides,
)
from kfbot.evaluate.inputs.fresh import (
    MAX_BEYOND_ELEMENTS,
    MAX_VARIANT_ELEMENTS,
    edge_signatures,
    large_signature,
    literal_signatures,
    make_args,
    scaled_signatures,
)


def spec(
    shape: tuple[int, ...],
    dtype: str = "float32",
    strides: tuple[int, ...] | None = None,
    lo: float | None = None,
    hi: float | None = None,
    offset: int = 0,
    requires_grad: bool = False,
) -> TensorSpec:
    strides = contiguous_strides(shape) if strides is None else strides
    contiguous = strides == contiguous_strides(shape) or math.prod(shape) <= 1
    return TensorSpec(
        shape,
        dtype,
        strides,
        contiguous,
        "cpu",
        lo,
        hi,
        requires_grad=requires_grad,
        storage_offset=offset,
    )


def call(*args: ArgSpec, **kwargs: ArgSpec) -> CallSignature:
    return CallSignature("m.op", args, tuple(sorted(kwargs.items())))


def shapes(sig: CallSignature) -> list[tuple[int, ...]]:
    return [t.shape for t in sig.tensors()]


# --- make_args ----------------------------------------------------------------------------

MIXED = call(
    spec((4, 8), lo=-2.0, hi=3.0),
    spec((4, 8), strides=(1, 4), lo=10.0, hi=11.0),  # a transposed (8, 4)
    spec((3, 3), "int64", strides=(4, 1), lo=5.0, hi=9.0, offset=1),  # a slice [:, 1:]
    spec((3, 4), "bool", strides=(0, 1)),  # expanded from (1, 4)
    spec((64,), "float16"),
    spec((2, 2), "float64", lo=-1e300, hi=1e300, requires_grad=True),
    ScalarSpec("int", 7),
    alpha=ScalarSpec("float", 0.5),
    dtype=ScalarSpec("dtype", "bfloat16"),
    parts=SequenceSpec("tuple", (spec((5,), "uint8"), ScalarSpec("none"))),
)


def test_make_args_reproduces_layouts_and_types() -> None:
    args, kwargs = make_args(MIXED, seed=0, device="cpu")
    tensors = [a for a in args if isinstance(a, torch.Tensor)]
    for t, want in zip(tensors, MIXED.tensors(), strict=False):
        assert tuple(t.shape) == want.shape
        assert str(t.dtype) == f"torch.{want.dtype}"
        assert tuple(t.stride()) == want.strides
        assert t.storage_offset() == want.storage_offset
        assert t.is_contiguous() == want.contiguous
        assert t.device.type == "cpu"
    assert args[-1] == 7
    assert kwargs["alpha"] == 0.5 and kwargs["dtype"] is torch.bfloat16
    parts = kwargs["parts"]
    assert isinstance(parts, tuple) and parts[1] is None
    assert parts[0].dtype == torch.uint8 and tuple(parts[0].shape) == (5,)
    assert tensors[5].requires_grad and not tensors[0].requires_grad


def test_make_args_reproduces_value_ranges() -> None:
    args, kwargs = make_args(MIXED, seed=1, device="cpu")
    a, transposed, ints, flags, half, wide = args[:6]
    assert isinstance(a, torch.Tensor) and isinstance(transposed, torch.Tensor)
    assert -2.0 <= float(a.min()) < float(a.max()) <= 3.0
    assert 10.0 <= float(transposed.min()) < float(transposed.max()) <= 11.0
    assert isinstance(ints, torch.Tensor) and set(ints.flatten().tolist()) <= {5, 6, 7, 8, 9}
    assert isinstance(flags, torch.Tensor) and flags.dtype == torch.bool
    # Unrecorded range: standard normal, so both signs and a spread near 1.
    assert isinstance(half, torch.Tensor) and float(half.min()) < 0 < float(half.max())
    assert 0.5 < float(half.float().std()) < 1.5
    assert isinstance(wide, torch.Tensor) and bool(torch.isfinite(wide).all())
    assert float(wide.detach().abs().max()) <= 1e300
    uint8 = kwargs["parts"][0]  # type: ignore[index]
    assert int(uint8.min()) >= 0 and int(uint8.max()) < 100


def test_recorded_spread_gives_normal_values_within_the_range() -> None:
    # A test's randn inputs: mean 0, std 1, extremes near +-4.5. Uniform over the
    # extremes would have std 2.6 and grow a float32 reduction's rounding with it.
    recorded = replace(spec((200_000,), lo=-4.5, hi=4.5), mean=0.0, std=1.0)
    (x,), _ = make_args(call(recorded), seed=3, device="cpu")
    assert isinstance(x, torch.Tensor)
    assert abs(float(x.mean())) < 0.02 and abs(float(x.std()) - 1.0) < 0.02
    assert float(x.min()) >= -4.5 and float(x.max()) <= 4.5
    shifted = replace(spec((50_000,), "float16", lo=1.0, hi=3.0), mean=2.0, std=5.0)
    (y,), _ = make_args(call(shifted), seed=3, device="cpu")
    assert isinstance(y, torch.Tensor) and y.dtype == torch.float16
    assert float(y.min()) == 1.0 and float(y.max()) == 3.0  # clipped to what was seen
    flat = replace(spec((100,), lo=0.5, hi=0.5), mean=0.5, std=0.0)
    (z,), _ = make_args(call(flat), seed=0, device="cpu")
    assert isinstance(z, torch.Tensor) and set(z.tolist()) == {0.5}


def test_integer_range_covers_both_ends() -> None:
    sig = call(spec((1000,), "int32", lo=-3.0, hi=2.0))
    (x,), _ = make_args(sig, seed=0, device="cpu")
    assert isinstance(x, torch.Tensor) and set(x.tolist()) == {-3, -2, -1, 0, 1, 2}


def test_make_args_is_deterministic_per_seed() -> None:
    first, _ = make_args(MIXED, seed=5, device="cpu")
    again, _ = make_args(MIXED, seed=5, device="cpu")
    other, _ = make_args(MIXED, seed=6, device="cpu")
    for x, y, z in zip(first[:6], again[:6], other[:6], strict=True):
        assert isinstance(x, torch.Tensor) and isinstance(y, torch.Tensor)
        assert isinstance(z, torch.Tensor)
        assert torch.equal(x, y)
        if x.dtype != torch.bool:  # a few random bits may agree by chance
            assert not torch.equal(x, z)


def test_make_args_refuses_what_it_cannot_make() -> None:
    with pytest.raises(KfbotError, match=r"type mylib\.Thing"):
        make_args(call(ScalarSpec("other", "mylib.Thing")), seed=0, device="cpu")
    with pytest.raises(KfbotError, match="unknown dtype"):
        make_args(call(spec((2,), "float99")), seed=0, device="cpu")


# --- edge_signatures -----------------------------------------------------------------------


def test_elementwise_variants() -> None:
    variants = edge_signatures(call(spec((1000,)), ScalarSpec("float", 2.0)), block=256)
    assert [shapes(v) for v in variants] == [[(1,)], [(257,)], [(999,)], [(511,)]]
    assert all(v.args[1] == ScalarSpec("float", 2.0) for v in variants)
    assert all(v.count == 0 and v.tests == () for v in variants)


def test_elementwise_variants_without_block() -> None:
    variants = edge_signatures(call(spec((1000,))), block=None)
    assert [shapes(v) for v in variants] == [[(1,)], [(999,)]]
    # 999 is odd already: only the size-1 variant is left.
    assert [shapes(v) for v in edge_signatures(call(spec((999,))), block=None)] == [[(1,)]]


def test_rowwise_variants_change_rows_and_columns() -> None:
    sig = call(spec((16, 1024)), spec((1024,)), ScalarSpec("int", 1024), ScalarSpec("int", 1))
    variants = edge_signatures(sig, block=256)
    assert [shapes(v)[0] for v in variants] == [
        (16, 1),
        (1, 1024),
        (16, 257),
        (257, 1024),
        (16, 1023),
        (15, 1024),
    ]
    for v in variants:
        cols = shapes(v)[0][1]
        # The bias and the explicit size follow the columns; the small int stays.
        assert shapes(v)[1] == (cols,)
        assert v.args[2:] == (ScalarSpec("int", cols), ScalarSpec("int", 1))


def test_matmul_variants_keep_k_shared() -> None:
    sig = call(spec((64, 128)), spec((128, 32)))
    variants = edge_signatures(sig, block=32)
    assert [shapes(v) for v in variants] == [
        [(64, 1), (1, 32)],  # K
        [(64, 128), (128, 1)],  # N
        [(1, 128), (128, 32)],  # M
        [(64, 33), (33, 32)],
        [(64, 128), (128, 33)],
        [(33, 128), (128, 32)],
    ]
    for v in variants:
        (a, b), _ = make_args(v, seed=0, device="cpu")
        assert isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor)
        assert tuple(torch.matmul(a, b).shape) == (a.shape[0], b.shape[1])


def test_variants_keep_layouts() -> None:
    sig = call(spec((4, 8), strides=(1, 4)), spec((4, 8), strides=(0, 1)))
    variants = edge_signatures(sig, block=4)
    by_shape = {tuple(shapes(v)): v for v in variants}
    transposed, expanded = by_shape[((4, 5), (4, 5))].tensors()
    assert transposed.strides == (1, 4) and not transposed.contiguous
    assert expanded.strides == (0, 1) and not expanded.contiguous
    one_row, _ = by_shape[((1, 8), (1, 8))].tensors()
    assert one_row.strides == (1, 1) and one_row.contiguous
    for v in variants:
        args, _ = make_args(v, seed=0, device="cpu")
        for t, want in zip(args, v.tensors(), strict=True):
            assert isinstance(t, torch.Tensor) and tuple(t.stride()) == want.strides


def test_variants_are_capped() -> None:
    huge = call(spec((2, 1 << 23)))
    variants = edge_signatures(huge, block=256)
    assert [shapes(v)[0] for v in variants] == [
        (2, 1),
        (1, 1 << 23),
        (2, 257),
        (2, (1 << 23) - 1),
        (2, 511),
    ]  # (257, 1 << 23) and (511, 1 << 23) would be far past the cap
    assert all(v.tensors()[0].numel <= MAX_VARIANT_ELEMENTS for v in variants)
    three = call(spec((64, 128)), spec((128, 32)), spec((32, 96)))
    assert len(edge_signatures(three, block=32)) == 6
    assert len(edge_signatures(three, block=32, max_variants=2)) == 2


def test_sizes_zero_and_one_never_change() -> None:
    assert edge_signatures(call(spec((0, 1))), block=32) == []
    assert edge_signatures(call(ScalarSpec("int", 64)), block=32) == []
    variants = edge_signatures(call(spec((0, 8))), block=None)
    assert [shapes(v) for v in variants] == [[(0, 1)], [(0, 7)]]


# --- beyond the captured sizes ---------------------------------------------------------


def test_scaled_variants_grow_the_leading_size_and_what_shares_it() -> None:
    rows = call(spec((4096, 1024)))
    assert [(f, shapes(v)) for f, v in scaled_signatures(rows)] == [
        (2, [(8192, 1024)]), (4, [(16384, 1024)])]
    mm = call(spec((64, 32)), spec((32, 16)), ScalarSpec("int", 64))
    (factor, two), _ = scaled_signatures(mm)
    assert factor == 2 and shapes(two) == [(128, 32), (32, 16)]
    assert two.args[2] == ScalarSpec("int", 128)
    assert scaled_signatures(call(spec((1,)))) == []  # nothing to scale
    huge = call(spec((1 << 24, 2)))
    assert scaled_signatures(huge) == []  # past the limit: left out, not shrunk


def test_the_large_shape_fills_the_budget_over_all_tensors() -> None:
    large = large_signature(call(spec((4096, 1024))))
    assert large is not None and shapes(large) == [(MAX_BEYOND_ELEMENTS // 1024, 1024)]
    square = large_signature(call(spec((512, 512)), spec((512, 512))))
    assert square is not None
    (a, b) = shapes(square)
    assert a == b and a[0] == a[1] and 2 * a[0] ** 2 <= MAX_BEYOND_ELEMENTS
    assert 2 * (a[0] + 1) ** 2 > MAX_BEYOND_ELEMENTS
    assert large_signature(call(spec((1 << 23, 2)))) is None  # x4 is already as large


def test_literal_variants_set_sizes_together_first() -> None:
    rows = call(spec((128, 1000)))
    variants = [shapes(v)[0] for v in literal_signatures(rows, (4096,))]
    assert variants == [(4096, 4096), (4096, 1000), (128, 4096)]
    both = [shapes(v)[0] for v in literal_signatures(rows, (4096, 1024))]
    assert set(both[:4]) == {(1024, 1024), (1024, 4096), (4096, 1024), (4096, 4096)}
    assert {(4096, 1000), (128, 1024)} <= set(both) and len(both) == 8
    assert literal_signatures(rows, (1 << 26,)) == []  # too large to verify
    assert len(literal_signatures(call(spec((3, 5, 7))), (2, 4, 8, 16))) == 12
    x, _ = make_args(literal_signatures(rows, (4096,))[0], 1, "cpu")
    assert isinstance(x[0], torch.Tensor) and tuple(x[0].shape) == (4096, 4096)
