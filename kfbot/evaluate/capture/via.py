"""How a call of the op sat inside the call of the wrapper a test made.

Tests call a package's wrapper (`fused_gelu(x)`, `kb_norm.rms_norm(x, w, eps)`), and
their reference is written over the wrapper's arguments; kfbot verifies the op the
wrapper reaches (`_C.gelu_fwd(x, False)`, `ops.rms_norm(out, x, w, eps)`), over the op's.
The capture watches the wrapper too and, for each op call made inside it, records
which op argument each of the wrapper's arguments became (the same object, or a tensor
on the same memory), the wrapper's arguments that were not passed on (their values),
and which op arguments the wrapper returned (an op that writes into `out`). With that,
the reference over the wrapper's arguments becomes one over the op's (`adapt`), and the
op's output is what the wrapper returned.

This module imports neither torch nor pytest.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

Scalar = int | float | bool | str | None


@dataclass(frozen=True)
class Via:
    outer: str  # the wrapper, as an op reference's text ("fusedact:fused_gelu")
    args: tuple[int | None, ...]  # per wrapper argument: the op argument it became
    consts: tuple[tuple[int, Scalar], ...] = ()  # wrapper arguments not passed on
    result: tuple[int, ...] = ()  # the op arguments the wrapper returned, in order

    def key(self) -> tuple[object, ...]:
        return (self.outer, self.args, self.consts, self.result)

    def to_json(self) -> dict[str, object]:
        return {"outer": self.outer, "args": list(self.args),
                "consts": [[j, v] for j, v in self.consts], "result": list(self.result)}

    @staticmethod
    def from_json(data: Mapping[str, Any]) -> Via:
        return Via(str(data["outer"]),
                   tuple(None if i is None else int(i) for i in data.get("args", [])),
                   tuple((int(j), v) for j, v in data.get("consts", [])),
                   tuple(int(k) for k in data.get("result", [])))

    def adapt(self, reference: Callable[..., Any]) -> Callable[..., Any] | None:
        """`reference` (over the wrapper's arguments) as a reference over the op's;
        None when a wrapper argument it takes reached the op nowhere and has no value."""
        consts = dict(self.consts)
        if any(i is None and j not in consts for j, i in enumerate(self.args)):
            return None

        def adapted(*op_args: Any, **_: Any) -> Any:
            return reference(*(op_args[i] if i is not None else consts[j]
                               for j, i in enumerate(self.args)))

        return adapted

    def output(self, op_args: Sequence[Any]) -> Any:
        """The op's output as the wrapper returned it, from the op's arguments after
        the call (only for an op that returns nothing)."""
        picked = tuple(op_args[k] for k in self.result)
        return picked[0] if len(picked) == 1 else picked


def trace(outer_args: Sequence[Any], op_args: Sequence[Any],
          same: Callable[[Any, Any], bool]) -> tuple[tuple[int | None, ...],
                                                     tuple[tuple[int, Scalar], ...]]:
    """For each wrapper argument, the op argument it became (`same` decides), and the
    values of the plain ones that became none."""
    args: list[int | None] = []
    consts: list[tuple[int, Scalar]] = []
    for j, value in enumerate(outer_args):
        found = next((i for i, op_arg in enumerate(op_args) if same(value, op_arg)), None)
        args.append(found)
        if found is None and isinstance(value, (int, float, bool, str, type(None))):
            consts.append((j, value))
    return tuple(args), tuple(consts)


def answers_in_arguments(result: object) -> bool:
    """An op that returns nothing or a status (`int nearest_forward(...)` returning 1)
    answers in the arguments it was handed."""
    return result is None or isinstance(result, (bool, int))


def returned(result: Any, op_args: Sequence[Any]) -> tuple[int, ...]:
    """Which op arguments the wrapper returned (itself, or in a tuple or list), by
    identity; () when it returned anything else."""
    values = result if isinstance(result, (tuple, list)) else (result,)
    found = []
    for value in values:
        index = next((i for i, op_arg in enumerate(op_args) if op_arg is value), None)
        if index is None:
            return ()
        found.append(index)
    return tuple(found)
