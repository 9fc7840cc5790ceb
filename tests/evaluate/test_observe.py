"""Observed pairing without a GPU: the profiler's kernel names read and matched to the
scanned definitions of a real fixture, kernels credited to the op call that launched
them, the per-test records of real test processes, the mutant that writes nothing
(compiled by a real nvcc), observations kept per commit in a real git repository, and
what `kfbot scan` shows of them.
"""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import jsonschema
import pytest

from kfbot.cli import main
from kfbot.config import load_config
from kfbot.evaluate.capture.collect import capture_signatures
from kfbot.evaluate.capture.launch_recorder import HostEvent, KernelEvent, attribute
from kfbot.evaluate.capture.launches import Launch, ObserveRequest, RunRecord, append, read
from kfbot.evaluate.capture.signature import OpRef
from kfbot.evaluate.observe.mutants import NoMutant, silent
from kfbot.evaluate.observe.names import ANONYMOUS, match, parse
from kfbot.evaluate.observe.observer import _outcomes, op_refs, script_targets
from kfbot.scan.model import BuildRecipe, Observations, ObservedTest, ScanReport, evolve
from kfbot.scan.observed import from_json, load, save, state_key, to_json, with_observations
from kfbot.scan.scanner import scan
from kfbot.scan.select import select_kernel
from kfbot.scan.show.explain import explain
from kfbot.scan.show.render import json_text
from tests.cuda_compile import NVCC, compile_all

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures"
PAIRS = FIXTURES / "observe_pairs"
SCHEMA = json.loads((Path(__file__).resolve().parents[2] / "kfbot" / "schemas"
                     / "scan-v1.json").read_text())
# The names torch's profiler gave these kinds of kernel on an H100 (PyTorch 2.11, CUDA 13).
SCALE = "void ops::detail::scale_kernel<float, 128>(float const*, float*, int, float)"
PLAIN_C = "plain_c_kernel"
FREE = "free_kernel(float*, int)"
ATEN = ("void at::native::(anonymous namespace)::cunn_SoftMaxForwardReg<float, float, float, "
        "at::native::(anonymous namespace)::SoftMaxForwardEpilogue>(float*, float const*, long)")


@pytest.fixture(scope="module")
def pairs() -> ScanReport:
    return scan(PAIRS, load_config(None, PAIRS))


# --- names -------------------------------------------------------------------------------


def test_profiler_names_are_taken_apart() -> None:
    scale = parse(SCALE)
    assert (scale.namespace, scale.name, scale.template_args, scale.params) == (
        ("ops", "detail"), "scale_kernel", ("float", "128"),
        ("float const*", "float*", "int", "float"))
    assert parse(PLAIN_C).params is None and parse(PLAIN_C).name == PLAIN_C
    assert parse(FREE).params == ("float*", "int") and not parse(FREE).templated
    aten = parse(ATEN)
    assert aten.namespace == ("at", "native", ANONYMOUS)
    assert aten.template_args[-1] == f"at::native::{ANONYMOUS}::SoftMaxForwardEpilogue"
    lam = parse("void at::native::elementwise_kernel<128, 2, at::native::gpu_kernel_impl<"
                "at::native::FillFunctor<float> >(at::TensorIteratorBase&)::{lambda(int)#1}>"
                "(int, at::native::FillFunctor<float>)")
    assert lam.name == "elementwise_kernel" and len(lam.template_args) == 3


def test_profiler_names_match_the_scanned_kernels(pairs: ScanReport) -> None:
    ids = {text: [k.id for k in match(text, pairs.kernels).kernels]
           for text in (SCALE, PLAIN_C, FREE, ATEN)}
    assert ids == {SCALE: ["csrc/kernels.cu::ops::detail::scale_kernel"],
                   PLAIN_C: ["csrc/kernels.cu::plain_c_kernel"],
                   FREE: ["csrc/kernels.cu::free_kernel"], ATEN: []}


@pytest.mark.parametrize("text", [
    "void scale_kernel<float, 128>(float const*, float*, int, float)",  # no namespace
    "void ops::detail::scale_kernel<float>(float const*, float*, int, float)",  # 1 of 2 args
    "void ops::detail::scale_kernel<float, 128>(float const*, float*, int)",  # 3 params
    "void other::detail::scale_kernel<float, 128>(float const*, float*, int, float)",
    "free_kernel(float*, int, int)", "ns::free_kernel(float*, int)",
    "void free_kernel<float>(float*, int)",
])
def test_near_misses_match_nothing(pairs: ScanReport, text: str) -> None:
    assert match(text, pairs.kernels).kernels == ()


