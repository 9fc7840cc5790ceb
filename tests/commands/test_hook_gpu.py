"""The GPU pre-commit hook on a real GPU: a changed kernel of `fixtures/example` is
built from the working tree, verified against its reference and timed against its
version at HEAD, checked out in a temporary worktree; the user's tree is untouched."""

from __future__ import annotations

import shutil
from pathlib import Path

import git
import pytest
from hook_projects import EXAMPLE, ROOT, SOFTMAX, commit, edit, snapshot

from kfbot.cli import main
from kfbot.evaluate.against_base import compare_with_base
from kfbot.scan.changes import by_op, changed_kernels

pytestmark = pytest.mark.gpu

FASTER = ROOT / "tests" / "data" / "candidates" / "softmax_block_per_row" / "csrc" / "softmax.cu"
# Four sums of exponentials instead of one: the same result within float rounding, and
# clearly slower on the large input.
SLOWER = ("    float sum = 0.0f;\n"
          "    for (int64_t j = 0; j < cols; ++j) sum += expf(in[j] - m);\n",
          "    float sum = 0.0f;\n"
          "    for (int r = 0; r < 4; ++r)\n"
          "        for (int64_t j = 0; j < cols; ++j) sum += expf(in[j] - m);\n"
          "    sum *= 0.25f;\n")
WRONG = ("out[j] = expf(in[j] - m) / sum;", "out[j] = expf(in[j] - m) / (sum + 1.0f);")


@pytest.fixture(scope="module")
def cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Shared by every test: the original is built and its inputs captured once."""
    return tmp_path_factory.mktemp("kfbot-cache")


@pytest.fixture
def project(tmp_path: Path, cache: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    root = tmp_path / "example"
    shutil.copytree(EXAMPLE, root)
    commit(root)
    monkeypatch.setenv("KFBOT_CACHE", str(cache))
    return root


def test_a_faster_kernel_is_verified_and_reported_faster(project: Path, cache: Path) -> None:
    shutil.copyfile(FASTER, project / SOFTMAX)
    before = snapshot(project)
    # The faster version adds a kernel for short rows: one op, verified once.
    (group,) = by_op(changed_kernels(project, "HEAD", [SOFTMAX]))
    assert [c.kernel.name for c in group] == ["softmax_kernel", "softmax_short_rows"]
    comparison = compare_with_base(project, "HEAD", group[0], gpu=None, cache_dir=cache)
    assert comparison.base is not None and comparison.base.ok, comparison.base
    assert comparison.note == ""
    assert comparison.ok, comparison.change
    assert comparison.change.verdict == "faster", comparison.change.timings
    assert comparison.slower_shapes == []
    assert snapshot(project) == before  # the worktree is gone, the change still in place


def test_the_hook_warns_about_a_slowdown_and_fails_only_when_asked(
        project: Path, capsys: pytest.CaptureFixture[str]) -> None:
    edit(project / SOFTMAX, *SLOWER)
    before = snapshot(project)
    assert main(["hook", "verify", "--repo", str(project), str(project / SOFTMAX)]) == 0
    out = capsys.readouterr().out
    assert "softmax_kernel: correct on" in out
    assert "softmax_kernel: WARNING: significantly slower than at HEAD on" in out
    assert "(4096, 1024)" in out.split("WARNING")[1]
    assert main(["hook", "verify", "--repo", str(project), "--fail-on-slower",
                 str(project / SOFTMAX)]) == 1
    assert "softmax_kernel: FAILED: significantly slower" in capsys.readouterr().out
    assert snapshot(project) == before


def test_the_hook_fails_a_wrong_kernel(project: Path, capsys: pytest.CaptureFixture[str]) -> None:
    edit(project / SOFTMAX, *WRONG)
    assert main(["hook", "verify", "--repo", str(project), "--require-gpu"]) == 1
    out = capsys.readouterr().out
    assert "softmax_kernel: FAILED at correctness:" in out, out


def test_a_kernel_new_since_the_base_is_verified_on_its_own(
        project: Path, capsys: pytest.CaptureFixture[str]) -> None:
    repo = git.Repo(project)
    # The base revision is a commit that did not have the softmax kernel yet.
    (project / SOFTMAX).rename(project / "softmax.cu.keep")
    repo.git.add("-A")
    repo.index.commit("no softmax yet")
    (project / "softmax.cu.keep").rename(project / SOFTMAX)
    assert main(["hook", "verify", "--repo", str(project), str(project / SOFTMAX)]) == 0
    out = capsys.readouterr().out
    assert "softmax_kernel: verified on its own: new since HEAD" in out
    assert "softmax_kernel: correct on" in out
