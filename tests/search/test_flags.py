"""Compiler settings as genes (kfbot/search/mutators/flags.py,
kfbot/scan/python/flag_edit.py): proposed as one-gene changes of the build file's nvcc
list, combined with the parent's kernel edits, read back by the engine's builds, checked
as flags rather than as a file edit (fast math a finding, a -D an edit outside the
task), and committed as a change of the build file the patch shows."""

from __future__ import annotations

import json
import random
import shutil
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

from kfbot.anticheat.static import static_findings
from kfbot.config import load_config
from kfbot.evaluate.candidate import ORIGINAL, Candidate
from kfbot.evaluate.evaluation import Evaluation, shape_timings
from kfbot.evaluate.sources import recipe_for, static_input
from kfbot.evaluate.task import KernelTask, make_task
from kfbot.scan.python.flag_edit import flag_list, flags_only_change, with_values
from kfbot.scan.scanner import scan
from kfbot.scan.select import select_kernel
from kfbot.search.mutators.flags import flag_space, propose_flags, render, state_of
from kfbot.search.plan import OptimizeSettings, make_plan
from kfbot.search.runner import optimize

REAL = Path(__file__).resolve().parents[2] / "fixtures" / "naive_real"
SETUP = """\
from setuptools import setup
from torch.utils.cpp_extension import BuildExtension, CUDAExtension as Ext

setup(
    name="scale",
    ext_modules=[Ext("scale_ext", ["csrc/scale.cu", "csrc/binding.cpp"]{args})],
    cmdclass={{"build_ext": BuildExtension}},
)
"""


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    root = tmp_path / "repo"
    shutil.copytree(REAL, root)
    return root


def _task(root: Path, kernel: str = "layernorm_kernel") -> KernelTask:
    config = load_config(None, root)
    return make_task(select_kernel(scan(root, config).kernels, kernel), root, config)


def _space(task: KernelTask) -> Any:
    text = (task.root / task.build.file).read_text()
    found = flag_space(task, {task.build.file: text})
    assert not isinstance(found, str), found
    return found


def test_the_plan_lists_the_genes_the_build_file_can_carry(repo: Path) -> None:
    lines = make_plan(_task(repo), OptimizeSettings(), "off").lines()
    text = "\n".join(lines)
    assert "flags: 5 compiler settings in ops.py (now -O2)" in text
    assert "  -maxrregcount: tries -maxrregcount=32, -maxrregcount=64, -maxrregcount=128" in text


def test_one_gene_changes_combine_with_the_parents_kernel_edits(repo: Path) -> None:
    task = _task(repo)
    space = _space(task)
    kernel = (repo / "csrc/layernorm.cu").read_text().replace("#define LN_THREADS 128",
                                                              "#define LN_THREADS 256")
    parent = Candidate(files={"csrc/layernorm.cu": kernel}, origin="params")
    cands = propose_flags(space, parent, {"csrc/layernorm.cu": kernel}, random.Random(0))
    assert len(cands) == 7  # -O3, ptxas -O3, vectorization, 3 register caps, fast math
    for cand in cands:
        assert cand.files["csrc/layernorm.cu"] == kernel  # the kernel edit is kept
        assert not cand.params and cand.origin == "params"
    o3 = next(c for c in cands if c.rationale == "flags: nvcc -O3 instead of -O2")
    assert 'extra_cuda_cflags=["-O3"],' in o3.files["ops.py"]
    # From the -O3 child: removing it gives the repository's file back, byte for byte.
    children = propose_flags(space, o3, dict(o3.files), random.Random(1))
    back = next(c for c in children if "back to the repository's setting" in c.rationale)
    assert back.files["ops.py"] == (repo / "ops.py").read_text()
    both = next(c for c in children if c.rationale == "flags: nvcc --use_fast_math")
    assert 'extra_cuda_cflags=["-O3", "--use_fast_math"],' in both.files["ops.py"]
    assert state_of(space, ("-O3", "--use_fast_math")) == {
        "-O": "-O3", "--ptxas-options=-O": None, "--extra-device-vectorization": None,
        "-maxrregcount": None, "--use_fast_math": "--use_fast_math"}
    assert render(space, state_of(space, ("-O3", "--use_fast_math"))) == \
        ("-O3", "--use_fast_math")


