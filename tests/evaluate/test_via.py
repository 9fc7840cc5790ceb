"""A test's reference is over the wrapper it calls; kfbot verifies the op the wrapper
reaches. The capture records, for each op call made inside a wrapper call, which op
argument each wrapper argument became and which op arguments the wrapper returned;
the reference then judges the op's calls (`Via.adapt`) and the op's output is what
the wrapper returned (`Via.output`).

The package here is Python on CPU tensors, in this process: the op writes into `out`
and returns nothing, as kernel-builder ops do."""

from __future__ import annotations

import functools
import sys
from collections.abc import Iterator
from types import ModuleType

import pytest

from kfbot.evaluate.capture.protocol import CaptureRequest
from kfbot.evaluate.capture.recorder import Capture
from kfbot.evaluate.capture.signature import CallSignature, OpRef
from kfbot.evaluate.capture.via import Via, returned, trace

torch = pytest.importorskip("torch")


def _rms_ref(x: object, w: object, eps: float) -> object:
    return x * torch.rsqrt(x.pow(2).mean(dim=-1, keepdim=True) + eps) * w  # type: ignore[attr-defined]


@pytest.fixture
def package(monkeypatch: pytest.MonkeyPatch) -> Iterator[ModuleType]:
    """`kfvia_ext.rms(out, x, w, eps)` writes into out; `kfvia.rms_norm(x, w, eps)` and
    `kfvia.gelu_tanh` (a functools.partial) are the wrappers tests call."""
    ext = ModuleType("kfvia_ext")

    def rms(out: object, x: object, w: object, eps: float) -> None:
        out.copy_(_rms_ref(x, w, eps))  # type: ignore[attr-defined]

    def gelu(x: object, tanh: bool) -> object:
        return torch.nn.functional.gelu(x, approximate="tanh" if tanh else "none")

    ext.rms, ext.gelu = rms, gelu  # type: ignore[attr-defined]
    pkg = ModuleType("kfvia")

    def rms_norm(x: object, w: object, eps: float = 1e-6) -> object:
        out = torch.empty_like(x)
        sys.modules["kfvia_ext"].rms(out, x.contiguous(), w, eps)  # type: ignore[attr-defined]
        return out

    def fused_gelu(x: object, approximate: str = "none") -> object:
        return sys.modules["kfvia_ext"].gelu(x, approximate == "tanh")

    pkg.rms_norm = rms_norm  # type: ignore[attr-defined]
    pkg.fused_gelu = fused_gelu  # type: ignore[attr-defined]
    pkg.gelu_tanh = functools.partial(fused_gelu, approximate="tanh")  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "kfvia_ext", ext)
    monkeypatch.setitem(sys.modules, "kfvia", pkg)
    yield pkg


def capture(ops: list[str], outer: list[str]) -> Capture:
    request = CaptureRequest(tuple(map(OpRef.parse, ops)), "unused",
                             outer=tuple(map(OpRef.parse, outer)))
    found = Capture(request)
    found.install()
    return found


def only(found: Capture) -> CallSignature:
    (sig,) = found.result().signatures
    return sig


def test_an_out_parameter_op_inside_its_wrapper(package: ModuleType) -> None:
    found = capture(["kfvia_ext.rms"], ["kfvia:rms_norm"])
    try:
        x, w = torch.randn(4, 8), torch.randn(8)
        out = package.rms_norm(x, w, 1e-5)
    finally:
        found.uninstall()
    sig = only(found)
    assert sig.via == Via("kfvia:rms_norm", (1, 2, 3), (), (0,))
    assert CallSignature.from_json(sig.to_json()) == sig  # as cached and sent to the worker
    # The reference over the wrapper's arguments judges the op's call; the op's output
    # is the argument the wrapper returned.
    op_args = [torch.empty(4, 8).copy_(out), x, w, 1e-5]
    adapted = sig.via.adapt(_rms_ref)
    assert adapted is not None
    assert torch.allclose(adapted(*op_args), sig.via.output(op_args))


def test_a_partial_passes_a_value_the_op_gets_as_another(package: ModuleType) -> None:
    found = capture(["kfvia_ext.gelu"], ["kfvia:gelu_tanh", "kfvia:fused_gelu"])
    try:
        package.gelu_tanh(torch.randn(5))  # the partial calls fused_gelu, watched too
        package.fused_gelu(torch.randn(5), "tanh")
    finally:
        found.uninstall()
    vias = {s.via for s in found.result().signatures}
    # The outermost wrapper is the one the test called: the reference is over its
    # arguments. "tanh" reached the op as True: a value, kept, that no op argument is.
    assert vias == {Via("kfvia:gelu_tanh", (0,)), Via("kfvia:fused_gelu", (0, None),
                                                      ((1, "tanh"),))}
    ref = Via("kfvia:fused_gelu", (0, None), ((1, "tanh"),)).adapt(
        lambda x, approximate: torch.nn.functional.gelu(x, approximate=approximate))
    assert ref is not None
    x = torch.linspace(-2, 2, 5)
    assert torch.equal(ref(x, True), torch.nn.functional.gelu(x, approximate="tanh"))


def test_calls_outside_any_wrapper_have_no_via(package: ModuleType) -> None:
    found = capture(["kfvia_ext.gelu"], ["kfvia:rms_norm"])
    try:
        sys.modules["kfvia_ext"].gelu(torch.ones(2), False)
    finally:
        found.uninstall()
    assert only(found).via is None


def test_what_cannot_be_traced() -> None:
    x = torch.ones(3)
    # A copy is another tensor: the wrapper's argument reached the op nowhere, and a
    # reference that takes it cannot judge the op's calls.
    mapped, consts = trace([x], [x.clone()], lambda a, b: a is b)
    assert (mapped, consts) == ((None,), ())
    assert Via("w", mapped, consts).adapt(lambda t: t) is None
    assert returned(torch.zeros(1), [x]) == ()  # a new tensor, not one of the op's
    assert returned((x, x), [torch.ones(1), x]) == (1, 1)
