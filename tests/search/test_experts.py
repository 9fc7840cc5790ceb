"""The expert library (rules/experts/): loading and its errors, every class's worked
examples (each rewrite applies to its own example, and the result compiles), which
class a kernel is recognised as, and the examples retrieved into the LLM mutator's
prompt through the fake Messages API."""

from __future__ import annotations

import random
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest
from cuda_compile import NVCC, compile_all
from fake_anthropic import FakeAnthropic, Reply

from kfbot.config import load_config
from kfbot.datafiles import rules_dir
from kfbot.errors import KfbotError
from kfbot.evaluate.candidate import ORIGINAL
from kfbot.evaluate.task import make_task
from kfbot.scan.scanner import scan
from kfbot.scan.select import select_kernel
from kfbot.search.budget import Budget, Limits
from kfbot.search.evolution.archive import Individual
from kfbot.search.model import Cell
from kfbot.search.mutators.llm import LlmMutator, LlmSettings
from kfbot.search.mutators.rotation import Mutators
from kfbot.search.rewrites import Target, load_library, recognise, worked_examples
from kfbot.search.rewrites.registry import SOURCE_REWRITES
from kfbot.search.rewrites.rows import row_map_per_block

ROOT = Path(__file__).resolve().parents[2]
LIBRARY = load_library()
CLASS = {
    "row-reduction": "row-wise reductions such as softmax, log-softmax, layer and RMS norm, "
                     "and row sum, mean or max",
}


def test_the_shipped_library() -> None:
    assert [c.id for c in LIBRARY.classes] == ["row-reduction", "elementwise", "matmul",
                                               "transpose"]
    assert LIBRARY.classes[0].what == CLASS["row-reduction"]
    for cls in LIBRARY.classes:
        assert LIBRARY.of(cls.id), cls.id
        assert cls.recognise
    assert {e.id: e.kernel_class for e in LIBRARY.experts} == {
        "vectorize-float4": "elementwise", "matmul-register-tiling": "matmul",
        "matmul-register-tiling-large": "matmul", "warp-per-row": "row-reduction",
        "block-per-row": "row-reduction", "tiled-transpose": "transpose",
        "row-map-per-block": "elementwise", "row-split-by-length": "row-reduction"}


@pytest.mark.parametrize("expert", LIBRARY.experts, ids=lambda e: e.id)
def test_each_rewrite_applies_to_its_own_example(expert: object) -> None:
    from kfbot.search.rewrites import Expert

    assert isinstance(expert, Expert)
    target = Target(expert.example_kernel)
    after = SOURCE_REWRITES[expert.rewrite](expert.example, target)
    assert after is not None and after != expert.example
    [found] = [r for r in recognise(expert.example, target, LIBRARY)
               if r.kernel_class == expert.kernel_class]
    assert found.confident and expert.id in found.evidence


