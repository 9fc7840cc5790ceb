"""A repository's test suite, file by file: the files behind the targets, the twins
for other devices, what a failed collection says, and a capture that survives its
neighbours (a file that cannot be collected, one that hangs, one that crashes after
recording calls, a Metal twin, a file that tests two devices).

The end-to-end test runs real pytest processes on a small repository it writes.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest
from process_table import running

from kfbot.evaluate.capture.collect import CaptureResult, capture_signatures
from kfbot.evaluate.capture.signature import OpRef, ScalarSpec
from kfbot.evaluate.capture.suite import (
    CPU_TWIN,
    FileTarget,
    collect_problem,
    expand,
    node_groups,
    pip_line,
    python_file_patterns,
    twin_node,
    twin_of,
)

SCALE = OpRef.parse("myops.scale")


def write(root: Path, files: dict[str, str]) -> Path:
    for rel, text in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return root


# --- which files -----------------------------------------------------------------------


def test_targets_become_files_with_their_nodes(tmp_path: Path) -> None:
    root = write(tmp_path, {"tests/test_a.py": "", "tests/sub/b_test.py": "",
                            "tests/helper.py": "", "tests/build/test_gen.py": "",
                            "other/test_c.py": ""})
    assert expand(root, ["tests", "other/test_c.py::test_x", "other/test_c.py::test_y",
                         "tests/test_a.py::test_z"]) == [
        FileTarget("tests/test_a.py"),  # the whole file was asked for first
        FileTarget("tests/sub/b_test.py"),
        FileTarget("other/test_c.py", ("other/test_c.py::test_x", "other/test_c.py::test_y")),
    ]


@pytest.mark.parametrize(("name", "text", "patterns"), [
    ("pytest.ini", "[pytest]\npython_files = check_*.py *_check.py\n",
     ("check_*.py", "*_check.py")),
    ("pyproject.toml", "[tool.pytest.ini_options]\npython_files = ['t_*.py']\n", ("t_*.py",)),
    ("setup.cfg", "[tool:pytest]\npython_files = spec_*.py\n", ("spec_*.py",)),
    ("setup.cfg", "[metadata]\nname = x\n", ("test_*.py", "*_test.py")),
])
def test_pytest_configuration_names_the_files(tmp_path: Path, name: str, text: str,
                                              patterns: tuple[str, ...]) -> None:
    write(tmp_path, {name: text})
    assert python_file_patterns(tmp_path) == patterns


# --- twins -----------------------------------------------------------------------------


@pytest.mark.parametrize(("text", "skip", "mixed"), [
    ('import torch\nx = torch.ones(3, device="mps")\n', "a Metal twin", False),
    ("import torch\npytestmark = __import__('pytest').mark.skipif(\n"
     "    not torch.backends.mps.is_available(), reason='metal')\n", "a Metal twin", False),
    ('import torch\nx = torch.ones(3).cuda()\n', None, False),
    ('import torch\n@__import__("pytest").mark.parametrize("device", ["cpu", "cuda"])\n'
     'def test_x(device):\n    pass\n', None, True),
    ("import unittest, torch\n\n\n@unittest.skipIf(torch.cuda.is_available(), 'cpu path')\n"
     "class TestCpu(unittest.TestCase):\n    pass\n\n\n"
     "@unittest.skipIf(not torch.cuda.is_available(), 'needs cuda')\n"
     "class TestCuda(unittest.TestCase):\n    pass\n", None, True),
])
def test_twins_are_read_from_the_file(tmp_path: Path, text: str, skip: str | None,
                                      mixed: bool) -> None:
    write(tmp_path, {"test_x.py": text})
    twin = twin_of(tmp_path, "test_x.py")
    assert (twin.skip or "")[:len(skip or "")] == (skip or "")
    assert (twin.skip is None) == (skip is None)
    assert twin.mixed == mixed


def test_a_cpu_only_file_is_a_twin_only_beside_cuda_files(tmp_path: Path) -> None:
    write(tmp_path, {"test_ops_cpu.py": 'x = "cpu"\n', "test_ops.py": "def test_a():\n    pass\n"})
    cpu, plain = twin_of(tmp_path, "test_ops_cpu.py"), twin_of(tmp_path, "test_ops.py")
    assert cpu.skip_in(suite_uses_cuda=True) == CPU_TWIN
    assert cpu.skip_in(suite_uses_cuda=False) is None  # alone, it is what the suite has
    assert plain.skip_in(suite_uses_cuda=True) is None  # says nothing of devices: run it


def test_class_decorated_for_the_cpu_names_its_nodes(tmp_path: Path) -> None:
    write(tmp_path, {"test_x.py": (
        "import unittest, torch\n\n\n@unittest.skipIf(torch.cuda.is_available(), 'cpu')\n"
        "class TestCpu(unittest.TestCase):\n    pass\n")})
    names = twin_of(tmp_path, "test_x.py").twin_names
    assert names == ("TestCpu",)
    assert twin_node("test_x.py::TestCpu::test_a", names) is not None
    assert twin_node("test_x.py::TestGpu::test_a", names) is None


@pytest.mark.parametrize(("node", "twin"), [
    ("t.py::test_add[cpu]", True), ("t.py::test_add[float32-cpu]", True),
    ("t.py::test_add[mps-float32]", True), ("t.py::TestOpsCPU::test_add_cpu", True),
    ("t.py::test_add[cuda]", False), ("t.py::test_add[cuda-float32]", False),
    ("t.py::TestOpsCUDA::test_add_cuda", False), ("t.py::test_cpu_offload_matches", False),
])
def test_twin_nodes_by_their_ids(node: str, twin: bool) -> None:
    assert (twin_node(node) is not None) == twin


def test_node_groups_cap_the_processes() -> None:
    assert node_groups(["a", "b"]) == [("a",), ("b",)]
    groups = node_groups([str(i) for i in range(40)], limit=16)
    assert len(groups) <= 16 and sum(map(len, groups)) == 40


# --- failed collections ----------------------------------------------------------------


def test_a_missing_module_names_its_pip_line() -> None:
    output = ("==== ERRORS ====\n___ ERROR collecting tests/test_x.py ___\n"
              "ImportError while importing test module '/r/tests/test_x.py'.\n"
              "E   ModuleNotFoundError: No module named 'expecttest'\n")
    assert collect_problem(output) == ("cannot be collected: no module named 'expecttest' "
                                       "(pip install expecttest)")
    assert pip_line("cv2") == "pip install opencv-python"
    assert pip_line("yaml.loader") == "pip install pyyaml"
    assert pip_line("my_dep") == "pip install my-dep"
    other = "___ ERROR collecting t.py ___\nE   SyntaxError: invalid syntax\n"
    assert collect_problem(other) == "cannot be collected: SyntaxError: invalid syntax"
    assert collect_problem("1 passed in 0.1s") is None


# --- a capture that survives its neighbours ----------------------------------------------

OPS = "def scale(x, alpha=2.0):\n    return x * alpha\n"
SERVER = f"kfbot-test-server-{os.getpid()}"
NEIGHBOURS = {
    "myops.py": OPS,
    # Mentions CUDA (as real suites do), so the CPU-only file beside it is its twin.
    "tests/test_good.py": ('DEVICE = "cuda"\nfrom myops import scale\n\n\n'
                           "def test_scale():\n    assert scale(1.5) == 3.0\n"),
    "tests/test_needs_dep.py": ("import kfbot_absent_dependency\nfrom myops import scale\n\n\n"
                                "def test_x():\n    assert scale(1.0) == 2.0\n"),
    "tests/test_hangs.py": ("import sys, time\nfrom myops import scale\n\n\n"
                            "def test_hangs():\n    assert scale(7.0) == 14.0\n"
                            "    print('waiting for a server that never answers', flush=True)\n"
                            "    time.sleep(600)\n"),
    "tests/test_crashes.py": ("import os\nfrom myops import scale\n\n\n"
                              "def test_first():\n    assert scale(3.0) == 6.0\n\n\n"
                              "def test_second():\n    assert scale(4.0) == 8.0\n"
                              "    print('about to crash', flush=True)\n    os.abort()\n"),
    "tests/test_ops_mps.py": ('import torch\nfrom myops import scale\n\n\n'
                              'def test_mps():\n    scale(torch.ones(2, device="mps"))\n'),
    "tests/test_ops_cpu.py": ('from myops import scale\n\n\n'
                              'def test_cpu():\n    assert scale(5.0, alpha=1.0) == 5.0\n'
                              '    assert "cpu"\n'),
    "tests/test_devices.py": ('import pytest\nfrom myops import scale\n\n\n'
                              '@pytest.mark.parametrize("device", ["cpu", "cuda"])\n'
                              'def test_dev(device):\n    assert scale(6.0) == 12.0\n'),
    # Starts a server it never stops: it must not outlive its file's process. It is found
    # by a marker on its command line (a pid inside the sandbox is the namespace's own).
    "tests/test_daemon.py": ("import subprocess, sys\n\n\n"
                             "def test_starts_a_server():\n"
                             "    subprocess.Popen([sys.executable, '-c', 'import time; "
                             f"time.sleep(600)', {SERVER!r}])\n"),
}


@pytest.fixture(scope="module")
def neighbours_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write(tmp_path_factory.mktemp("neighbours"), NEIGHBOURS)


@pytest.fixture(scope="module")
def neighbours(neighbours_root: Path) -> CaptureResult:
    return capture_signatures(neighbours_root, ["tests"], [SCALE], timeout_s=240,
                              file_timeout_s=20, jobs=2)


def scalars(result: CaptureResult) -> set[object]:
    return {a.value for s in result.signatures for a in s.args if isinstance(a, ScalarSpec)}


def test_nothing_a_file_started_outlives_it(neighbours: CaptureResult) -> None:
    run = next(r for r in neighbours.runs if r.target == "tests/test_daemon.py")
    assert run.ok  # the server was started
    assert not running(SERVER)


def test_every_file_that_can_run_gives_its_calls(neighbours: CaptureResult) -> None:
    # test_good, the hanging file before it hung, the crashing file before it crashed and
    # the CUDA node of the two-device file; nothing from the twins or the failed import.
    assert scalars(neighbours) == {1.5, 7.0, 3.0, 4.0, 6.0}
    tests = {t for s in neighbours.signatures for t in s.tests}
    assert "tests/test_devices.py::test_dev[cuda]" in tests
    assert not any("cpu" in t for t in tests)


def test_the_twins_are_skipped_with_the_reason(neighbours: CaptureResult) -> None:
    skipped = {s.target: s.reason for s in neighbours.skipped}
    assert skipped["tests/test_ops_mps.py"].startswith("a Metal twin")
    assert skipped["tests/test_ops_cpu.py"] == CPU_TWIN
    assert skipped["tests/test_devices.py::test_dev[cpu]"] == "its cpu twin"
    assert "tests/test_devices.py::test_dev[cuda]" in {r.target for r in neighbours.runs}


def test_each_failure_is_named_with_its_evidence(neighbours: CaptureResult) -> None:
    runs = {r.target: r for r in neighbours.runs}
    assert runs["tests/test_needs_dep.py"].problem == (
        "cannot be collected: no module named 'kfbot_absent_dependency' "
        "(pip install kfbot-absent-dependency)")
    hung = runs["tests/test_hangs.py"]
    assert hung.ran.timed_out and 19 < hung.ran.seconds < 60
    assert "waiting for a server that never answers" in hung.problem
    crashed = runs["tests/test_crashes.py"]
    assert crashed.ran.exit_code < 0 and "about to crash" in crashed.problem
    assert runs["tests/test_good.py"].ok
    assert neighbours.timed_out
    assert any("test_needs_dep.py cannot be collected" in e for e in neighbours.errors)


def test_a_file_stopped_at_its_time_does_not_stop_the_rest(tmp_path: Path) -> None:
    root = write(tmp_path, {"myops.py": OPS,
                            "tests/test_a_hangs.py": NEIGHBOURS["tests/test_hangs.py"],
                            "tests/test_b.py": NEIGHBOURS["tests/test_good.py"]})
    started = time.monotonic()
    result = capture_signatures(root, ["tests"], [SCALE], timeout_s=120, file_timeout_s=15)
    assert time.monotonic() - started < 90
    assert scalars(result) == {7.0, 1.5}  # the second file ran after the first was stopped
    assert [r.ran.timed_out for r in result.runs] == [True, False]