def test_the_loaded_library_chooses_between_copies(pairs: ScanReport) -> None:
    kernel = select_kernel(pairs.kernels, "free_kernel")
    copy = evolve(kernel, builds=(BuildRecipe("setup_py", "obs_ext_v2", "v2/setup.py", 3),))
    copy = evolve(copy, definition=evolve(kernel.definition, file="v2/kernels.cu"))
    both = [kernel, copy]
    assert match(FREE, both).ambiguous
    chosen = match(FREE, both, ["obs_ext_v2", "/cache/obs_ext_v2.cpython-312-x86_64.so"])
    assert chosen.by_library and [k.id for k in chosen.kernels] == [copy.id]


# --- crediting launches to op calls --------------------------------------------------------


def test_kernels_are_credited_to_the_innermost_op_call() -> None:
    host = [
        HostEvent(1, "kfbot.op:obs_ext.scale", 100, 500, 7),
        HostEvent(2, "aten::empty_like", 110, 120, 7),
        HostEvent(3, "kfbot.op:obs_ext.offset", 200, 300, 7),  # nested in scale's call
        HostEvent(4, "aten::add", 600, 700, 7),  # outside every recorded call
        HostEvent(5, "aten::mul", 150, 160, 9),  # another thread
        # A launch the profiler linked to no op: its runtime call, by the id they share.
        HostEvent(41, "cudaLaunchKernel", 210, 220, 7, linked=77),
        HostEvent(42, "cudaLaunchKernel", 650, 660, 7, linked=77),
    ]
    kernels = [KernelEvent(SCALE, 1), KernelEvent(SCALE, 1), KernelEvent(PLAIN_C, 3),
               KernelEvent("void at::fill<float>()", 2), KernelEvent("add_kernel", 4),
               KernelEvent("mul_kernel", 5), KernelEvent("lost", 99),
               KernelEvent("free_kernel(float*, int)", 0, 41),
               KernelEvent("late_kernel", 0, 42)]
    got = {(launch.name, launch.op): launch.count for launch in attribute(kernels, host)}
    assert got == {(SCALE, "obs_ext.scale"): 2, (PLAIN_C, "obs_ext.offset"): 1,
                   ("void at::fill<float>()", "obs_ext.scale"): 1, ("add_kernel", None): 1,
                   ("mul_kernel", None): 1, ("lost", None): 1,
                   ("free_kernel(float*, int)", "obs_ext.offset"): 1, ("late_kernel", None): 1}


def test_records_survive_a_line_cut_short(tmp_path: Path) -> None:
    path = tmp_path / "observed.jsonl"
    record = RunRecord("t.py::a", "passed", (Launch(SCALE, "obs_ext.scale", 3),),
                        (("obs_ext", "/x/obs_ext.so"),), profiled=True)
    append(path, record)
    with path.open("a") as f:
        f.write('{"test": "t.py::b", "outc')  # the process died while writing
    assert read([path, tmp_path / "missing.jsonl"]) == [record]


# --- test processes under observation (no CUDA here) -----------------------------------------

OPS = "def scale(x, alpha=2.0):\n    return x * alpha\n"


def write(root: Path, files: dict[str, str]) -> Path:
    for rel, text in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return root


def test_each_test_leaves_its_outcome(tmp_path: Path) -> None:
    root = write(tmp_path / "repo", {
        "myops.py": OPS,
        "tests/test_a.py": ("import pytest\nfrom myops import scale\n\n\n"
                            "def test_pass():\n    assert scale(1.0) == 2.0\n\n\n"
                            "def test_fail():\n    assert scale(1.0) == 3.0\n\n\n"
                            "@pytest.fixture\ndef broken():\n    raise RuntimeError('setup')\n\n\n"
                            "def test_error(broken):\n    pass\n\n\n"
                            "@pytest.mark.skip(reason='later')\ndef test_skip():\n    pass\n"),
        "tests/test_b.py": ("import os\nfrom myops import scale\n\n\n"
                            "def test_first():\n    assert scale(2.0) == 4.0\n\n\n"
                            "def test_dies():\n    os.abort()\n"),
        "main.py": "from myops import scale\nassert scale(3.0) == 6.0\nprint('ok')\n",
    })
    out = tmp_path / "observed"
    out.mkdir()
    result = capture_signatures(root, ["tests"], [OpRef.parse("myops.scale")], timeout_s=120,
                                scripts=["main.py"], observe=ObserveRequest(str(out)))
    outcomes = {r.test: r.outcome for r in result.observed}
    assert outcomes == {"tests/test_a.py::test_pass": "passed",
                        "tests/test_a.py::test_fail": "failed",
                        "tests/test_a.py::test_error": "error",
                        "tests/test_a.py::test_skip": "skipped",
                        "tests/test_b.py::test_first": "passed",
                        "tests/test_b.py": "crashed",  # test_dies took the process with it
                        "main.py": "passed"}
    # No CUDA device here: nothing profiled, and each record says why.
    assert all(not r.profiled and "no CUDA" in r.note for r in result.observed
               if r.outcome != "crashed")
    assert {getattr(a, "value", None) for s in result.signatures for a in s.args} == {1.0, 2.0, 3.0}