@pytest.fixture(scope="module")
def compiled(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    if NVCC is None:
        pytest.skip("nvcc not on PATH")
    sources = {}
    for e in LIBRARY.experts:
        sources[f"{e.id}-before"] = e.example
        sources[f"{e.id}-after"] = SOURCE_REWRITES[e.rewrite](e.example,
                                                              Target(e.example_kernel)) or ""
    return compile_all(sources, tmp_path_factory.mktemp("experts"))


@pytest.mark.parametrize("expert", [e.id for e in LIBRARY.experts])
def test_examples_compile_before_and_after(compiled: dict[str, str], expert: str) -> None:
    assert compiled[f"{expert}-before"] == ""
    assert compiled[f"{expert}-after"] == ""


# --- loading errors -----------------------------------------------------------------------


@pytest.fixture
def library(tmp_path: Path) -> Path:
    folder = tmp_path / "experts"
    shutil.copytree(rules_dir() / "experts", folder)
    return folder


def test_a_rewrite_file_without_its_class(library: Path) -> None:
    (library / "stencil.yaml").write_text((library / "transpose.yaml").read_text()
                                          .replace("id: tiled-transpose", "id: stencil-tiles"))
    with pytest.raises(KfbotError, match=r"stencil\.yaml: no kernel class 'stencil' in "
                                         r"classes\.yaml \(classes: elementwise, matmul, "
                                         r"row-reduction, transpose\)"):
        load_library(library)


def test_a_class_without_rewrites_and_an_id_twice(library: Path) -> None:
    (library / "transpose.yaml").unlink()
    with pytest.raises(KfbotError, match="kernel class transpose has no rewrite file"):
        load_library(library)
    (library / "transpose.yaml").write_text((library / "matmul.yaml").read_text())
    with pytest.raises(KfbotError, match=r"expert rewrite matmul-register-tiling is in both "
                                         r"matmul\.yaml and transpose\.yaml"):
        load_library(library)


def test_an_expert_entry_is_validated_with_its_line(library: Path) -> None:
    path = library / "matmul.yaml"
    path.write_text(path.read_text().replace("  example-kernel: matmul_kernel\n", "", 1))
    with pytest.raises(KfbotError) as err:
        load_library(library)
    assert str(err.value) == (f"{path}:4: expert rewrite matmul-register-tiling: missing "
                              "required key 'example-kernel'")


# --- recognising classes ------------------------------------------------------------------

NOT_A_CLASS = """#include <cuda_runtime.h>
__global__ void reduce(const float* x, float* out, int n) {
    __shared__ float s[256];
    s[threadIdx.x] = threadIdx.x < n ? x[threadIdx.x] : 0.0f;
    __syncthreads();
    for (int k = blockDim.x / 2; k > 0; k >>= 1) {
        if (threadIdx.x < k) s[threadIdx.x] += s[threadIdx.x + k];
        __syncthreads();
    }
    if (threadIdx.x == 0) out[0] = s[0];
}
"""


def test_recognised_with_confidence_or_by_signs() -> None:
    softmax = (ROOT / "fixtures/naive_rows/csrc/softmax.cu").read_text()
    [row] = recognise(softmax, Target("softmax_kernel"), LIBRARY)
    assert row.kernel_class == "row-reduction" and row.confident
    assert row.evidence == "warp-per-row, block-per-row, row-split-by-length apply"
    # launched from another file: no rewrite can apply, the signs still tell the class
    [likely] = recognise(softmax, Target("softmax_kernel", launched_elsewhere=True), LIBRARY)
    assert likely.kernel_class == "row-reduction" and not likely.confident
    assert likely.evidence == "a loop accumulates m over a row"
    # a map written as a loop over each row: elementwise, and the row rewrites apply to it
    gelu = (ROOT / "fixtures/naive_elementwise/csrc/gelu.cu").read_text()
    found = recognise(gelu, Target("gelu_kernel"), LIBRARY)
    assert [(r.kernel_class, r.confident) for r in found] == [("row-reduction", True),
                                                              ("elementwise", True)]
    assert found[1].evidence == "row-map-per-block apply"
    [likely] = recognise(gelu, Target("gelu_kernel", launched_elsewhere=True), LIBRARY)
    assert likely.kernel_class == "elementwise" and not likely.confident
    assert likely.evidence == "a thread maps a row's elements one by one in a loop"
    # a reduction is not a map: the elementwise rewrite stays off it
    assert row_map_per_block(softmax, Target("softmax_kernel")) is None
    tiled = (ROOT / "fixtures/example/csrc/matmul.cu").read_text()
    [mm] = recognise(tiled, Target("matmul_kernel"), LIBRARY)
    assert mm.kernel_class == "matmul" and not mm.confident
    assert recognise(NOT_A_CLASS, Target("reduce"), LIBRARY) == []
    assert worked_examples(LIBRARY, []) == ()


# --- the LLM mutator's prompt -----------------------------------------------------------------


@pytest.fixture
def fake() -> Iterator[FakeAnthropic]:
    with FakeAnthropic() as server:
        yield server


def _system_prompt(fake: FakeAnthropic, fixture: str, kernel: str) -> str:
    root = ROOT / "fixtures" / fixture
    config = load_config(None, root)
    task = make_task(select_kernel(scan(root, config).kernels, kernel), root, config)
    settings = LlmSettings(base_url=fake.base_url, max_retries=0, timeout_s=5.0)
    llm = LlmMutator(settings, Budget(Limits()), api_key="test-key")
    mut = Mutators(task, (), (), llm)
    fake.script(Reply.text("No change is needed."))
    original = Individual(ORIGINAL.hash, None, 2, Cell("global", "none", "other", "?"), 1.0,
                          "done", "the original", "original", 0)
    assert mut.propose(2, original, random.Random(0)) == []  # llm first on island 2
    [request] = fake.requests
    return str(request.body["system"][0]["text"])


def test_the_llm_prompt_holds_the_worked_examples_of_the_kernels_class(
        fake: FakeAnthropic) -> None:
    system = _system_prompt(fake, "naive_rows", "softmax_kernel")
    assert "## Worked examples for kernels of this kind" in system
    for expert in LIBRARY.of("row-reduction"):
        assert f"### {expert.id} (row-reduction): {expert.what}" in system
        assert expert.example.strip() in system
    assert "v = v + __shfl_xor_sync(0xffffffffu, v, offset);" in system  # an "After"
    assert "matmul-register-tiling" not in system and "tiled-transpose" not in system
    assert system.index("Worked examples") < system.index("<<<<<<< SEARCH")


def test_a_kernel_of_no_class_gets_no_examples(fake: FakeAnthropic) -> None:
    # a block per row already, finished by a shared-memory tree: no class's shape or signs
    system = _system_prompt(fake, "setup_rowsum", "rowsum_kernel")
    assert "Worked examples" not in system
