"""Capturing call signatures: the records, the pytest plugin, and the test run around it.

The end-to-end tests run the tiny repository under tests/data/capture_repo, whose tests
call a Python callable, a torch.library op and a module imported by name.
"""

from __future__ import annotations

import importlib
import json
import math
import os
import sys
import time
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from types import ModuleType

import pytest
import torch

import kfbot
from kfbot.errors import KfbotError
from kfbot.evaluate.capture.collect import (
    CaptureResult,
    capture_env,
    capture_signatures,
    kfbot_import_dir,
    read_results,
)
from kfbot.evaluate.capture.describe import describe
from kfbot.evaluate.capture.protocol import CaptureFile, CaptureRequest
from kfbot.evaluate.capture.recorder import Capture
from kfbot.evaluate.capture.signature import (
    ArgSpec,
    CallSignature,
    OpRef,
    ScalarSpec,
    SequenceSpec,
    TensorSpec,
    merge_signatures,
    signature_key,
)

REPO = Path(__file__).resolve().parents[1] / "data" / "capture_repo"
SCALE = "capture_ops:scale"
TWICE = "torch.ops.kfcap.twice"
CUBE = "capture_ext.cube"
OPS = [OpRef.parse(text) for text in (SCALE, TWICE, CUBE)]
CHECK = "tests/check_ops.py::"


def tensor(
    shape: tuple[int, ...],
    strides: tuple[int, ...],
    lo: float | None = None,
    hi: float | None = None,
    mean: float | None = None,
    dtype: str = "float32",
) -> TensorSpec:
    contiguous = strides == tuple(math.prod(shape[i + 1 :]) for i in range(len(shape)))
    return TensorSpec(shape, dtype, strides, contiguous, "cpu", lo, hi, mean)


def scalar(value: int | float | str | None) -> ScalarSpec:
    kind = {int: "int", float: "float", str: "str", type(None): "none"}[type(value)]
    return ScalarSpec(kind, value)  # type: ignore[arg-type]


def sig(
    op: str,
    *args: ArgSpec,
    tests: tuple[str, ...],
    count: int = 1,
    **kwargs: ArgSpec,
) -> CallSignature:
    return CallSignature(op, args, tuple(sorted(kwargs.items())), count, tests)


# --- records ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "kind", "module", "name"),
    [
        ("inline_softmax.softmax", "module", "inline_softmax", "softmax"),
        ("pkg.ext._C.rowsum", "module", "pkg.ext._C", "rowsum"),
        ("torch.ops.kfln.layernorm", "torch_op", "kfln", "layernorm"),
        ("square_ops:square", "callable", "square_ops", "square"),
        (" pkg.mod:func ", "callable", "pkg.mod", "func"),
    ],
)
def test_op_ref_parse(text: str, kind: str, module: str, name: str) -> None:
    ref = OpRef.parse(text)
    assert (ref.kind, ref.module, ref.name) == (kind, module, name)
    assert OpRef.parse(ref.text) == ref
    assert OpRef.from_json(ref.to_json()) == ref


@pytest.mark.parametrize(
    "text", ["softmax", "torch.ops.kfln", "torch.ops.a.b.default", "pkg:a.b", "1pkg:f", ":f"]
)
def test_op_ref_rejects(text: str) -> None:
    with pytest.raises(KfbotError, match="op "):
        OpRef.parse(text)


def test_signature_json_round_trip() -> None:
    original = sig(
        "m.f",
        replace(tensor((2, 3), (1, 2), -1.5, 2.0, 0.25), has_nan=True, storage_offset=4),
        SequenceSpec("list", (tensor((3,), (1,)), scalar(2))),
        SequenceSpec("tuple", (scalar(1.5), scalar("x"), scalar(None))),
        ScalarSpec("dtype", "float16"),
        tests=("t.py::a", "t.py::b"),
        count=3,
        eps=scalar(1e-5),
        flag=ScalarSpec("bool", True),
    )
    assert CallSignature.from_json(original.to_json()) == original
    file = CaptureFile((original,), (("m.f", 4),), (("m.f", 1),), ("oops",), ("m.f",))
    again = CaptureFile.from_json(file.to_json())
    assert again == file and again.calls == 4


def test_signature_from_bad_json() -> None:
    with pytest.raises(KfbotError, match="shape"):
        CallSignature.from_json({"op": "m.f", "args": [{"kind": "tensor", "shape": "4"}]})
    with pytest.raises(KfbotError, match="kind"):
        CallSignature.from_json({"op": "m.f", "args": [{"kind": "blob"}]})


