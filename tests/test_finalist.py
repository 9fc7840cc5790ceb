"""The finalist check runs the repository's own tests on a copy with the candidate applied."""

from __future__ import annotations

from pathlib import Path

from kfbot.evaluate.candidate import Candidate
from kfbot.evaluate.finalist import run_finalist
from kfbot.evaluate.task import KernelTask, OpBinding
from kfbot.scan.model import BuildRecipe

OP = "def double(x):\n    return [2 * v for v in x]\n"
TEST = "from ops import double\n\ndef test_double():\n    assert double([1, 2]) == [2, 4]\n"


def _task(root: Path, targets: tuple[str, ...] = ("tests/test_ops.py::test_double",),
          kind: str = "load") -> KernelTask:
    (root / "tests").mkdir(parents=True, exist_ok=True)
    (root / "ops.py").write_text(OP)
    (root / "tests" / "test_ops.py").write_text(TEST)
    (root / "conftest.py").write_text("import sys, os\nsys.path.insert(0, os.path.dirname("
                                      "os.path.abspath(__file__)))\n")
    build = BuildRecipe(kind=kind, name="ops_ext", file="setup.py" if kind == "setup_py"
                        else "ops.py", line=1)  # type: ignore[arg-type]
    return KernelTask(kernel_id="ops.cu::k", kernel_name="k", root=root, build=build,
                      op=OpBinding("module", "ops_ext", "double"), references=(),
                      unusable_references=(), test_targets=targets, editable_files=("ops.py",))


def test_a_correct_candidate_passes_and_the_tree_is_untouched(tmp_path: Path) -> None:
    task = _task(tmp_path)
    faster = Candidate(files={"ops.py": "def double(x):\n    return [v + v for v in x]\n"})
    result = run_finalist(task, faster, timeout_s=120)
    assert result.passed, result.output_tail
    assert result.commands == ("python -u -m pytest -q -p no:cacheprovider "
                               "tests/test_ops.py::test_double",)
    assert (tmp_path / "ops.py").read_text() == OP


def test_a_wrong_candidate_fails_with_the_test_output(tmp_path: Path) -> None:
    task = _task(tmp_path)
    wrong = Candidate(files={"ops.py": "def double(x):\n    return [3 * v for v in x]\n"})
    result = run_finalist(task, wrong, timeout_s=120)
    assert not result.passed
    assert result.reason.startswith("`python -u -m pytest") and "(exit 1)" in result.reason
    assert "assert [3, 6] == [2, 4]" in result.output_tail


def test_scripts_run_as_scripts_and_time_out(tmp_path: Path) -> None:
    task = _task(tmp_path, targets=("check.py",))
    (tmp_path / "check.py").write_text("import time\ntime.sleep(30)\n")
    result = run_finalist(task, Candidate(files={"ops.py": OP}), timeout_s=2)
    assert not result.passed and "timed out" in result.reason


def test_setup_py_builds_first(tmp_path: Path) -> None:
    task = _task(tmp_path, kind="setup_py")
    (tmp_path / "setup.py").write_text("import sys\nprint('building', sys.argv[1:])\n")
    result = run_finalist(task, Candidate(files={"ops.py": OP}), timeout_s=120)
    assert result.passed, result.output_tail
    assert result.commands[0] == "python -u setup.py build_ext --inplace"
    assert "building ['build_ext', '--inplace']" in result.output_tail


def test_parameters_must_be_in_the_sources(tmp_path: Path) -> None:
    result = run_finalist(_task(tmp_path), Candidate(params={"TILE": "32"}))
    assert not result.passed and "written into the sources" in result.reason