def test_the_tests_a_process_died_in() -> None:
    from kfbot.evaluate.capture.collect import CaptureResult

    nodes = "t.py::a t.py::b t.py::c"
    run = CaptureResult((), 0, -6, "", (), observed=(
        RunRecord("t.py::a", "passed"), RunRecord(nodes, "crashed")))
    assert _outcomes(run) == {"t.py::a": "passed", nodes: "crashed", "t.py::b": "crashed"}


def test_ops_and_scripts_to_observe(pairs: ScanReport, tmp_path: Path) -> None:
    assert [op.text for op in op_refs(pairs.kernels)] == [
        "obs_ext.scale", "obs_ext.offset", "obs_ext.double32"]
    root = write(tmp_path, {"bench_ops.py": "import torch\nimport obs_ext\n",
                            "main.py": "print('no torch here')\n",
                            "notes.py": "import torch, obs_ext\n",
                            "setup.py": "import torch, obs_ext\n"})
    assert script_targets(root, pairs) == ["bench_ops.py"]


# --- the mutant --------------------------------------------------------------------------------


def test_the_mutant_empties_one_kernel_and_compiles(pairs: ScanReport, tmp_path: Path) -> None:
    mutants = {k.name: silent(PAIRS, k) for k in pairs.kernels}
    texts = {}
    for name, mutant in mutants.items():
        assert not isinstance(mutant, NoMutant), mutant
        (path, text), = mutant.files
        assert path == "csrc/kernels.cu" and text.count("kfbot mutant") == 1
        texts[name] = text
    assert "y[i] = alpha * x[i]" not in texts["scale_kernel"]
    assert "y[i] = alpha * x[i]" in texts["free_kernel"]
    if NVCC is None:
        pytest.skip("nvcc is not on PATH")
    assert compile_all(texts, tmp_path) == dict.fromkeys(texts, "")


def test_the_mutant_of_an_inline_kernel(tmp_path: Path) -> None:
    root = FIXTURES / "inline_softmax"
    kernel = select_kernel(scan(root, load_config(None, root)).kernels, "softmax_kernel")
    mutant = silent(root, kernel)
    assert not isinstance(mutant, NoMutant)
    (path, text), = mutant.files
    assert path == kernel.file and "kfbot mutant" in text
    original = (root / path).read_text()
    assert len(text.splitlines()) < len(original.splitlines())  # only the body went


# --- kept per commit ------------------------------------------------------------------------


def git(root: Path, *args: str) -> str:
    return subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@t", *args], cwd=root,
                          check=True, capture_output=True, text=True).stdout.strip()


def observation(key: str) -> Observations:
    return Observations(key, (("csrc/kernels.cu::plain_c_kernel", (
        ObservedTest("tests/test_offset.py::test_offset_keeps_the_shape", "pytest",
                     ("obs_ext.offset",), "launches-only", "on the mutant it passed"),)),
        ("csrc/kernels.cu::ops::detail::scale_kernel", (
            ObservedTest("tests/test_dispatch.py::test_dispatched_scale", "pytest",
                         ("obs_ext.scale",), "checks", "on the mutant it failed"),
            ObservedTest("tests/test_scale.py::test_scale_matches_torch[1000]", "pytest",
                         ("obs_ext.scale",), "checks", "on the mutant it failed")))),
        files=("pytest tests/test_needs_expecttest.py: cannot be collected: no module named "
               "'expecttest' (pip install expecttest)",),
        foreign=("at::native::vectorized_elementwise_kernel",), tests_run=9)


def test_observations_are_kept_by_commit_and_dirty_state(tmp_path: Path) -> None:
    root = tmp_path / "repo"
    shutil.copytree(PAIRS, root)
    assert state_key(root) is None  # not a git working tree: nothing to key by
    git(root, "init", "-q")
    assert state_key(root) is None  # no commit yet
    git(root, "add", "-A")
    git(root, "commit", "-qm", "first")
    head = git(root, "rev-parse", "HEAD")
    assert state_key(root) == head
    saved = save(root, observation(head))
    assert saved == root / ".kfbot" / "observed" / f"{head}.json"
    assert state_key(root) == head  # what kfbot writes in .kfbot/ is no change
    assert load(root) == observation(head)
    (root / "csrc" / "kernels.cu").write_text("// edited\n")
    dirty = state_key(root)
    assert dirty is not None and dirty.startswith(f"{head}-dirty-")
    assert load(root) is None  # another state: the kept one does not apply
    (root / "notes.txt").write_text("untracked\n")
    assert state_key(root) not in (dirty, head)
    (root / "notes.txt").unlink()
    assert state_key(root) == dirty
    git(root, "checkout", "-q", "--", ".")
    assert load(root) == observation(head)


