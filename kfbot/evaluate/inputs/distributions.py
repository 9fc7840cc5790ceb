"""Inputs a shortcut cannot pass: floating inputs redrawn from several distributions,
on a private seed schedule that differs between the phases of an evaluation.

The captured inputs say what a repository's tests feed an op, and a kernel that is only
right there (a softmax that skips the max subtraction is exact on `randn` rows and
infinite once a row spans more than about 88) passes them. So besides them, every
floating input of a checked call is redrawn from each of:

- `normal`: a normal of random location and scale (not the standard normal a
  closed-form answer would assume);
- `uniform`: a uniform over a random interval;
- `pareto`: heavy-tailed, a Lomax (Pareto II) with alpha 1.5, whose variance is
  infinite: a few values dwarf the rest;
- `wide`: magnitudes spread evenly over the exponents 2**-E..2**E (E = 20, 7 for
  float16), so every row spans the exponent range;
- `spikes`: a small normal with sparse large spikes (at least one per row), which a
  statistic computed on a strided subsample misses.

Integer, boolean and complex tensors, and every scalar, keep what `make_args` gives
them (the captured distribution and range: indices, masks and lengths stay valid).
Floating tensors keep their shape, strides, storage offset and device; of the
captured range only the sign is kept (an input recorded non-negative stays
non-negative, as a standard deviation or a probability must).

`SeedSchedule` derives every seed of an evaluation from one private root: the
correctness, warm-up and timed phases (and the repeated calls) each get their own
seeds and their own order of distributions, so nothing seen in one phase predicts
another. The root is drawn from the OS's secret source per run and never written out.

torch is imported only by the functions that make tensors.
"""

from __future__ import annotations

import hashlib
import math
import random
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

from kfbot.evaluate.capture.signature import (
    ArgSpec,
    CallSignature,
    SequenceSpec,
    TensorSpec,
    contiguous_strides,
)
from kfbot.evaluate.inputs.fresh import make_args, storage_extent

if TYPE_CHECKING:
    import torch

Phase = Literal["correctness", "warmup", "timed", "repeat"]
PHASES: tuple[Phase, ...] = ("correctness", "warmup", "timed", "repeat")
DISTRIBUTIONS = ("normal", "uniform", "pareto", "wide", "spikes")
PARETO_ALPHA = 1.5
# Exponent half-range of `wide`: float32 values up to about 1e6, whose cubes and
# squares a float32 original still holds; float16 stops at 65504.
WIDE_EXPONENT = {"float16": 7}
DEFAULT_WIDE_EXPONENT = 20
SPIKE_FRACTION = 1 / 256
# Spikes are 2**10..2**16 times the scale (at least 256): past 88, where exp
# overflows float32.
SPIKE_EXPONENTS = (10.0, 16.0)

Args = tuple[list[object], dict[str, object]]


@dataclass(frozen=True)
class SeedSchedule:
    """Every seed of one evaluation, from a private root."""

    root: int

    def seed(self, phase: Phase, index: int) -> int:
        """A 48-bit seed for the `index`-th input set of `phase`."""
        key = (self.root & (2**64 - 1)).to_bytes(8, "little")
        digest = hashlib.blake2b(f"{phase}:{index}".encode(), key=key, digest_size=6).digest()
        return int.from_bytes(digest, "little")

    def distributions(self, phase: Phase, count: int = len(DISTRIBUTIONS)) -> tuple[str, ...]:
        """`count` distribution names for `phase`: each of them once before any repeats,
        in an order of the schedule's own."""
        order = list(DISTRIBUTIONS)
        random.Random(self.seed(phase, -1)).shuffle(order)
        return tuple(order[i % len(order)] for i in range(count))


@dataclass(frozen=True)
class Draw:
    """The random parameters of one draw: location, scale and, per tensor, the sign
    domain; fixed by the seed, so two processes make the same inputs."""

    distribution: str
    location: float
    scale: float
    width: float  # uniform: the half-width, in units of `scale`


def draw_parameters(distribution: str, seed: int) -> Draw:
    if distribution not in DISTRIBUTIONS:
        raise ValueError(f"unknown distribution {distribution!r} (known: {DISTRIBUTIONS})")
    rng = random.Random(seed)
    scale = 2.0 ** rng.uniform(-2.0, 2.0)
    return Draw(distribution, rng.uniform(-2.0, 2.0), scale, 2.0 ** rng.uniform(-1.0, 2.0))


def draw_args(sig: CallSignature, seed: int, device: str, distribution: str) -> Args:
    """Arguments shaped like `sig` (as `make_args` makes them) whose floating tensors are
    drawn from `distribution` instead."""

    args, kwargs = make_args(sig, seed, device)
    params = draw_parameters(distribution, seed)
    gens: dict[str, torch.Generator] = {}
    redrawn_args = [_redraw(spec, value, params, seed, gens)
                    for spec, value in zip(sig.args, args, strict=True)]
    redrawn_kwargs = {name: _redraw(spec, kwargs[name], params, seed, gens)
                      for name, spec in sig.kwargs}
    return redrawn_args, redrawn_kwargs


def _redraw(spec: ArgSpec, value: Any, params: Draw, seed: int,
            gens: dict[str, torch.Generator]) -> Any:
    import torch

    if isinstance(spec, SequenceSpec) and isinstance(value, (list, tuple)):
        items = [_redraw(s, v, params, seed, gens) for s, v in zip(spec.items, value, strict=True)]
        return items if isinstance(value, list) else tuple(items)
    if not isinstance(spec, TensorSpec) or not isinstance(value, torch.Tensor) \
            or not value.is_floating_point():
        return value
    key = str(value.device)
    if key not in gens:  # one stream of values per device, apart from make_args' own
        gens[key] = torch.Generator(device=value.device).manual_seed(seed ^ 0xD157)
    return _placed(spec, value, params, gens[key])