def test_merge_ignores_values_and_sums_counts() -> None:
    a = sig("m.f", tensor((4,), (1,), -1.0, 1.0, 0.0), scalar(2), tests=("t::a",), count=3)
    b = sig("m.f", tensor((4,), (1,), 0.0, 5.0, 4.0), scalar(2), tests=("t::b", "t::a"))
    other_value = sig("m.f", tensor((4,), (1,)), scalar(3), tests=())
    other_layout = sig("m.f", tensor((4,), (2,)), scalar(2), tests=())
    assert signature_key(a) == signature_key(b)
    assert signature_key(a) != signature_key(other_value) != signature_key(other_layout)
    merged = merge_signatures([a, other_value, b, other_layout])
    assert [m.count for m in merged] == [4, 1, 1]
    first = merged[0].args[0]
    assert isinstance(first, TensorSpec)
    assert (first.min, first.max, first.mean) == (-1.0, 5.0, 1.0)  # mean weighted 3:1
    assert first.std is None  # neither side measured a spread
    assert merged[0].tests == ("t::a", "t::b")


def test_merge_pools_the_spread_of_both_samples() -> None:
    # 3 calls of N(0, 1) and 1 of N(4, 2): second moments 1 and 20, pooled 23/4,
    # less the pooled mean squared (1): 4.75.
    a = sig("m.f", replace(tensor((4,), (1,), -3.0, 3.0, 0.0), std=1.0), count=3, tests=())
    b = sig("m.f", replace(tensor((4,), (1,), -2.0, 10.0, 4.0), std=2.0), tests=())
    (merged,) = merge_signatures([a, b])
    spec = merged.args[0]
    assert isinstance(spec, TensorSpec) and spec.std == pytest.approx(math.sqrt(4.75))
    unmeasured = sig("m.f", tensor((4,), (1,), 0.0, 1.0, 0.5), tests=())
    only_a = merge_signatures([a, unmeasured])[0].args[0]
    assert isinstance(only_a, TensorSpec) and only_a.std == 1.0
    back = TensorSpec.from_json(spec.to_json())
    assert back == spec


# --- describing arguments ---------------------------------------------------------------


def test_describe_tensors() -> None:
    x = torch.tensor([[1.0, float("nan"), 3.0], [float("-inf"), -2.0, 4.0]])
    spec = describe(x)
    # The spread is the population standard deviation of the finite values.
    assert spec == TensorSpec((2, 3), "float32", (3, 1), True, "cpu", -2.0, 4.0, 1.5, True, True,
                              std=pytest.approx(math.sqrt(5.25)))
    sliced = describe(torch.arange(12).reshape(3, 4)[:, 1:])
    assert sliced == TensorSpec(
        (3, 3), "int64", (4, 1), False, "cpu", 1.0, 11.0, 6.0, storage_offset=1,
        std=pytest.approx(math.sqrt(426 / 9 - 36)),
    )
    expanded = describe(torch.ones(1, 4, dtype=torch.bool).expand(3, 4))
    assert expanded == TensorSpec((3, 4), "bool", (0, 1), False, "cpu", 1.0, 1.0, 1.0, std=0.0)
    grad = describe(torch.zeros(2, requires_grad=True))
    assert isinstance(grad, TensorSpec) and grad.requires_grad
    empty = describe(torch.empty(0, 3))
    assert empty == TensorSpec((0, 3), "float32", (3, 1), True, "cpu")


def test_describe_other_values() -> None:
    assert describe([torch.ones(2), 3]) == SequenceSpec(
        "list", (TensorSpec((2,), "float32", (1,), True, "cpu", 1.0, 1.0, 1.0, std=0.0),
                 scalar(3))
    )
    assert describe((1.5, "x", None, True)) == SequenceSpec(
        "tuple", (scalar(1.5), scalar("x"), scalar(None), ScalarSpec("bool", True))
    )
    assert describe(torch.float16) == ScalarSpec("dtype", "float16")
    assert describe(torch.device("cpu")) == ScalarSpec("device", "cpu")
    assert describe(object()) == ScalarSpec("other", "builtins.object")
    assert describe(torch.Size([2, 3])) == SequenceSpec("tuple", (scalar(2), scalar(3)))


# --- the plugin, in this process --------------------------------------------------------


def capture_of(*ops: str, max_calls: int = 500) -> Capture:
    request = CaptureRequest(tuple(OpRef.parse(op) for op in ops), "unused", max_calls)
    return Capture(request)


