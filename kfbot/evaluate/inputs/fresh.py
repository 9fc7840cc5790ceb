"""Fresh inputs shaped like a recorded call, and edge-case variants of that call.

`make_args(sig, seed, device)` builds new random arguments for a `CallSignature`:

- tensors get the recorded shape, dtype and strides (a non-contiguous layout is an
  `as_strided` view of a larger buffer, so transposes, slices and expanded dims come
  back as they were, storage offset included);
- floating values follow the recorded mean and standard deviation (normal, kept
  within the recorded [min, max]) when those were measured, else are uniform over the
  recorded [min, max], else standard normal: a test's `randn` inputs come back as
  `randn`, not as a uniform spread over their extremes, whose larger magnitudes would
  grow a float32 reduction's rounding past the tolerance the test chose; integers are
  uniform over the recorded range (else [0, 100));
  bools are random; NaN and Inf are not reproduced;
- scalars, dtypes and strings are the recorded values;
- devices: tensors go to `device`, except that a signature which mixed an accelerator
  with the CPU keeps its CPU tensors on the CPU (host-side arguments such as lengths).

The same signature and seed always give the same values on a given device.

`edge_signatures(sig, block)` derives variants whose sizes are the ones kernels get
wrong: 1, odd, and not a multiple of the block (`block + 1`, `2 * block - 1`). See
its docstring for how sizes shared between arguments are kept consistent.

Verification also goes beyond the sizes the tests used, where a kernel that
special-cases the tested shapes would be wrong: `scaled_signatures` (the leading size
times 2 and 4), `large_signature` (one large shape within a memory budget) and
`literal_signatures` (the sizes a candidate newly compares a size against, see
`kfbot.anticheat.sizes`). All follow `resize`'s rule for shared sizes.

torch is imported only by `make_args`.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Mapping
from dataclasses import replace
from typing import TYPE_CHECKING

from kfbot.errors import KfbotError
from kfbot.evaluate.capture.signature import (
    ArgSpec,
    CallSignature,
    ScalarSpec,
    SequenceSpec,
    TensorSpec,
    contiguous_strides,
    is_contiguous,
    signature_key,
)

if TYPE_CHECKING:
    import torch

# Integer tensors recorded without values get values from this range (half-open).
DEFAULT_INT_RANGE = (0, 100)
# A variant never makes a tensor larger than this, or than it was if already larger.
MAX_VARIANT_ELEMENTS = 1 << 24
DEFAULT_MAX_VARIANTS = 6
# Integer scalars this large that equal a tensor size are taken to be that size.
# Smaller ones are more often dims, flags or counts that must not move.
MIN_COUPLED_SCALAR = 8

Args = tuple[list[object], dict[str, object]]


# --- make_args ------------------------------------------------------------------------


def make_args(sig: CallSignature, seed: int, device: str) -> Args:
    """Fresh positional and keyword arguments for one call shaped like `sig`."""
    builder = _Builder(seed, device, keep_cpu=_mixes_devices(sig), op=sig.op)
    args = [builder.build(spec) for spec in sig.args]
    kwargs = {name: builder.build(spec) for name, spec in sig.kwargs}
    return args, kwargs


def _mixes_devices(sig: CallSignature) -> bool:
    devices = {t.device for t in sig.tensors()}
    return "cpu" in devices and len(devices) > 1


class _Builder:
    """Makes the arguments of one call, drawing from one generator per device."""

    def __init__(self, seed: int, device: str, keep_cpu: bool, op: str) -> None:
        self._seed = seed
        self._device = device
        self._keep_cpu = keep_cpu
        self._op = op
        self._generators: dict[str, torch.Generator] = {}

    def build(self, spec: ArgSpec) -> object:
        if isinstance(spec, TensorSpec):
            return self.tensor(spec)
        if isinstance(spec, SequenceSpec):
            items = [self.build(item) for item in spec.items]
            return items if spec.type == "list" else tuple(items)
        return self.scalar(spec)

    def place(self, recorded: str) -> str:
        return "cpu" if recorded == "cpu" and self._keep_cpu else self._device

    def generator(self, device: torch.device) -> torch.Generator:
        import torch

        key = str(device)
        if key not in self._generators:
            self._generators[key] = torch.Generator(device=device).manual_seed(self._seed)
        return self._generators[key]

    def tensor(self, spec: TensorSpec) -> torch.Tensor:
        import torch

        device = torch.device(self.place(spec.device))
        dtype = _dtype(spec.dtype, self._op)
        if any(s < 0 for s in spec.strides) or len(spec.strides) != len(spec.shape):
            raise KfbotError(f"{self._op}: cannot lay out a tensor with strides {spec.strides}")
        dense = spec.strides == contiguous_strides(spec.shape) and spec.storage_offset == 0
        if dense:
            out = fill(spec.shape, dtype, spec, device, self.generator(device))
        else:
            size = spec.storage_offset + storage_extent(spec.shape, spec.strides)
            base = fill((size,), dtype, spec, device, self.generator(device))
            out = base.as_strided(spec.shape, spec.strides, spec.storage_offset)
        if spec.requires_grad and (dtype.is_floating_point or dtype.is_complex):
            out.requires_grad_()
        return out

    def scalar(self, spec: ScalarSpec) -> object:
        import torch

        if spec.type == "dtype":
            return _dtype(str(spec.value), self._op)
        if spec.type == "device":
            recorded = torch.device(str(spec.value)).type
            return torch.device(self.place(recorded))
        if spec.type == "other":
            raise KfbotError(f"{self._op}: cannot make an argument of type {spec.value}")
        return spec.value


def _dtype(name: str, op: str) -> torch.dtype:
    import torch

    dtype = getattr(torch, name, None)
    if not isinstance(dtype, torch.dtype):
        raise KfbotError(f"{op}: unknown dtype {name!r}")
    return dtype


def storage_extent(shape: tuple[int, ...], strides: tuple[int, ...]) -> int:
    """How many elements a view with this shape and these strides spans."""
    if math.prod(shape) == 0:
        return 0
    return 1 + sum((n - 1) * s for n, s in zip(shape, strides, strict=True))


def fill(
    shape: tuple[int, ...],
    dtype: torch.dtype,
    spec: TensorSpec,
    device: torch.device,
    gen: torch.Generator,
) -> torch.Tensor:
    """A new tensor of `shape` with random values in the range `spec` recorded."""
    import torch

    if dtype == torch.bool:
        return torch.randint(0, 2, shape, generator=gen, device=device).bool()
    if dtype.is_complex:
        return torch.randn(shape, generator=gen, device=device, dtype=dtype)
    if dtype.is_floating_point:
        # Drawn in float32 (float64 for float64) and rounded: half and float8 types
        # have no generators of their own, and the range stays exact.
        work = torch.float64 if dtype == torch.float64 else torch.float32
        if spec.min is None or spec.max is None:
            return torch.randn(shape, generator=gen, device=device, dtype=work).to(dtype)
        if spec.mean is not None and spec.std is not None:
            x = torch.randn(shape, generator=gen, device=device, dtype=work)
            return x.mul_(spec.std).add_(spec.mean).clamp_(spec.min, spec.max).to(dtype)
        r = torch.rand(shape, generator=gen, device=device, dtype=work)
        # r*hi + (1-r)*lo cannot overflow where lo + r*(hi-lo) can.
        return (r * spec.max + (1 - r) * spec.min).to(dtype)
    lo, hi = _int_range(spec, dtype)
    return torch.randint(lo, hi + 1, shape, generator=gen, device=device, dtype=dtype)


def _int_range(spec: TensorSpec, dtype: torch.dtype) -> tuple[int, int]:
    """Inclusive bounds: the recorded range, else the default, within the dtype."""
    import torch

    if spec.min is not None and spec.max is not None:
        lo, hi = math.ceil(spec.min), math.floor(spec.max)
    else:
        lo, hi = DEFAULT_INT_RANGE[0], DEFAULT_INT_RANGE[1] - 1
    info = torch.iinfo(dtype)
    # randint's exclusive high must itself fit in the dtype.
    lo, hi = max(lo, info.min), min(hi, info.max - 1)
    return (lo, max(lo, hi))


# --- beyond the captured sizes ---------------------------------------------------------

SCALES = (2, 4)
# No tensor of a scaled or literal variant has more elements than this, and the
# tensors of the large shape have no more together: it is verified for every candidate,
# so it must stay cheap (a naive matmul's work grows with the cube of its sizes).
MAX_BEYOND_ELEMENTS = 1 << 25
MAX_LITERAL_VARIANTS = 12
# The label of an input set made by `literal_signatures`: the engine looks for it.
COMPARED_SIZE = "compared size"


def lead_size(sig: CallSignature) -> int | None:
    """The first size of 2 or more of the first tensor: the batch or row count."""
    for t in sig.tensors():
        for d in t.shape:
            if d >= 2:
                return d
    return None


def scaled_signatures(sig: CallSignature, factors: tuple[int, ...] = SCALES,
                      max_elements: int = MAX_BEYOND_ELEMENTS
                      ) -> list[tuple[int, CallSignature]]:
    """(factor, `sig` with its leading size times it), every dimension of that size with
    it, for each factor within the limit."""
    lead = lead_size(sig)
    if lead is None:
        return []
    made = [(f, resize(sig, {lead: lead * f})) for f in factors]
    return [(f, v) for f, v in made if _fits(v, max_elements)]


def large_signature(sig: CallSignature, max_elements: int = MAX_BEYOND_ELEMENTS
                    ) -> CallSignature | None:
    """`sig` with its leading size as large as `max_elements` (over all its tensors
    together) allows, when that is beyond the largest scaled variant; else None."""
    lead = lead_size(sig)
    if lead is None:
        return None

    def fits(size: int) -> bool:
        return sum(t.numel for t in resize(sig, {lead: size}).tensors()) <= max_elements

    low, high = lead * max(SCALES), lead * max(2, max_elements)
    if not fits(low + 1):
        return None
    while high - low > 1:  # the largest size that still fits
        mid = (low + high) // 2
        low, high = (mid, high) if fits(mid) else (low, mid)
    return resize(sig, {lead: low})


def literal_signatures(sig: CallSignature, sizes: tuple[int, ...],
                       max_elements: int = MAX_BEYOND_ELEMENTS,
                       max_variants: int = MAX_LITERAL_VARIANTS) -> list[CallSignature]:
    """`sig` with its sizes set to the given numbers, in every combination (several
    sizes at once first: `rows == 4096 && cols == 4096` needs both), within the limits."""
    symbols = _symbols(sig)
    wanted = [n for n in sorted(set(sizes)) if n >= 1]
    if not symbols or not wanted:
        return []
    choices = [(None, *wanted)] * len(symbols)
    combos = [c for c in itertools.islice(itertools.product(*choices), 4096)
              if any(v is not None for v in c)]
    combos.sort(key=lambda c: -sum(v is not None for v in c))
    out: list[CallSignature] = []
    seen = {signature_key(sig)}
    for combo in combos:
        mapping = {s: v for s, v in zip(symbols, combo, strict=True) if v is not None}
        variant = resize(sig, mapping)
        key = signature_key(variant)
        if key in seen or not _fits(variant, max_elements):
            continue
        seen.add(key)
        out.append(variant)
        if len(out) >= max_variants:
            break
    return out


def _fits(sig: CallSignature, max_elements: int) -> bool:
    return all(t.numel <= max_elements for t in sig.tensors())


# --- edge_signatures -----------------------------------------------------------------


def edge_signatures(
    sig: CallSignature, block: int | None, max_variants: int = DEFAULT_MAX_VARIANTS
) -> list[CallSignature]:
    """Up to `max_variants` variants of `sig` with sizes kernels often get wrong.

    The rule, so that the op still accepts what it gets:

    - A *symbol* is a size of 2 or more found in any tensor argument. Every dimension
      of that size, in every tensor, changes with it: a size shared between arguments
      (matmul's K in (M, K) and (K, N), a bias's N in (N,) next to (B, N)) stays
      shared. Sizes that merely happen to be equal change together too, which keeps
      the call valid at the cost of some coverage. Sizes 0 and 1 never change.
    - Integer arguments equal to a symbol of at least `MIN_COUPLED_SCALAR` change
      with it (ops often take a size explicitly); smaller integers stay.
    - Each symbol tries, in order: 1, `block + 1`, an odd size (`s - 1` for an even
      `s`), `2 * block - 1` (without a block: 1 and the odd size). Variants are taken
      round-robin over the symbols, last-dimension sizes first, then larger ones.
    - A variant is skipped when a tensor would grow past `MAX_VARIANT_ELEMENTS`
      elements (or past its recorded size, if that was larger already).
    - Layouts follow: contiguous stays contiguous, a transposed or expanded tensor
      keeps its dimension order and its zero strides (padding is not kept).

    Relations other than equality (an output of size 2N next to an input of size N)
    are not inferred; run the reference on each variant and drop those it rejects.
    Variants have count 0 and no tests: nothing called them.
    """
    symbols = _symbols(sig)
    choices = {size: _candidate_sizes(size, block) for size in symbols}
    variants: list[CallSignature] = []
    seen = {signature_key(sig)}
    rounds = max((len(c) for c in choices.values()), default=0)
    for step in range(rounds):
        for size in symbols:
            if step >= len(choices[size]):
                continue
            variant = resize(sig, {size: choices[size][step]})
            key = signature_key(variant)
            if key in seen or not _small_enough(sig, variant):
                continue
            seen.add(key)
            variants.append(variant)
            if len(variants) >= max_variants:
                return variants
    return variants


def _symbols(sig: CallSignature) -> list[int]:
    """The changeable sizes, in the order their variants are tried."""
    sizes = {d for t in sig.tensors() for d in t.shape if d >= 2}
    last = {t.shape[-1] for t in sig.tensors() if t.shape}
    return sorted(sizes, key=lambda s: (s not in last, -s))


def _candidate_sizes(size: int, block: int | None) -> list[int]:
    odd = [size - 1] if size % 2 == 0 else []
    blocks = (block + 1, 2 * block - 1) if block is not None and block >= 1 else ()
    wanted = [1, *blocks[:1], *odd, *blocks[1:]]
    return [n for n in dict.fromkeys(wanted) if n >= 1 and n != size]


def resize(sig: CallSignature, sizes: Mapping[int, int]) -> CallSignature:
    """`sig` with every dimension of size `old` made `sizes[old]`, layouts following."""
    return replace(
        sig,
        args=tuple(_resize_arg(a, sizes) for a in sig.args),
        kwargs=tuple((name, _resize_arg(a, sizes)) for name, a in sig.kwargs),
        count=0,
        tests=(),
    )


def _resize_arg(spec: ArgSpec, sizes: Mapping[int, int]) -> ArgSpec:
    if isinstance(spec, TensorSpec):
        return _resize_tensor(spec, sizes)
    if isinstance(spec, SequenceSpec):
        return replace(spec, items=tuple(_resize_arg(item, sizes) for item in spec.items))
    value = spec.value
    if spec.type != "int" or not isinstance(value, int) or isinstance(value, bool):
        return spec
    if value in sizes and value >= MIN_COUPLED_SCALAR:
        return replace(spec, value=sizes[value])
    return spec


def _resize_tensor(spec: TensorSpec, sizes: Mapping[int, int]) -> TensorSpec:
    shape = tuple(sizes.get(d, d) if d >= 2 else d for d in spec.shape)
    if shape == spec.shape:
        return spec
    strides = _restride(spec, shape)
    return replace(spec, shape=shape, strides=strides, contiguous=is_contiguous(shape, strides))


def _restride(spec: TensorSpec, shape: tuple[int, ...]) -> tuple[int, ...]:
    """Dense strides for `shape` in the recorded memory order of the dimensions."""
    if spec.contiguous:
        return contiguous_strides(shape)
    # Innermost first: the smallest stride, and of equal strides the later dim.
    order = sorted(range(len(shape)), key=lambda i: (spec.strides[i], -i))
    strides = [0] * len(shape)
    step = 1
    for i in order:
        if spec.strides[i] == 0 and spec.shape[i] != 1:
            continue  # an expanded dimension stays expanded
        strides[i] = step
        step *= shape[i]
    return tuple(strides)


def _small_enough(original: CallSignature, variant: CallSignature) -> bool:
    before = original.tensors()
    after = variant.tensors()
    return all(
        b.numel <= max(MAX_VARIANT_ELEMENTS, a.numel) for a, b in zip(before, after, strict=True)
    )
