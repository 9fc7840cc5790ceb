"""The repository's references inside the worker: which one answers an input set, and
how its test compares (job payloads carry them as specs written by the engine)."""

from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from kfbot.evaluate.device.lenient import Leniency, leniency_of
from kfbot.evaluate.device.loading import Op, load_reference
from kfbot.evaluate.device.verify import InputSet
from kfbot.evaluate.reference.spec import belongs


def leniency(specs: Sequence[Mapping[str, Any]]) -> Leniency | None:
    """What the repository's test's own comparison accepts (its first reference's)."""
    return leniency_of(next((str(s.get("comparison") or "") for s in specs), ""))


def references_for(specs: Sequence[Mapping[str, Any]]) -> Callable[[InputSet], Op | None]:
    loaded = [(spec, load_reference(spec)) for spec in specs]

    def for_inputs(inputs: InputSet) -> Op | None:
        for spec, fn in loaded:
            via = inputs.via
            if spec.get("outer"):
                # Over the wrapper's arguments: usable on calls that came through it.
                if via is not None and via.outer == spec["outer"] and \
                        belongs(spec, _arity(fn), len(via.args), inputs.tests):
                    adapted = via.adapt(fn)
                    if adapted is not None:
                        return adapted
            elif belongs(spec, _arity(fn), len(inputs.args), inputs.tests):
                return fn
        return None

    return for_inputs


def _arity(fn: Op) -> int:
    try:
        return len(inspect.signature(fn).parameters)
    except (TypeError, ValueError):
        return -1
