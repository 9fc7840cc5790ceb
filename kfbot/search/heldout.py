"""Held-out shapes: the committed candidate timed beyond the shapes it was chosen on.

The search picks its winner on the repository's captured shapes. Before it is
committed, the candidate is verified and timed once more on shapes none of them is:
each captured shape with its leading size a quarter and four times as large (within
the memory limit the other scaled inputs keep to), so a kernel tuned for 4096 rows is
also seen at 1024 and 16384. A candidate significantly slower than the original at a
held-out shape is not committed as it is: where the sizes it loses at lie above (or
below) those it wins at, a size dispatch keeps the original there (`dispatch.py`), is
evaluated at every shape, and is committed instead when it loses nowhere; otherwise
nothing is, and the report names the shapes.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from kfbot.evaluate.candidate import Candidate
from kfbot.evaluate.capture.signature import CallSignature, signature_key
from kfbot.evaluate.engine import Engine
from kfbot.evaluate.evaluation import Evaluation
from kfbot.evaluate.inputs.fresh import MAX_BEYOND_ELEMENTS, lead_size, resize
from kfbot.evaluate.task import KernelTask
from kfbot.search.dispatch import size_dispatches, split_of
from kfbot.search.pershape import held_out_slower, rows_of
from kfbot.search.rewrites import locate
from kfbot.text import read_source

DISPATCHED = ("the search's fastest candidate was slower than the original at held-out "
              "shapes: the committed one keeps the original there by a size dispatch, and "
              "was evaluated again at every shape")
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


class Evaluates(Protocol):
    """What a size dispatch needs of the engine (an `Engine`, or a test's stand-in)."""

    task: KernelTask

    def evaluate(self, candidate: Candidate) -> Evaluation: ...

    def evaluate_at(self, candidate: Candidate, signatures: Sequence[CallSignature]
                    ) -> Evaluation: ...

    def signatures(self) -> list[CallSignature]: ...


def dispatch_where_slower(engine: Evaluates, committed: tuple[Evaluation, Candidate],
                          held: Evaluation
                          ) -> tuple[tuple[Evaluation, Candidate], Evaluation] | str:
    """The committed candidate with a size dispatch to the original where it is slower,
    evaluated at the captured and the held-out shapes and faster or even at every one;
    or why there is none."""
    split = split_of([*committed[0].timings, *held.timings])
    if isinstance(split, str):
        return split
    task = engine.task
    original = {rel: read_source(task.root / rel, rel) for rel in task.editable_files
                if (task.root / rel).is_file()}
    files = {**original, **committed[1].files}
    home, _ = locate(files, [p for p in task.editable_files if p in files], task.kernel_name)
    if home is None:
        return f"{task.kernel_name} is not defined in exactly one editable file"
    made = size_dispatches(files, original, home, task.kernel_name, committed[1], split)
    if isinstance(made, str):
        return made
    tried = []
    for cand in made:
        ev = engine.evaluate(cand)
        if not ev.publishable:
            tried.append(f"`{cand.rationale}`: {ev.verdict or ev.stage} ({ev.reason})")
            continue
        again = engine.evaluate_at(cand, held_out_signatures(engine.signatures()))
        slower = held_out_slower(rows_of([], again.timings)) if again.ok else []
        if again.ok and not slower:
            return (ev, cand), again
        tried.append(f"`{cand.rationale}`: still slower at held-out shapes" if again.ok
                     else f"`{cand.rationale}`: {again.stage}: {again.reason}")
    return "no size dispatch was faster or even everywhere: " + "; ".join(tried)


def where_it_holds(engine: object, committed: tuple[Evaluation, Candidate] | None
                   ) -> tuple[tuple[Evaluation, Candidate] | None, Evaluation | None, str,
                              str | None]:
    """(what stays committed, its held-out evaluation, why none was made, why it is no
    longer committed): a candidate significantly slower than the original at a held-out
    shape is not committed without a size dispatch that keeps the original there."""
    if committed is None:
        return None, None, "", None
    if not isinstance(engine, Engine):
        return committed, None, "held-out shapes are timed only on the local GPU", None
    held = time_held_out(engine, committed[1])
    if held is None:
        return committed, None, "no captured shape has a size to scale", None
    if not held.ok:  # the original may fail there too: said, not held against it
        return committed, held, (f"held-out shapes not compared: {held.stage}: "
                                 f"{held.reason}"), None
    slower = held_out_slower(rows_of([], held.timings))
    if slower:
        dispatched = dispatch_where_slower(engine, committed, held)
        if not isinstance(dispatched, str):
            return (*dispatched, DISPATCHED, None)
        shapes = "; ".join(f"{r.shape}: {r.original_us:.2f} µs -> {r.candidate_us:.2f} µs"
                           for r in slower)
        return None, held, "", (f"`{committed[1].short}` is significantly slower than the "
                                f"original at held-out shapes ({shapes}), and {dispatched}")
    return committed, held, "", None