def _placed(spec: TensorSpec, like: torch.Tensor, params: Draw, gen: torch.Generator
            ) -> torch.Tensor:
    """A tensor laid out as `like` (and as `spec` recorded it), values from `params`."""
    dense = spec.strides == contiguous_strides(spec.shape) and spec.storage_offset == 0
    sign = _sign_domain(spec)
    if dense:
        out = sample(params, spec.shape, like.dtype, like.device, gen, sign)
    else:
        size = spec.storage_offset + storage_extent(spec.shape, spec.strides)
        base = sample(params, (size,), like.dtype, like.device, gen, sign)
        out = base.as_strided(spec.shape, spec.strides, spec.storage_offset)
    if like.requires_grad:
        out.requires_grad_()
    return out


def _sign_domain(spec: TensorSpec) -> int:
    """+1: recorded non-negative, -1: non-positive, 0: both signs."""
    if spec.min is not None and spec.min >= 0:
        return 1
    if spec.max is not None and spec.max <= 0:
        return -1
    return 0


def sample(params: Draw, shape: Sequence[int], dtype: torch.dtype, device: torch.device,
           gen: torch.Generator, sign: int = 0) -> torch.Tensor:
    """Values of `shape` from the draw's distribution, in `dtype`, within its range."""
    import torch

    work = torch.float64 if dtype == torch.float64 else torch.float32
    shape = tuple(shape)
    x = _SAMPLERS[params.distribution](params, shape, work, device, gen, dtype)
    if sign:
        x = x.abs_() * sign
    limit = torch.finfo(dtype).max / 4
    return x.clamp_(-limit, limit).to(dtype)


def _normal(p: Draw, shape: tuple[int, ...], work: torch.dtype, device: torch.device,
            gen: torch.Generator, dtype: torch.dtype) -> torch.Tensor:
    import torch

    x = torch.randn(shape, generator=gen, device=device, dtype=work)
    return x.mul_(p.scale).add_(p.location * p.scale)


def _uniform(p: Draw, shape: tuple[int, ...], work: torch.dtype, device: torch.device,
             gen: torch.Generator, dtype: torch.dtype) -> torch.Tensor:
    import torch

    r = torch.rand(shape, generator=gen, device=device, dtype=work)
    half = p.width * p.scale
    return r.mul_(2 * half).add_(p.location * p.scale - half)


def _pareto(p: Draw, shape: tuple[int, ...], work: torch.dtype, device: torch.device,
            gen: torch.Generator, dtype: torch.dtype) -> torch.Tensor:
    """Lomax: scale * (U**(-1/alpha) - 1), with a random sign."""
    import torch

    u = torch.rand(shape, generator=gen, device=device, dtype=work).clamp_(min=1e-12)
    magnitude = u.pow_(-1.0 / PARETO_ALPHA).sub_(1.0).mul_(p.scale)
    return magnitude * _signs(shape, work, device, gen)


def _wide(p: Draw, shape: tuple[int, ...], work: torch.dtype, device: torch.device,
          gen: torch.Generator, dtype: torch.dtype) -> torch.Tensor:
    import torch

    span = WIDE_EXPONENT.get(str(dtype).removeprefix("torch."), DEFAULT_WIDE_EXPONENT)
    e = torch.rand(shape, generator=gen, device=device, dtype=work).mul_(2 * span).sub_(span)
    return torch.exp2(e) * _signs(shape, work, device, gen)


def _spikes(p: Draw, shape: tuple[int, ...], work: torch.dtype, device: torch.device,
            gen: torch.Generator, dtype: torch.dtype) -> torch.Tensor:
    """A small normal, plus spikes: each element with probability SPIKE_FRACTION, and
    one at a random place in every row (the last dimension)."""
    import torch

    x = torch.randn(shape, generator=gen, device=device, dtype=work).mul_(p.scale)
    if not shape or math.prod(shape) == 0:
        return x
    hit = torch.rand(shape, generator=gen, device=device, dtype=work) < SPIKE_FRACTION
    cols = shape[-1]
    rows = math.prod(shape) // cols
    where = torch.randint(0, cols, (rows,), generator=gen, device=device)
    flat = hit.view(rows, cols)
    flat[torch.arange(rows, device=device), where] = True
    lo, hi = SPIKE_EXPONENTS
    limit = math.log2(torch.finfo(dtype).max / 8 / max(p.scale, 1e-30))
    hi = min(hi, limit)
    lo = min(lo, hi)
    e = torch.rand(shape, generator=gen, device=device, dtype=work).mul_(hi - lo).add_(lo)
    spike = torch.exp2(e).mul_(p.scale) * _signs(shape, work, device, gen)
    return torch.where(hit, spike, x)


def _signs(shape: tuple[int, ...], work: torch.dtype, device: torch.device,
           gen: torch.Generator) -> torch.Tensor:
    import torch

    bits = torch.randint(0, 2, shape, generator=gen, device=device)
    return bits.to(work).mul_(2).sub_(1)


_SAMPLERS = {"normal": _normal, "uniform": _uniform, "pareto": _pareto, "wide": _wide,
             "spikes": _spikes}


def distribution_label(distribution: str, shape_label: str) -> str:
    """The input label a distribution's set carries in checks and reports."""
    return f"{distribution} {shape_label}"
