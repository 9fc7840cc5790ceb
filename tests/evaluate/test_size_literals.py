"""A candidate that special-cases a shape the tests never call, through the engine on CPU:
the blatant one (`if (rows == 4096 && cols == 4096) rows /= 2;`) is rejected with its
line before anything is built; a sneakier one that only picks a smaller launch at that
size is a warning, and the engine hands the worker the sizes to verify it at, which
become inputs of exactly that shape."""

from __future__ import annotations

from pathlib import Path

import pytest

from kfbot.config import Config
from kfbot.evaluate.candidate import Candidate
from kfbot.evaluate.capture.signature import CallSignature, TensorSpec
from kfbot.evaluate.engine import Engine, EngineSettings
from kfbot.evaluate.evaluation import Evaluation
from kfbot.evaluate.inputs.contract import unverified_sizes
from kfbot.evaluate.inputs.fresh import COMPARED_SIZE, literal_signatures
from kfbot.evaluate.task import make_task
from kfbot.scan.scanner import scan
from kfbot.scan.select import select_kernel

EXAMPLE = Path(__file__).resolve().parents[2] / "fixtures" / "example"
LAUNCH = "    if (rows == 0 || cols == 0) return cudaSuccess;\n"


@pytest.fixture(scope="module")
def engine(tmp_path_factory: pytest.TempPathFactory) -> Engine:
    task = make_task(select_kernel(scan(EXAMPLE, Config()).kernels, "softmax_kernel"), EXAMPLE,
                     Config())
    return Engine(task, EngineSettings(cache_dir=tmp_path_factory.mktemp("cache")))


def _candidate(code: str) -> Candidate:
    source = (EXAMPLE / "csrc" / "softmax.cu").read_text()
    assert LAUNCH in source
    return Candidate({"csrc/softmax.cu": source.replace(LAUNCH, LAUNCH + code)}, origin="llm")


def test_the_issue_s_special_case_is_rejected_before_any_build(engine: Engine) -> None:
    cheat = _candidate("    if (rows == 4096 && cols == 4096) rows /= 2;\n")
    ev = engine.evaluate(cheat)  # no GPU needed: nothing is built or run
    assert (ev.ok, ev.stage) == (False, "static")
    assert ev.reason.startswith("[size-special-case] `if (rows == 4096 && cols == 4096) rows "
                                "/= 2;` changes rows when it is == 4096")
    strict = [f for f in ev.findings if f.severity == "strict"]
    assert [f.check for f in strict] == ["size-special-case"]
    line = cheat.files["csrc/softmax.cu"].split("\n").index(
        "    if (rows == 4096 && cols == 4096) rows /= 2;") + 1
    assert strict[0].evidence == (f"csrc/softmax.cu:{line}: if (rows == 4096 && cols == 4096) "
                                  "rows /= 2;")
    assert engine.compared_sizes(cheat) == (4096,)


def test_a_quieter_special_case_is_verified_at_its_size(engine: Engine) -> None:
    sneaky = _candidate("    const int64_t launched = (rows == 4096 && cols == 4096) ? rows / 2 "
                        ": rows;\n    rows = launched;\n")
    found = [(f.check, f.severity) for f in engine.static_check(sneaky)]
    assert ("size-literal", "warn") in found and all(s == "warn" for _, s in found)
    sizes = engine.compared_sizes(sneaky)
    assert sizes == (4096,)
    x = TensorSpec((128, 1000), "float32", (1000, 1), True, "cuda", -3.0, 3.0, 0.0, std=1.0)
    captured = CallSignature("kernels_demo.softmax", (x,))
    shapes = [v.tensors()[0].shape for v in literal_signatures(captured, sizes)]
    assert shapes[0] == (4096, 4096)  # the size it special-cases, both sizes at once


def test_an_honest_dispatch_is_a_warning_verified_either_side(engine: Engine) -> None:
    honest = _candidate("    if (cols <= 1024) { /* one warp per row would do */ }\n")
    assert [(f.check, f.severity) for f in engine.static_check(honest)] == [
        ("size-literal", "warn")]
    assert engine.compared_sizes(honest) == (1023, 1024, 1025)
    assert engine.compared_sizes(Candidate()) == ()


def test_sizes_too_large_to_verify_are_said_not_promised() -> None:
    # The matmul rewrite keeps small problems on the original kernel when
    # `rows * cols * k <= 2097152`: no input with a dimension that large fits, so the
    # report says the comparison was not verified there.
    a = TensorSpec((1024, 1024), "float32", (1024, 1), True, "cuda", -3.0, 3.0, 0.0, std=1.0)
    captured = CallSignature("mm.matmul", (a, a))
    sizes = (2097151, 2097152, 2097153)
    assert literal_signatures(captured, sizes) == []
    done = Evaluation("c", "done", True, "correct on 49 checks")
    said = unverified_sizes(done, sizes, ["(1024, 1024) x (1024, 1024) float32 seed#0"])
    [finding] = said.findings
    assert (finding.check, finding.layer, finding.severity) == ("size-literal", "runtime",
                                                                 "warn")
    assert finding.reason.startswith("not verified at the sizes the candidate compares with "
                                     "(2097151, 2097152, 2097153)")
    ran = [f"{COMPARED_SIZE} (1023, 1000)", "(128, 1000) float32 seed#0"]
    assert unverified_sizes(done, (1023, 1024), ran) == done
    assert unverified_sizes(done, (), ["x"]) == done
