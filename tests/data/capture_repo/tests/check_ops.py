"""Calls of the three ops with known shapes, layouts, dtypes and values."""

import math

import capture_ext
import pytest
import torch
from capture_ops import scale

torch.library.define("kfcap::twice", "(Tensor x) -> Tensor")


@torch.library.impl("kfcap::twice", "CPU")
def _twice_cpu(x):
    return x * 2


# Bound before any test runs: the capture must reach this reference too.
twice = torch.ops.kfcap.twice


def ramp(*shape):
    """Values evenly spaced over [-1, 1]."""
    return torch.linspace(-1, 1, math.prod(shape)).reshape(shape)


@pytest.mark.parametrize("shape", [(4, 8), (3, 5, 7)])
def test_scale_shapes(shape):
    x = ramp(*shape)
    torch.testing.assert_close(scale(x), x * 2.0)


def test_scale_again():
    x = torch.full((4, 8), 3.0)
    assert torch.equal(scale(x), torch.full((4, 8), 6.0))


def test_scale_kwargs():
    x = torch.arange(6, dtype=torch.float64).reshape(2, 3)
    out = scale(x, alpha=0.5)
    assert out.dtype == torch.float64
    assert torch.equal(out, x / 2)


def test_scale_transposed():
    x = torch.arange(32, dtype=torch.float32).reshape(8, 4).t()
    assert not x.is_contiguous()
    assert torch.equal(scale(x, 3.0), x * 3.0)


def test_scale_raises():
    with pytest.raises(TypeError):
        scale(object())


def test_twice():
    assert torch.equal(torch.ops.kfcap.twice(torch.ones(2, 3)), torch.full((2, 3), 2.0))


def test_twice_alias_transposed():
    x = torch.ones(3, 2).t()
    assert torch.equal(twice(x), torch.full((2, 3), 2.0))


def test_cube():
    x = torch.tensor([1.0, -2.0, 3.0], dtype=torch.float64)
    assert torch.equal(capture_ext.cube(x), x**3)
    assert capture_ext.cube(2) == 8
