"""What the CUDA grammar cannot parse, set aside before parsing: kernel attributes.

tree-sitter-cuda knows `__launch_bounds__(...)` but not `__cluster_dims__(...)`,
`__maxnreg__(...)`, `__block_size__(...)` or `__align__(...)`: written between
`__global__` and a kernel's name they turn the definition into an error, and the
kernel is lost. They are blanked out (replaced by spaces, so that every byte offset and
line stays where it was) before the parse, and kept aside with their places so that a
kernel's report still shows them.
"""

from __future__ import annotations

import re

_ATTRIBUTE = re.compile(rb"\b(?:__cluster_dims__|__maxnreg__|__block_size__|__align__)\s*\(")
_QUICK = (b"__cluster_dims__", b"__maxnreg__", b"__block_size__", b"__align__")

Attribute = tuple[int, int, str]  # start byte, end byte, text as written


def blank_attributes(source: bytes) -> tuple[bytes, list[Attribute]]:
    """`source` with the unknown attributes blanked, and the attributes found."""
    if not any(word in source for word in _QUICK):  # nearly every file
        return source, []
    found: list[Attribute] = []
    out = bytearray(source)
    for match in _ATTRIBUTE.finditer(source):
        end = _closing(source, match.end())
        if end is None:
            continue
        text = source[match.start():end].decode("utf-8", errors="replace")
        found.append((match.start(), end, " ".join(text.split())))
        for i in range(match.start(), end):
            if out[i] not in (0x0A, 0x0D):  # keep line breaks: lines must not move
                out[i] = 0x20
    return bytes(out), found


def _closing(source: bytes, start: int) -> int | None:
    """The index after the parenthesis closing the one just before `start`."""
    depth = 1
    for i in range(start, min(len(source), start + 512)):
        byte = source[i]
        if byte == 0x28:
            depth += 1
        elif byte == 0x29:
            depth -= 1
            if depth == 0:
                return i + 1
    return None


def attributes_between(found: list[Attribute], start: int, end: int) -> tuple[str, ...]:
    """The attributes written from byte `start` up to `end` (a kernel's head)."""
    return tuple(text for s, _, text in found if start <= s < end)
