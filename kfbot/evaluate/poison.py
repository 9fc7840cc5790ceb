"""Poison: every free block of the GPU allocator's cache filled with a byte pattern.

Before a checked call the pattern leaves nothing but itself for the op's outputs to
land in, so an output element the op never writes cannot pass for a result. The
worker's probes (`kfbot.evaluate.device.probes`) do it before each verification call;
the observer does it inside the repository's test processes
(`kfbot.evaluate.capture.launch_recorder`) to see whether a test notices a kernel that
writes nothing. Imports torch, and nothing else of kfbot: both sides sit above it.
"""

from __future__ import annotations

import torch

POISON_NAN = 0xFF  # every float format reads 0xFF.. as NaN; integers read -1
POISON_FINITE = 0x7E  # float32 0x7E7E7E7E is about 8.4e37: finite, and far from any result
POISON_NAMES = {POISON_NAN: "NaN (0xFF bytes)", POISON_FINITE: "the 0x7E byte pattern"}
_SMALL_BLOCK = 1 << 20  # the caching allocator serves requests up to 1 MiB from 2 MiB segments
_MIN_LARGE = 64 << 20


def poison(byte: int, nbytes: int) -> None:
    """Leave every block the allocator could hand out filled with `byte`.

    Every free block in the cache is taken and filled: the blocks left in segments
    still in use (where the reference's or the original's freed outputs sit) and the
    wholly free segments alike. Fresh large and small blocks are added only when the
    cache holds too little free memory for the op's outputs, so the op's next
    allocations find nothing but the pattern and need no new segment, whose memory
    could hold anything. Nothing is released to the driver, which keeps this cheap
    enough to run before every checked call. The allocator's state is the host's, so
    nothing is waited for before the fills; they are waited for after, so the op is
    called on an idle GPU, as a verification call always is (a launcher that tests
    whether the stream is busy must see the same thing here as in the other checks).
    """
    free = _free_blocks()
    held = [torch.empty(part, dtype=torch.uint8, device="cuda")
            for size, small in free for part in _requests(size, small)]
    large = max(_MIN_LARGE, 2 * nbytes)
    if not any(size >= large for size, small in free if not small):
        held.append(torch.empty(large, dtype=torch.uint8, device="cuda"))
    small_free = sum(size for size, small in free if small)
    held += [torch.empty(_SMALL_BLOCK, dtype=torch.uint8, device="cuda")
             for _ in range(max(0, 4 - small_free // _SMALL_BLOCK))]
    for block in held:
        block.fill_(byte)
    torch.cuda.synchronize()
    del held  # back to the cache, contents kept


def _requests(size: int, small: bool) -> list[int]:
    """Allocation sizes that take a free block of `size`: a small-pool block larger than
    the small-pool limit (a wholly free 2 MiB segment) is taken in parts, since one
    request of its whole size would be served from the large pool instead."""
    if not small or size <= _SMALL_BLOCK:
        return [size]
    return [_SMALL_BLOCK] * (size // _SMALL_BLOCK) + ([size % _SMALL_BLOCK] if size % _SMALL_BLOCK
                                                      else [])


def _free_blocks() -> list[tuple[int, bool]]:
    """(size, in the small pool) of the cached blocks not in use, largest first. Asking
    for exactly a free block's size gets that block back: the allocator takes the
    smallest free block that fits, from the pool the size belongs to."""
    sizes = []
    for segment in torch.cuda.memory_snapshot():
        small = segment.get("segment_type") == "small"
        sizes += [(b["size"], small) for b in segment["blocks"] if b["state"] == "inactive"]
    return sorted(sizes, reverse=True)