def test_a_kept_file_of_another_format_is_none(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="format"):
        from_json({"format": 99, "key": "x"})
    assert from_json(to_json(observation("k"))) == observation("k")


# --- what scan shows ------------------------------------------------------------------------


def test_scan_shows_observed_pairs_beside_static_ones(pairs: ScanReport) -> None:
    merged = with_observations(pairs, observation("abc123"), PAIRS)
    scale = select_kernel(merged.kernels, "scale_kernel")
    origins = {(r.file, r.origin) for r in scale.references}
    assert ("tests/test_scale.py", "discovered") in origins  # already paired statically
    assert ("tests/test_dispatch.py", "observed") in origins  # only the GPU saw it
    dispatch = next(r for r in scale.references if r.origin == "observed")
    assert dispatch.test == "test_dispatched_scale" and dispatch.line == 15
    assert dispatch.op == "obs_ext.scale"
    offset = select_kernel(merged.kernels, "plain_c_kernel")
    assert not offset.references and offset.observed[0].verdict == "launches-only"
    report = json.loads(json_text(merged))
    jsonschema.validate(report, SCHEMA)
    assert report["observation"]["key"] == "abc123"
    text = explain(merged, scale)
    assert "observed on a GPU at abc123 (9 tests run)" in text
    assert ("tests/test_dispatch.py::test_dispatched_scale through obs_ext.scale: checks it: "
            "the mutant that writes nothing fails it") in text
    assert "pip install expecttest" in text


def test_a_static_reference_the_mutant_passes_is_taken_out(pairs: ScanReport) -> None:
    scale = select_kernel(pairs.kernels, "scale_kernel")
    assert any(r.file == "tests/test_scale.py" for r in scale.references)
    weak = Observations("k", ((scale.id, (ObservedTest(
        "tests/test_scale.py::test_scale_matches_torch[1]", "pytest", ("obs_ext.scale",),
        "launches-only"),)),))
    merged = select_kernel(with_observations(pairs, weak, PAIRS).kernels, "scale_kernel")
    assert not any(r.file == "tests/test_scale.py" for r in merged.references)


def test_kfbot_scan_reads_the_kept_observation(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("COLUMNS", "400")
    root = tmp_path / "repo"
    shutil.copytree(PAIRS, root)
    git(root, "init", "-q")
    git(root, "add", "-A")
    git(root, "commit", "-qm", "first")
    save(root, observation(git(root, "rev-parse", "HEAD")))
    assert main(["scan", str(root), "--format", "table"]) == 0
    out = capsys.readouterr().out
    assert "tests/test_dispatch.py:15 test_dispatched_scale [observed]" in out
    assert "observed: tests/test_offset.py::test_offset_keeps_the_shape: launches but does " \
           "not check it" in out
    assert "cannot be collected: no module named 'expecttest' (pip install expecttest)" in out


def test_observing_without_a_gpu_says_so(tmp_path: Path) -> None:
    from kfbot.evaluate.build import Builder
    from kfbot.evaluate.observe.observer import ObserveSettings, observe

    root = tmp_path / "repo"
    kept = ("csrc", "conftest.py", "tests/test_scale.py", "tests/test_needs_expecttest.py",
            "tests/test_ops_mps.py")
    for rel in kept:  # no setup.py: nothing to build, the tests run as they are
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        if (PAIRS / rel).is_dir():
            shutil.copytree(PAIRS / rel, root / rel)
        else:
            shutil.copy(PAIRS / rel, root / rel)
    report = scan(root, load_config(None, root))
    found = observe(root, report, Builder(tmp_path / "build"),
                    ObserveSettings(file_timeout_s=60, timeout_s=300, jobs=2))
    assert found.key == "" and found.kernels == ()
    assert found.note == "no test was profiled (no CUDA device in the test process)"
    assert found.tests_run == 3  # test_scale's three sizes ran (and skipped themselves)
    assert any("test_needs_expecttest.py: cannot be collected: no module named 'expecttest' "
               "(pip install expecttest)" in line for line in found.files)
    assert "tests/test_ops_mps.py: skipped, a Metal twin: it uses the mps device and never " \
           "CUDA" in found.files


def test_scan_observe_without_a_gpu_says_so(monkeypatch: pytest.MonkeyPatch,
                                            capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    assert main(["scan", str(PAIRS), "--observe"]) == 3
    assert "observing the tests needs a CUDA GPU, and none is visible" in capsys.readouterr().err
