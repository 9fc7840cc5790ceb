"""The processes that run a repository's code for capture: scripts run as scripts,
kfbot's own modules cannot be shadowed by the repository, and what goes wrong (a
failing exit, a flood of output, a hang, a process left running) comes back as the
run's outcome with its evidence, with nothing left running.

Each test writes a small repository of its own; the processes are real.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest
from process_table import running

from kfbot.evaluate.capture.collect import capture_signatures
from kfbot.evaluate.capture.signature import OpRef, ScalarSpec, TensorSpec

SCALE = OpRef.parse("myops.scale")
OPS_PY = "def scale(x, alpha=2.0):\n    return x * alpha\n"
# The script reads a file next to itself and imports a module from its own folder:
# both work only when it runs from its folder with that folder first on sys.path.
SCRIPT = """\
import os
import sys

import torch

import myops

HERE = os.path.dirname(__file__)
SIZES = [int(n) for n in open(os.path.join(HERE, "sizes.txt")).read().split()]


def reference(x):
    return x * 2.0


if __name__ == "__main__":
    assert os.getcwd() == HERE and sys.path[0] == HERE, (os.getcwd(), sys.path[0])
    for n in SIZES:
        x = torch.ones(n)
        out = myops.scale(x)
        print("max error", (out - reference(x)).abs().max().item())
    {ending}
"""


def write(root: Path, files: dict[str, str]) -> Path:
    for rel, text in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return root


def script_repo(root: Path, ending: str = "pass") -> Path:
    return write(root, {
        "examples/myops.py": OPS_PY,
        "examples/sizes.txt": "3 5\n",
        "examples/check.py": SCRIPT.format(ending=ending),
    })


def shapes(result_signatures: tuple[object, ...]) -> list[tuple[int, ...]]:
    found = []
    for sig in result_signatures:
        first = sig.args[0]  # type: ignore[attr-defined]
        assert isinstance(first, TensorSpec)
        found.append(first.shape)
    return sorted(found)


def test_a_script_runs_as_a_script_from_its_own_folder(tmp_path: Path) -> None:
    root = script_repo(tmp_path)
    result = capture_signatures(root, [], [SCALE], timeout_s=120, scripts=["examples/check.py"])
    assert result.ok, (result.errors, result.output_tail)
    assert shapes(result.signatures) == [(3,), (5,)]
    assert [run.line() for run in result.runs] == [
        "script examples/check.py in examples/ exited with code 0"]
    assert "max error 0.0" in result.runs[0].ran.tail


def test_signatures_are_kept_past_a_later_failure(tmp_path: Path) -> None:
    root = script_repo(tmp_path, ending='sys.exit("results differ")')
    result = capture_signatures(root, [], [SCALE], timeout_s=120, scripts=["examples/check.py"])
    assert not result.ok and result.exit_code == 1
    assert shapes(result.signatures) == [(3,), (5,)]
    assert result.errors[0] == "the script examples/check.py exited with code 1"
    assert result.output_tail.strip().endswith("results differ")


def test_signatures_survive_a_hard_exit(tmp_path: Path) -> None:
    # os._exit skips every handler: only what was saved as it came is left.
    root = script_repo(tmp_path, ending="os._exit(3)")
    result = capture_signatures(root, [], [SCALE], timeout_s=120, scripts=["examples/check.py"])
    assert result.exit_code == 3
    assert shapes(result.signatures) == [(3,), (5,)]


def test_a_repository_cannot_shadow_kfbot(tmp_path: Path) -> None:
    """A repository with its own `kfbot/` package, run from its root: kfbot's harness
    and recorder are still kfbot's; the repository's tests still import their own
    modules from the root, as `python -m pytest` lets them."""
    root = write(tmp_path, {
        "kfbot/__init__.py": "raise ImportError('the repository shadowed kfbot')\n",
        "myops.py": OPS_PY,
        "tests/test_scale.py": "from myops import scale\n\n"
                               "def test_scale():\n    assert scale(2.5) == 5.0\n",
    })
    result = capture_signatures(root, ["tests/test_scale.py"], [SCALE], timeout_s=120)
    assert result.ok, result.output_tail
    assert [s.args for s in result.signatures] == [(ScalarSpec("float", 2.5),)]


def test_an_import_that_floods_its_output_is_stopped(tmp_path: Path) -> None:
    root = write(tmp_path, {
        "myops.py": "import sys\nwhile True:\n    sys.stdout.write('x' * 4096 + '\\n')\n",
        "tests/test_scale.py": "from myops import scale\n\ndef test_scale():\n    pass\n",
    })
    started = time.monotonic()
    result = capture_signatures(root, ["tests/test_scale.py"], [SCALE], timeout_s=120)
    assert time.monotonic() - started < 60
    assert result.errors[0] == ("the tests in tests/test_scale.py were killed for writing more "
                                "than 64 MiB of output")
    assert not result.timed_out and len(result.output_tail) <= 8192
    assert result.output_tail.rstrip().endswith("x" * 100)


def test_what_the_tests_leave_running_is_killed(tmp_path: Path) -> None:
    """A test that starts a server in the background and returns: the server must not
    outlive the capture."""
    marker = f"server-{tmp_path.name}-{os.getpid()}"  # on the server's command line
    root = write(tmp_path / "repo", {
        "myops.py": OPS_PY,
        "tests/test_scale.py": (
            "import subprocess, sys\nfrom myops import scale\n\n"
            "def test_scale():\n"
            "    server = subprocess.Popen([sys.executable, '-c', 'import time; "
            f"time.sleep(600)', {marker!r}])\n"
            "    print('server started', flush=True)\n"
            "    assert scale(1.0) == 2.0\n"
        ),
    })
    result = capture_signatures(root, ["tests/test_scale.py"], [SCALE], timeout_s=120)
    assert result.ok, result.output_tail
    assert "server started" in result.output_tail
    assert not running(marker)


def test_a_hanging_script_is_killed_at_the_time_limit(tmp_path: Path) -> None:
    root = script_repo(tmp_path, ending="import time; time.sleep(600)")
    started = time.monotonic()
    # Time enough to import torch and call the op twice on a loaded 2-core machine (9-12 s
    # measured at load 12, sandboxed or not), far short of the sleep.
    result = capture_signatures(root, [], [SCALE], timeout_s=20, scripts=["examples/check.py"])
    assert time.monotonic() - started < 45
    assert result.timed_out
    assert result.errors[0].startswith("the script examples/check.py did not finish in")
    assert shapes(result.signatures) == [(3,), (5,)]


@pytest.fixture(autouse=True)
def _quiet_torch(monkeypatch: pytest.MonkeyPatch) -> None:
    # The repositories' processes import torch: one thread each on a shared machine.
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
