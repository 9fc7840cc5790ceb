"""The naive fixtures (fixtures/naive_*): each is scanned into a task with a reference,
the rules mutator proposes its class's structural rewrites for each kernel and nothing
outside the kernel's scope, the hand-written variants stay in scope too, and the
structural candidates compile with nvcc for sm_90."""

from __future__ import annotations

from pathlib import Path

import pytest
from cuda_compile import NVCC, compile_all

from kfbot.config import load_config
from kfbot.evaluate.candidate import ORIGINAL, Candidate
from kfbot.evaluate.scope import definitions, out_of_scope, scope_findings
from kfbot.evaluate.task import make_task
from kfbot.scan.model import Kernel
from kfbot.scan.scanner import scan
from kfbot.search.rewrites import load_library, propose_rewrites

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures"
# kernel -> (fixture, the structural rewrites proposed for it, in order)
EXPECTED = {
    "softmax_kernel": ("naive_rows", ["warp-per-row", "block-per-row", "row-split-by-length"]),
    "log_softmax_kernel": ("naive_rows", ["warp-per-row", "block-per-row", "row-split-by-length"]),
    "layer_norm_kernel": ("naive_rows", ["warp-per-row", "block-per-row", "row-split-by-length"]),
    "rms_norm_kernel": ("naive_rows", ["warp-per-row", "block-per-row", "row-split-by-length"]),
    "row_mean_kernel": ("naive_rows", ["warp-per-row", "block-per-row", "row-split-by-length"]),
    "row_max_kernel": ("naive_rows", ["warp-per-row", "block-per-row", "row-split-by-length"]),
    "silu_kernel": ("naive_elementwise", ["vectorize-float4"]),
    "gelu_kernel": ("naive_elementwise", ["row-map-per-block", "warp-per-row",
                                          "block-per-row", "row-split-by-length"]),
    "matmul_kernel": ("naive_matmul", ["matmul-register-tiling",
                                       "matmul-register-tiling-large"]),
    "transpose_kernel": ("naive_transpose", ["tiled-transpose"]),
    "layernorm_kernel": ("naive_real", ["row-map-per-block", "warp-per-row", "block-per-row",
                                        "row-split-by-length"]),
    "row_sum_kernel": ("naive_real", ["warp-per-row", "block-per-row", "row-split-by-length"]),
    "blur_rows_kernel": ("naive_real", ["row-map-per-block", "warp-per-row", "block-per-row",
                                        "row-split-by-length"]),
    # A block per row already: the small rewrites (the shuffle finish through its helpers,
    # the occupancy sweep) and the params of its conditional block size.
    "softmax_block_kernel": ("naive_real", []),
}
EXPERTS = {e.id for e in load_library().experts}


def _kernels() -> dict[str, Kernel]:
    out = {}
    for fixture in sorted({f for f, _ in EXPECTED.values()}):
        root = FIXTURES / fixture
        for kernel in scan(root, load_config(None, root)).kernels:
            out[kernel.name] = kernel
    return out


KERNELS = _kernels()


def _files(kernel: Kernel) -> dict[str, str]:
    root = FIXTURES / EXPECTED[kernel.name][0]
    return {p: (root / p).read_text() for p in kernel.editable_files}


def _proposed(name: str) -> list[Candidate]:
    kernel = KERNELS[name]
    return propose_rewrites(_files(kernel), kernel.editable_files, ORIGINAL, name)


@pytest.mark.parametrize("name", list(EXPECTED))
def test_scanned_with_a_reference_binding_and_build(name: str) -> None:
    kernel = KERNELS[name]
    fixture = EXPECTED[name][0]
    assert kernel.references and kernel.bindings and kernel.builds
    task = make_task(kernel, FIXTURES / fixture, load_config(None, FIXTURES / fixture))
    assert task.references and task.op.kind == "module"
    assert task.editable_files == (kernel.file,)
    assert not any(p.startswith("hand/") for p in task.editable_files)


@pytest.mark.parametrize("name", list(EXPECTED))
def test_the_class_rewrites_come_first_and_stay_in_scope(name: str) -> None:
    kernel = KERNELS[name]
    cands = _proposed(name)
    ids = [c.rationale.split(":", 1)[0] for c in cands]
    structural = [i for i in ids if i in EXPERTS]
    assert structural == EXPECTED[name][1]
    assert ids[:len(structural)] == structural
    before = definitions(_files(kernel).items())
    for cand in cands:
        after = definitions({**_files(kernel), **cand.files}.items())
        assert out_of_scope(before, after, name) == [], cand.rationale


NEIGHBOURS = {"softmax_kernel": "scale_kernel", "row_mean_kernel": "row_max_kernel",
              "row_max_kernel": "row_mean_kernel"}  # another kernel in the same file


def test_hand_written_variants_change_only_their_kernel() -> None:
    for name, (fixture, _) in EXPECTED.items():
        kernel = KERNELS[name]
        hand = (FIXTURES / fixture / "hand" / f"{name}.cu").read_text()
        before = definitions(_files(kernel).items())
        after = definitions([(kernel.file, hand)])
        assert out_of_scope(before, after, name) == [], name
        if name in NEIGHBOURS:  # the same file offered for the neighbour: out of scope
            assert out_of_scope(before, after, NEIGHBOURS[name]), name


def test_a_change_to_the_other_kernel_of_the_file_is_rejected_with_evidence() -> None:
    root = FIXTURES / "naive_rows"
    task = make_task(KERNELS["softmax_kernel"], root, load_config(None, root))
    source = (root / "csrc/softmax.cu").read_text()
    [grid_stride] = [c for c in propose_rewrites(
        {"csrc/softmax.cu": source}, ["csrc/softmax.cu"], ORIGINAL, "scale_kernel")
        if c.rationale.startswith("grid-stride-loop")]
    [finding] = scope_findings(task, grid_stride)
    assert finding.check == "edit-scope" and finding.severity == "strict"
    assert finding.reason == ("changes kernel scale_kernel, which only scale_kernel uses; "
                              "this task verifies softmax_kernel")
    assert finding.evidence == "csrc/softmax.cu:23"
    for cand in _proposed("softmax_kernel"):
        assert scope_findings(task, cand) == []


def _structural() -> dict[str, str]:
    out = {}
    for name in EXPECTED:
        for cand in _proposed(name):
            rewrite = cand.rationale.split(":", 1)[0]
            if rewrite in EXPERTS or rewrite == "fast-math-intrinsics":
                [text] = list(cand.files.values())
                out[f"{name}-{rewrite}"] = text
    return out


STRUCTURAL = _structural()


@pytest.fixture(scope="module")
def compiled(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    if NVCC is None:
        pytest.skip("nvcc not on PATH")
    return compile_all(STRUCTURAL, tmp_path_factory.mktemp("naive"), ["-Werror=all-warnings"])


@pytest.mark.parametrize("case", list(STRUCTURAL))
def test_structural_candidates_compile_for_sm90(compiled: dict[str, str], case: str) -> None:
    assert compiled[case] == ""