def test_the_build_reads_the_flags_and_the_checks_see_flags_not_an_edit(repo: Path) -> None:
    task = _task(repo)
    space = _space(task)
    fast = next(c for c in propose_flags(space, ORIGINAL, {}, random.Random(0))
                if "--use_fast_math" in c.rationale)
    assert recipe_for(task, fast.files).extra_cuda_cflags == ("-O2", "--use_fast_math")
    assert recipe_for(task, {}) == task.build
    found = static_findings(static_input(task, fast, ("float32",)))
    assert [(f.check, f.severity) for f in found] == [("fast-math", "warn")]
    # A define smuggled into the same list is not a speed flag: an edit of the build.
    text = (repo / "ops.py").read_text()
    smuggled = Candidate(files={"ops.py": text.replace('["-O2"]', '["-O2", "-DFAST=1"]')})
    checks = {f.check: f.severity for f in static_findings(static_input(task, smuggled,
                                                                        ("float32",)))}
    assert checks.get("edit-outside-task") == "strict"


def test_flag_lists_kfbot_can_and_cannot_rewrite() -> None:
    plain = SETUP.format(args="")
    found = flag_list("setup.py", plain, "setup_py", 6)
    assert not isinstance(found, str)
    added = with_values(plain, found, ("-O3",))
    assert 'csrc/binding.cpp"], extra_compile_args={"nvcc": ["-O3"]})],' in added
    assert flags_only_change("setup.py", plain, added, "setup_py", 6) == ("-O3",)
    cxx = SETUP.format(args=', extra_compile_args={"cxx": ["-O2"]}')
    found = flag_list("setup.py", cxx, "setup_py", 6)
    assert not isinstance(found, str)
    assert '{"cxx": ["-O2"], "nvcc": ["-maxrregcount=64"]}' in with_values(
        cxx, found, ("-maxrregcount=64",))
    computed = SETUP.format(args=", extra_compile_args=nvcc_flags()")
    assert flag_list("setup.py", computed, "setup_py", 6) == (
        "extra_compile_args at setup.py:6 is not a dictionary literal with an \"nvcc\" list")
    listed = SETUP.format(args=', extra_compile_args={"nvcc": FLAGS}')
    assert "is not a list of strings written in the call" in str(
        flag_list("setup.py", listed, "setup_py", 6))
    # Anything besides the list changed: not a flags-only change.
    assert flags_only_change("setup.py", plain, added.replace('"scale"', '"other"'),
                             "setup_py", 6) is None


class _Gpu:
    def __init__(self) -> None:
        self.device: dict[str, Any] = {"gpu": "scripted"}

    def adequacy(self) -> None:
        return None


class _FasterWithO3:
    """Candidates whose build file asks for -O3 are 1.3x faster; the rest noise."""

    def __init__(self, root: Path) -> None:
        self.root = root

    def evaluate(self, cands: Sequence[Candidate]) -> list[tuple[Candidate, Evaluation]]:
        out = []
        for cand in cands:
            rng = random.Random(cand.hash)
            ratio = 1.3 if '"-O3"' in cand.files.get("ops.py", "") else 1.0
            base = [20.0 + rng.gauss(0, 0.02) for _ in range(20)]
            timings = shape_timings([{"input": "(4096, 1024) float32", "original_us": base,
                                      "candidate_us": [t / ratio for t in base]}], 0, None)
            out.append((cand, Evaluation(cand.hash, "done", True, "correct",
                                         timings=timings)))
        return out

    def close(self) -> None:
        """Nothing to release."""


def test_a_faster_setting_is_committed_as_a_change_of_the_build_file(repo: Path,
                                                                     tmp_path: Path) -> None:
    task = _task(repo)
    outcome = optimize(task, _Gpu(), OptimizeSettings(islands=2, seed=0, evaluations=24),
                       tmp_path / "run", None, None, _FasterWithO3(repo))
    assert outcome.committed is not None
    cand = outcome.committed[1]
    assert '"-O3"' in cand.files["ops.py"] and not cand.params
    patch = (tmp_path / "run" / "best.patch").read_text()
    assert "--- a/ops.py" in patch and '-        extra_cuda_cflags=["-O2"],' in patch
    added = next(line for line in patch.splitlines()
                 if line.startswith("+        extra_cuda_cflags=["))
    assert '"-O3"' in added  # with whatever other settings or kernel edits it combined
    report = json.loads((tmp_path / "run" / "report.json").read_text())
    assert report["candidate"] == cand.hash
    assert (repo / "ops.py").read_text().count('"-O2"') == 1  # the user's tree untouched
