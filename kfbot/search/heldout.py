"""Held-out shapes: the committed candidate timed beyond the shapes it was chosen on.

The search picks its winner on the repository's captured shapes. Before it is
committed, the candidate is verified and timed once more on shapes none of them is:
each captured shape with its leading size a quarter and four times as large (within
the memory limit the other scaled inputs keep to), so a kernel tuned for 4096 rows is
also seen at 1024 and 16384. A candidate significantly slower than the original at a
held-out shape is not committed: it would need a size dispatch that keeps the original
there, and the report names the shapes.
"""

from __future__ import annotations

from collections.abc import Sequence

from kfbot.evaluate.candidate import Candidate
from kfbot.evaluate.engine import Engine
from kfbot.evaluate.evaluation import Evaluation
from kfbot.evaluate.inputs import MAX_BEYOND_ELEMENTS, lead_size, resize
from kfbot.evaluate.signature import CallSignature, signature_key

FACTORS = ((1, 4), (4, 1))  # (multiply, divide) the leading size: down 4x, up 4x
MAX_HELD_OUT = 6


def held_out_signatures(captured: Sequence[CallSignature]) -> list[CallSignature]:
    """Scaled copies of the captured signatures that are none of them, fitting the
    memory limit, at most MAX_HELD_OUT."""
    seen = {signature_key(s) for s in captured}
    out: list[CallSignature] = []
    for sig in captured:
        lead = lead_size(sig)
        if lead is None:
            continue
        for up, down in FACTORS:
            size = lead * up // down
            if size < 1 or size == lead:
                continue
            variant = resize(sig, {lead: size})
            key = signature_key(variant)
            if key in seen or sum(t.numel for t in variant.tensors()) > MAX_BEYOND_ELEMENTS:
                continue
            seen.add(key)
            out.append(variant)
    return out[:MAX_HELD_OUT]


def time_held_out(engine: Engine, candidate: Candidate) -> Evaluation | None:
    """The candidate verified and timed at the held-out shapes, or None without any."""
    shapes = held_out_signatures(engine.signatures())
    if not shapes:
        return None
    return engine.evaluate_at(candidate, shapes)