@pytest.fixture
def ops_module(monkeypatch: pytest.MonkeyPatch) -> ModuleType:
    """A module `kfcap_inproc` with a function `f`, and a module holding `f` by name."""
    module = ModuleType("kfcap_inproc")

    def f(x: object, k: int = 1) -> object:
        if x is None:
            raise ValueError("no input")
        return x

    module.f = f  # type: ignore[attr-defined]
    holder = ModuleType("kfcap_holder")
    holder.f = f  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "kfcap_inproc", module)
    monkeypatch.setitem(sys.modules, "kfcap_holder", holder)
    return module


def test_callable_wrapped_everywhere_and_restored(ops_module: ModuleType) -> None:
    original = ops_module.f
    holder = sys.modules["kfcap_holder"]
    capture = capture_of("kfcap_inproc:f")
    capture.install()
    try:
        assert ops_module.f is not original and holder.f is ops_module.f
        x = torch.ones(3)
        assert holder.f(x, k=2) is x  # the very object the op returned
        with pytest.raises(ValueError, match="no input"):
            ops_module.f(None)
    finally:
        capture.uninstall()
    assert ops_module.f is original and holder.f is original
    result = capture.result()
    assert result.op_calls == (("kfcap_inproc:f", 2),)
    assert result.raised_calls == (("kfcap_inproc:f", 1),)
    expected = TensorSpec((3,), "float32", (1,), True, "cpu", 1.0, 1.0, 1.0, std=0.0)
    assert result.signatures == (sig("kfcap_inproc:f", expected, tests=(), k=scalar(2)),)


def test_max_calls_caps_recording_not_counting(ops_module: ModuleType) -> None:
    capture = capture_of("kfcap_inproc:f", max_calls=2)
    capture.install()
    try:
        for i in range(5):
            ops_module.f(i)
    finally:
        capture.uninstall()
    result = capture.result()
    assert result.calls == 5
    assert [s.args for s in result.signatures] == [(scalar(0),), (scalar(1),)]


