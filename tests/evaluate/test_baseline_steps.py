"""The baseline's steps before the GPU, on small repositories written here (real git
repositories, a real build, real test processes): the package imports kfbot's build of
its extension under the real name, with nothing installed and the checkout untouched;
a failed step is named, with its evidence and the kfbot.yaml that would get past it.

The extension is pybind11 without torch's headers, so that it builds in seconds on a
CPU-only machine; one builder cache serves the whole module.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import time
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest
from process_table import running

from kfbot.evaluate.baseline.steps import StepReport
from kfbot.evaluate.capture.signature import ScalarSpec
from kfbot.evaluate.engine import Engine, EngineSettings
from kfbot.evaluate.reference.spec import ReferenceSpec
from kfbot.evaluate.task import KernelTask, OpBinding
from kfbot.scan.model import BuildRecipe

EXTENSION = """\
#include <pybind11/pybind11.h>
double twice(double x) { return 2 * x; }
PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) { m.def("twice", &twice); }
"""
FILES = {
    "csrc/twice.cpp": EXTENSION,
    # The package imports its compiled extension, which nothing has built or installed.
    "pkg/__init__.py": "import torch  # the extension needs torch's libraries loaded\n"
                       "from pkg import _C as ops\n\n\ndef fused_twice(x):\n"
                       "    return ops.twice(x)\n",
    "tests/test_twice.py": "from pkg import fused_twice\n\n\ndef test_twice():\n"
                           "    assert fused_twice(1.5) == 3.0\n",
    "scripts/check.py": "import sys, os\n"
                        "sys.path.insert(0, os.path.join(os.path.dirname(__file__), '..'))\n"
                        "from pkg import fused_twice\n\n"
                        "if __name__ == '__main__':\n    print(fused_twice(4.0))\n",
    "setup.py": "raise SystemExit('kfbot must not run this setup.py')\n",
}
RECIPE = BuildRecipe(kind="setup_py", name="pkg._C", file="setup.py", line=1,
                     sources=("csrc/twice.cpp",))


def make_repo(root: Path, files: dict[str, str]) -> Path:
    for rel, text in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)
    git = ["git", "-c", "user.email=t@example.com", "-c", "user.name=t"]
    subprocess.run([*git, "init", "-q"], cwd=root, check=True)
    subprocess.run([*git, "add", "-A"], cwd=root, check=True)
    subprocess.run([*git, "commit", "-qm", "fixture"], cwd=root, check=True)
    return root


def task_for(root: Path, **changes: object) -> KernelTask:
    task = KernelTask(
        kernel_id="csrc/twice.cu::twice_kernel", kernel_name="twice_kernel", root=root,
        build=RECIPE, op=OpBinding("module", "pkg._C", "twice"), references=(),
        unusable_references=(), test_targets=("tests/test_twice.py::test_twice",),
        script_targets=("scripts/check.py",), editable_files=("csrc/twice.cpp",),
    )
    return replace(task, **changes)  # type: ignore[arg-type]


def snapshot(root: Path) -> tuple[str, dict[str, str]]:
    status = subprocess.run(["git", "status", "--porcelain", "--ignored"], cwd=root,
                            capture_output=True, text=True, check=True).stdout
    hashes = {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
              for p in sorted(root.rglob("*")) if p.is_file() and ".git" not in p.parts}
    return status, hashes


@pytest.fixture(scope="module")
def cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("kfbot-cache")


def steps_of(task: KernelTask, cache: Path) -> dict[str, StepReport]:
    with Engine(task, EngineSettings(cache_dir=cache, capture_timeout_s=120)) as engine:
        return {s.step: s for s in engine.prepare_baseline()}


@pytest.fixture(scope="module")
def repo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_repo(tmp_path_factory.mktemp("repo"), FILES)


@pytest.fixture(scope="module")
def passing(repo: Path, cache: Path) -> Iterator[tuple[dict[str, StepReport], tuple[object, ...]]]:
    before = snapshot(repo)
    ref = ReferenceSpec("lambda x: 2 * x", (), "2 * x from tests/test_twice.py:5")
    with Engine(task_for(repo, references=(ref,)),
                EngineSettings(cache_dir=cache, capture_timeout_s=120)) as engine:
        steps = {s.step: s for s in engine.prepare_baseline()}
        signatures = tuple(engine.signatures())
    yield steps, signatures
    assert snapshot(repo) == before  # the checkout: git status and every file's bytes


def test_the_package_imports_kfbots_build_under_its_real_name(
    passing: tuple[dict[str, StepReport], tuple[object, ...]],
) -> None:
    steps, signatures = passing
    assert [s.outcome for s in steps.values()] == ["ok"] * 5, steps
    assert steps["import"].summary == "the op was found (kfbot's build of pkg._C)"
    assert steps["capture"].summary.startswith("2 call signatures from 2 calls (pytest "
                                               "tests/test_twice.py::test_twice exited with "
                                               "code 0; script scripts/check.py in scripts/")
    assert {s.args for s in signatures} == {  # type: ignore[attr-defined]
        (ScalarSpec("float", 1.5),), (ScalarSpec("float", 4.0),)}


def test_capture_leaves_the_checkout_and_the_environment_alone(
    repo: Path, passing: tuple[dict[str, StepReport], tuple[object, ...]],
) -> None:
    # The snapshot comparison runs when `passing` is torn down; here: nothing built or
    # installed where the repository or this Python would find it later.
    assert not list(repo.rglob("*.so")) and not list(repo.rglob("__pycache__"))
    done = subprocess.run(["python", "-c", "import pkg._C"], cwd="/", capture_output=True)
    assert done.returncode != 0


def test_an_import_that_fails_names_the_step_and_shows_the_error(
    tmp_path: Path, cache: Path
) -> None:
    files = {**FILES, "pkg/__init__.py": "from pkg import _missing_ext\n"}
    steps = steps_of(task_for(make_repo(tmp_path, files)), cache)
    step = steps["import"]
    assert step.outcome == "failed"
    assert "an import failed (kfbot's build of pkg._C)" in step.summary
    assert "ImportError: cannot import name '_missing_ext'" in step.summary
    assert "test_twice.py" in step.evidence and "_missing_ext" in step.evidence
    assert step.suggestion.startswith("tasks:\n  - name: twice_kernel\n")


def test_a_build_that_fails_names_the_file_and_line(tmp_path: Path, cache: Path) -> None:
    files = {**FILES, "csrc/twice.cpp": EXTENSION.replace("return 2 * x;", "return 2 * ;")}
    steps = steps_of(task_for(make_repo(tmp_path, files)), cache)
    build = steps["build"]
    assert build.outcome == "failed"
    assert build.summary.startswith("setup_py pkg._C (setup.py:1): the original does not "
                                    "build at the compile stage")
    assert "csrc/twice.cpp:2:" in build.evidence
    # kfbot's build failed, so the repository's setup.py was tried in a scratch copy.
    assert "kfbot must not run this setup.py" in build.evidence
    assert "kind: setup_py" in build.suggestion and "sources: [csrc/twice.cpp]" in build.suggestion
    assert [steps[s].outcome for s in ("import", "capture", "reference")] == ["skipped"] * 3


def test_tests_that_never_call_the_op_fail_the_capture_with_a_snippet(
    tmp_path: Path, cache: Path
) -> None:
    files = {**FILES, "tests/test_twice.py": "def test_nothing():\n    pass\n"}
    task = task_for(make_repo(tmp_path, files), test_targets=("tests/test_twice.py",),
                    script_targets=())
    steps = steps_of(task, cache)
    assert steps["import"].outcome == "failed"
    assert steps["import"].summary.startswith("pkg._C.twice: never found while the tests ran")
    capture = steps["capture"]
    assert capture.outcome == "failed"
    assert capture.summary.startswith("no call signatures were captured and none are "
                                      "declared: the tests never called the ops")
    assert "shapes: [[4096], [1024, 1024]]" in capture.suggestion


def test_no_reference_is_a_warning_that_names_the_fallback(repo: Path, cache: Path) -> None:
    task = task_for(repo, unusable_references=(
        "tests/test_twice.py:5 test_twice: the reference 3.0 uses no argument",))
    step = steps_of(task, cache)["reference"]
    assert step.outcome == "warning"
    assert "checked against the original, no independent reference" in step.summary
    assert "uses no argument" in step.evidence
    assert 'reference: "tests.reference:op_reference"' in step.suggestion


# --- bad input: each reported with its step and evidence, in time, nothing left running


def test_a_script_that_needs_a_gpu_it_does_not_find(tmp_path: Path, cache: Path) -> None:
    files = {**FILES, "scripts/check.py": FILES["scripts/check.py"].replace(
        "if __name__ == '__main__':\n",
        "if __name__ == '__main__':\n    import torch\n    if not torch.cuda.is_available():\n"
        "        sys.exit('check.py needs a CUDA GPU')\n")}
    task = task_for(make_repo(tmp_path, files), test_targets=())
    capture = steps_of(task, cache)["capture"]
    assert capture.outcome == "failed"
    assert "the script scripts/check.py exited with code 1" in capture.summary
    assert capture.evidence.splitlines()[-1] == "check.py needs a CUDA GPU"


def test_a_test_suite_that_hangs_is_stopped_at_the_time_limit(
    tmp_path: Path, cache: Path
) -> None:
    marker = f"hung-{tmp_path.name}-{os.getpid()}"  # on a helper's command line
    files = {**FILES, "tests/test_twice.py": (
        "import subprocess, sys, time\nfrom pkg import fused_twice\n\n\ndef test_twice():\n"
        "    assert fused_twice(1.5) == 3.0\n\n\ndef test_hangs():\n"
        "    subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(600)', "
        f"{marker!r}])\n    time.sleep(600)\n")}
    task = task_for(make_repo(tmp_path / "repo", files), test_targets=("tests/test_twice.py",),
                    script_targets=())
    started = time.monotonic()
    with Engine(task, EngineSettings(cache_dir=cache, capture_timeout_s=15)) as engine:
        steps = {s.step: s for s in engine.prepare_baseline()}
    assert time.monotonic() - started < 90
    capture = steps["capture"]
    # What the first test recorded before the second hung is kept, and said.
    assert capture.outcome == "warning"
    assert capture.summary.startswith("1 call signature from 1 call (pytest "
                                      "tests/test_twice.py did not finish in")
    assert "kept what was recorded before pytest tests/test_twice.py stopped" in capture.summary
    assert not running(marker)


def test_a_package_whose_import_prints_megabytes(tmp_path: Path, cache: Path) -> None:
    files = {**FILES, "pkg/__init__.py": "import sys\nwhile True:\n"
                                         "    sys.stdout.write('import noise ' * 300 + '\\n')\n"}
    task = task_for(make_repo(tmp_path, files), script_targets=())
    started = time.monotonic()
    capture = steps_of(task, cache)["capture"]
    assert time.monotonic() - started < 60
    assert capture.outcome == "failed"
    assert "were killed for writing more than 64 MiB of output" in capture.summary
    assert capture.evidence.splitlines()[-1].startswith("import noise import noise")
    assert len(capture.evidence) < 8192
