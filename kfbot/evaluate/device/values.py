"""How the values of an added input are drawn, by name (`Trial.values`).

"recorded" draws them as the repository's own calls had them (`inputs.make_args`:
the recorded range, mean and spread); each of `distributions.DISTRIBUTIONS` (normal,
uniform, pareto, wide, spikes) redraws the floating inputs from that distribution. A
check that wants other values registers a function here under the name its trials carry; its
inputs then pass through the same filter as every added input: tried on the original
first, left out of the contract where the original fails on them.
"""

from __future__ import annotations

from collections.abc import Callable

from kfbot.errors import KfbotError
from kfbot.evaluate.capture.signature import CallSignature
from kfbot.evaluate.inputs.contract import RECORDED, Trial
from kfbot.evaluate.inputs.distributions import DISTRIBUTIONS, SeedSchedule, draw_args
from kfbot.evaluate.inputs.fresh import Args, make_args

Values = Callable[[CallSignature, int, str], Args]  # (signature, seed, device) -> args

def _redrawn(name: str) -> Values:
    """Floating inputs drawn from distribution `name` (`evaluate.distributions`), from a
    seed of the name's own: trials that share the run's seed draw apart."""

    def make(sig: CallSignature, seed: int, device: str) -> Args:
        index = DISTRIBUTIONS.index(name)
        return draw_args(sig, SeedSchedule(seed).seed("correctness", index), device, name)

    return make


VALUES: dict[str, Values] = {RECORDED: make_args,
                             **{name: _redrawn(name) for name in DISTRIBUTIONS}}


def values_for(trial: Trial, seed: int, device: str) -> Args:
    """The call's arguments for `trial`, drawn the way it names."""
    make = VALUES.get(trial.values)
    if make is None:
        raise KfbotError(f"{trial.label}: no way to draw values named {trial.values!r} "
                         f"(known: {', '.join(sorted(VALUES))})")
    return make(trial.signature, seed, device)