def test_module_imported_during_tests_is_wrapped(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "kfcap_late.py").write_text("def g(x):\n    return x + 1\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "kfcap_late", raising=False)
    capture = capture_of("kfcap_late.g")
    capture.install()
    try:
        late = importlib.import_module("kfcap_late")
        assert late.g(1) == 2
        assert type(late.__loader__).__name__ == "SourceFileLoader"  # ours is gone
    finally:
        capture.uninstall()
        sys.modules.pop("kfcap_late", None)
    assert capture.result().signatures == (sig("kfcap_late.g", scalar(1), tests=()),)


def test_extension_from_load_inline_is_wrapped(monkeypatch: pytest.MonkeyPatch) -> None:
    import torch.utils.cpp_extension as cpp

    def fake_load_inline(name: str, cpp_sources: str, **options: object) -> ModuleType:
        module = ModuleType(name)
        module.softmax = torch.softmax  # type: ignore[attr-defined]
        return module

    monkeypatch.setattr(cpp, "load_inline", fake_load_inline)
    capture = capture_of("fake_ext.softmax")
    capture.install()
    try:
        ext = cpp.load_inline(name="fake_ext", cpp_sources="")
        other = cpp.load_inline("other_ext", "")
        x = torch.zeros(2, 2)
        torch.testing.assert_close(ext.softmax(x, -1), torch.full((2, 2), 0.5))
        assert other.softmax is torch.softmax
    finally:
        capture.uninstall()
    assert cpp.load_inline is fake_load_inline
    spec = TensorSpec((2, 2), "float32", (2, 1), True, "cpu", 0.0, 0.0, 0.0, std=0.0)
    assert capture.result().signatures == (sig("fake_ext.softmax", spec, scalar(-1), tests=()),)


def test_torch_op_registered_later_is_wrapped() -> None:
    capture = capture_of("torch.ops.kfcapin.twice")
    capture.install()
    try:
        assert capture.result().found == ()
        library = torch.library.Library("kfcapin", "DEF")
        library.define("twice(Tensor x) -> Tensor")
        library.impl("twice", lambda x: x * 2, "CPU")
        capture.test_id = "t.py::test_twice"
        capture.refresh()
        out = torch.ops.kfcapin.twice(torch.ones(2))
        assert torch.equal(out, torch.full((2,), 2.0))
        assert str(torch.ops.kfcapin.twice.default) == "kfcapin.twice.default"
        # The overload is the op too: its calls are recorded under the op's name.
        out = torch.ops.kfcapin.twice.default(torch.ones(3))
        assert torch.equal(out, torch.full((3,), 2.0))
    finally:
        capture.uninstall()
    result = capture.result()
    assert result.found == ("torch.ops.kfcapin.twice",) and result.errors == ()
    two = TensorSpec((2,), "float32", (1,), True, "cpu", 1.0, 1.0, 1.0, std=0.0)
    three = TensorSpec((3,), "float32", (1,), True, "cpu", 1.0, 1.0, 1.0, std=0.0)
    assert result.signatures == (sig("torch.ops.kfcapin.twice", two, tests=("t.py::test_twice",)),
                                 sig("torch.ops.kfcapin.twice", three,
                                     tests=("t.py::test_twice",)))


def test_worker_files_are_merged(tmp_path: Path, ops_module: ModuleType) -> None:
    capture = capture_of("kfcap_inproc:f")
    capture.install()
    try:
        ops_module.f(1)
    finally:
        capture.uninstall()
    out = tmp_path / "capture.json"
    capture.write(out)
    capture.write(tmp_path / "capture.json.gw0")
    found = read_results(out)
    assert found is not None and found.calls == 2
    assert found.signatures == (sig("kfcap_inproc:f", scalar(1), tests=(), count=2),)
    assert read_results(tmp_path / "missing.json") is None


# --- end to end ---------------------------------------------------------------------------


@pytest.fixture(scope="module")
def repo_run() -> CaptureResult:
    return capture_signatures(REPO, ["tests"], OPS, timeout_s=300)


def means(signature: CallSignature) -> list[float | None]:
    return [t.mean for t in signature.tensors()]


def without_moments(signature: CallSignature) -> CallSignature:
    def strip(spec: ArgSpec) -> ArgSpec:
        return replace(spec, mean=None, std=None) if isinstance(spec, TensorSpec) else spec

    return replace(
        signature,
        args=tuple(map(strip, signature.args)),
        kwargs=tuple((k, strip(v)) for k, v in signature.kwargs),
    )


def test_run_records_every_signature(repo_run: CaptureResult) -> None:
    expected = [
        sig(
            SCALE,
            tensor((4, 8), (8, 1), -1.0, 3.0),
            count=2,
            tests=(CHECK + "test_scale_shapes[shape0]", CHECK + "test_scale_again"),
        ),
        sig(
            SCALE,
            tensor((3, 5, 7), (35, 7, 1), -1.0, 1.0),
            tests=(CHECK + "test_scale_shapes[shape1]",),
        ),
        sig(
            SCALE,
            tensor((2, 3), (3, 1), 0.0, 5.0, dtype="float64"),
            alpha=scalar(0.5),
            tests=(CHECK + "test_scale_kwargs",),
        ),
        sig(
            SCALE,
            tensor((4, 8), (1, 4), 0.0, 31.0),
            scalar(3.0),
            tests=(CHECK + "test_scale_transposed",),
        ),
        sig(TWICE, tensor((2, 3), (3, 1), 1.0, 1.0), tests=(CHECK + "test_twice",)),
        sig(
            TWICE, tensor((2, 3), (1, 2), 1.0, 1.0), tests=(CHECK + "test_twice_alias_transposed",)
        ),
        sig(CUBE, tensor((3,), (1,), -2.0, 3.0, dtype="float64"), tests=(CHECK + "test_cube",)),
        sig(CUBE, scalar(2), tests=(CHECK + "test_cube",)),
        sig(SCALE, scalar(1.5), tests=("tests/check_slow.py::test_quick",)),
        sig(SCALE, scalar(2), tests=("tests/check_zz_fail.py::test_fails",)),
    ]
    assert [without_moments(s) for s in repo_run.signatures] == expected
    got_means = [means(s) for s in repo_run.signatures]
    want_means = [[1.5], [0.0], [2.5], [15.5], [1.0], [1.0], [2 / 3], [], [], []]
    assert got_means == [pytest.approx(m, abs=1e-6) for m in want_means]
    # Constant tensors have no spread; the others all have one.
    stds = [t.std for s in repo_run.signatures for t in s.tensors()]
    assert all(x is not None and x >= 0 for x in stds)
    assert [x == 0 for x in stds] == [t.min == t.max for s in repo_run.signatures
                                      for t in s.tensors()]
    assert not repo_run.signatures[3].tensors()[0].contiguous


def test_run_counts_calls(repo_run: CaptureResult) -> None:
    assert repo_run.calls == 12
    assert repo_run.op_calls == ((SCALE, 8), (TWICE, 2), (CUBE, 2))
    # scale(object()) raised inside pytest.raises: counted, but no signature.
    assert repo_run.raised_calls == ((SCALE, 1), (TWICE, 0), (CUBE, 0))


def test_run_keeps_behaviour_and_reports_the_failure(repo_run: CaptureResult) -> None:
    # Every test of the repository asserts its op's result; only the planted one fails,
    # and the results were written all the same. Each file ran in its own process.
    tails = [run.ran.tail.strip().splitlines()[-1] for run in repo_run.runs]
    assert [run.target for run in repo_run.runs] == [
        "tests/check_ops.py", "tests/check_slow.py", "tests/check_zz_fail.py"]
    assert [t.split(" in ")[0] for t in tails] == ["9 passed", "1 passed, 1 skipped", "1 failed"]
    assert "1 failed" in repo_run.output_tail
    assert repo_run.exit_code == 1 and not repo_run.timed_out and not repo_run.ok
    assert repo_run.errors == ("the tests in tests/check_zz_fail.py failed (pytest exit code 1)",)


def test_timeout_kills_the_run_and_keeps_what_it_saw() -> None:
    started = time.monotonic()
    result = capture_signatures(
        REPO, ["tests/check_slow.py"], OPS, timeout_s=8, extra_env={"KFCAP_SLOW": "1"}
    )
    assert time.monotonic() - started < 30
    assert result.timed_out and result.exit_code < 0
    assert "did not finish in 8 s" in result.errors[0]
    # The quick test finished before the slow one hung, and its call was written then.
    assert result.signatures == (
        sig(SCALE, scalar(1.5), tests=("tests/check_slow.py::test_quick",)),
    )


def test_run_without_calls_is_reported() -> None:
    result = capture_signatures(REPO, ["tests/check_zz_fail.py"], [OpRef.parse(CUBE)])
    assert result.exit_code == 1 and result.calls == 0 and not result.signatures
    assert "the tests never called the ops" in result.errors
    assert f"{CUBE}: never found while the tests ran" in result.errors


def test_missing_targets_raise() -> None:
    with pytest.raises(KfbotError, match=r"'tests/nope\.py' not found"):
        capture_signatures(REPO, ["tests/nope.py"], OPS)
    with pytest.raises(KfbotError, match="cannot find the targets"):
        capture_signatures(REPO, ["tests/check_slow.py::test_nope"], OPS)
    with pytest.raises(KfbotError, match="at least one op"):
        capture_signatures(REPO, ["tests"], [])


def test_missing_pytest_raises(tmp_path: Path) -> None:
    bare = tmp_path / "bare-python"
    # -S: no site-packages, so no pytest, whatever this machine has installed.
    bare.write_text(f'#!/bin/sh\nexec "{sys.executable}" -S "$@"\n')
    bare.chmod(0o755)
    with pytest.raises(KfbotError, match="pytest is not installed"):
        capture_signatures(REPO, ["tests"], OPS, python=str(bare))
    with pytest.raises(KfbotError, match="no Python at"):
        capture_signatures(REPO, ["tests"], OPS, python=str(tmp_path / "none"))


def test_environment(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("KFCAP_API_TOKEN", "s3cret")
    monkeypatch.setenv("PYTHONPATH", "/somewhere")
    request = CaptureRequest(tuple(OPS), "/tmp/out.json")
    env = capture_env(request, {"EXTRA": "1", "MY_PASSWORD": "x"}, kfbot_import_dir(tmp_path))
    assert "KFCAP_API_TOKEN" not in env and "MY_PASSWORD" not in env and env["EXTRA"] == "1"
    assert CaptureRequest.from_json(json.loads(env["KFBOT_CAPTURE"])) == request
    # kfbot alone is added in front: its parent folder may hold another torch.
    first, rest = env["PYTHONPATH"].split(os.pathsep)
    assert rest == "/somewhere" and os.listdir(first) == ["kfbot"]
    assert (Path(first) / "kfbot").resolve() == Path(kfbot.__file__).resolve().parent


@pytest.fixture(autouse=True)
def _no_capture_leak() -> Iterator[None]:
    # The in-process tests must leave no wrapper or import hook behind.
    hooks = list(sys.meta_path)
    yield
    assert sys.meta_path == hooks
