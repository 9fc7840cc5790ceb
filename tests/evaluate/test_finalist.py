"""The finalist check runs the repository's own tests on a copy with the candidate applied."""

from __future__ import annotations

import hashlib
import os
import subprocess
import time
from pathlib import Path

from process_table import running

from kfbot.evaluate.candidate import Candidate
from kfbot.evaluate.finalist import run_finalist
from kfbot.evaluate.task import KernelTask, OpBinding
from kfbot.scan.model import BuildRecipe

OP = "def double(x):\n    return [2 * v for v in x]\n"
TEST = "from ops import double\n\ndef test_double():\n    assert double([1, 2]) == [2, 4]\n"


def _task(root: Path, targets: tuple[str, ...] = ("tests/test_ops.py::test_double",),
          kind: str = "load", scripts: tuple[str, ...] = ()) -> KernelTask:
    (root / "tests").mkdir(parents=True, exist_ok=True)
    (root / "ops.py").write_text(OP)
    (root / "tests" / "test_ops.py").write_text(TEST)
    (root / "conftest.py").write_text("import sys, os\nsys.path.insert(0, os.path.dirname("
                                      "os.path.abspath(__file__)))\n")
    build = BuildRecipe(kind=kind, name="ops_ext", file="setup.py" if kind == "setup_py"
                        else "ops.py", line=1)  # type: ignore[arg-type]
    return KernelTask(kernel_id="ops.cu::k", kernel_name="k", root=root, build=build,
                      op=OpBinding("module", "ops_ext", "double"), references=(),
                      unusable_references=(), test_targets=targets, editable_files=("ops.py",),
                      script_targets=scripts)


def test_a_correct_candidate_passes_and_the_tree_is_untouched(tmp_path: Path) -> None:
    task = _task(tmp_path)
    faster = Candidate(files={"ops.py": "def double(x):\n    return [v + v for v in x]\n"})
    result = run_finalist(task, faster, timeout_s=120)
    assert result.passed, result.output_tail
    assert result.commands == ("python -m pytest -q -p no:cacheprovider "
                               "tests/test_ops.py::test_double",)
    assert (tmp_path / "ops.py").read_text() == OP


def test_a_wrong_candidate_fails_with_the_test_output(tmp_path: Path) -> None:
    task = _task(tmp_path)
    wrong = Candidate(files={"ops.py": "def double(x):\n    return [3 * v for v in x]\n"})
    result = run_finalist(task, wrong, timeout_s=120)
    assert not result.passed
    assert result.reason.startswith("`python -m pytest") and "(exit 1)" in result.reason
    assert "assert [3, 6] == [2, 4]" in result.output_tail


SCRIPT = """\
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
from ops import double

HERE = os.path.dirname(os.path.abspath(__file__))
if __name__ == "__main__":
    assert os.getcwd() == HERE, os.getcwd()
    values = [int(v) for v in open("values.txt").read().split()]
    open("result.txt", "w").write(str(double(values)))  # written in the copy only
    print("doubled", double(values))
    {ending}
"""


def _script_task(root: Path, ending: str = "pass") -> KernelTask:
    task = _task(root, targets=(), scripts=("examples/check.py",))
    (root / "examples").mkdir()
    (root / "examples" / "values.txt").write_text("1 2 3\n")
    (root / "examples" / "check.py").write_text(SCRIPT.format(ending=ending))
    return task


def test_scripts_run_as_scripts_from_their_own_folder(tmp_path: Path) -> None:
    root = _git(tmp_path / "repo")
    task = _script_task(root)
    before = _snapshot(root)
    result = run_finalist(task, Candidate(files={"ops.py": OP}), timeout_s=120)
    assert result.passed, result.output_tail
    assert result.commands == ("python check.py (in examples/)",)
    assert "doubled [2, 4, 6]" in result.output_tail
    assert _snapshot(root) == before  # no result.txt, no __pycache__ in the checkout


def test_a_script_that_exits_1_fails_with_its_output(tmp_path: Path) -> None:
    task = _script_task(tmp_path, ending='sys.exit("the outputs differ")')
    result = run_finalist(task, Candidate(files={"ops.py": OP}), timeout_s=120)
    assert not result.passed
    assert result.reason == "`python check.py (in examples/)` failed (exit 1)"
    assert result.output_tail.strip().endswith("the outputs differ")


def test_a_hanging_script_times_out_and_is_killed(tmp_path: Path) -> None:
    marker = f"hang-{tmp_path.name}-{os.getpid()}"  # on the grandchild's command line
    hang = ("import subprocess, time; child = subprocess.Popen([sys.executable, '-c', "
            f"'import time; time.sleep(600)', {marker!r}]); "
            "print('started', child.pid, flush=True); time.sleep(600)")
    task = _script_task(tmp_path / "repo", ending=hang)
    started = time.monotonic()
    result = run_finalist(task, Candidate(files={"ops.py": OP}), timeout_s=8)
    assert time.monotonic() - started < 30
    assert not result.passed and "timed out" in result.reason
    assert "started" in result.output_tail
    assert not running(marker)


def _git(root: Path) -> Path:
    root.mkdir(parents=True)
    subprocess.run(["git", "init", "-q"], cwd=root, check=True)
    return root


def _snapshot(root: Path) -> tuple[str, dict[str, str]]:
    status = subprocess.run(["git", "status", "--porcelain", "--ignored"], cwd=root,
                            capture_output=True, text=True, check=True).stdout
    return status, {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
                    for p in sorted(root.rglob("*")) if p.is_file() and ".git" not in p.parts}


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
