"""`kfbot hook verify` where there is no GPU (skips, says so, leaves the repository as it
was) and the hook manifest pre-commit reads."""

from __future__ import annotations

import re
from pathlib import Path

import git
import pytest
import yaml
from hook_projects import ROOT, SOFTMAX, drop_softmax_test, edit, project, snapshot
from identify.identify import tags_from_filename

from kfbot.cli import build_parser, main
from kfbot.commands.hook import missing_gpu
from kfbot.errors import KfbotError
from kfbot.evaluate.against_base import compare_with_base
from kfbot.scan.changes import changed_kernels


@pytest.fixture(autouse=True)
def _own_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The scan's facts cache in the test's folder, never the user's."""
    monkeypatch.setenv("KFBOT_CACHE", str(tmp_path / "cache"))


# --- kfbot hook verify without a GPU ----------------------------------------------------------

no_gpu = pytest.mark.skipif(missing_gpu() is None, reason="this machine can run kernels")


@no_gpu
def test_the_gpu_hook_skips_without_a_gpu(capsys: pytest.CaptureFixture[str],
                                          tmp_path: Path) -> None:
    root = project(tmp_path)
    edit(root / SOFTMAX, "BLOCK 128", "BLOCK 256")
    code = main(["hook", "verify", "--repo", str(root), str(root / SOFTMAX)])
    out = capsys.readouterr().out
    assert code == 0
    assert re.fullmatch(r"kfbot hook verify: skipped \(.+\); not verified: softmax_kernel\n", out)
    code = main(["hook", "verify", "--repo", str(root), "--require-gpu", str(root / SOFTMAX)])
    assert code == 3
    assert capsys.readouterr().err.startswith("kfbot: error: cannot verify softmax_kernel: ")


@no_gpu
def test_comparing_with_the_base_without_a_gpu_says_so_and_cleans_up(tmp_path: Path) -> None:
    root = project(tmp_path)
    edit(root / SOFTMAX, "BLOCK 128", "BLOCK 256")
    before = snapshot(root)
    (changed,) = changed_kernels(root)
    with pytest.raises(KfbotError) as raised:
        compare_with_base(root, "HEAD", changed, gpu=None, cache_dir=tmp_path / "cache")
    assert raised.value.exit_code == 3
    assert snapshot(root) == before  # the temporary worktree is gone again


def test_the_gpu_hook_has_nothing_to_do_without_changed_kernels(
        capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    root = project(tmp_path)
    drop_softmax_test(root)
    assert main(["hook", "verify", "--repo", str(root), "--require-gpu"]) == 0
    assert capsys.readouterr().out == "kfbot hook verify: no kernel changed: nothing to verify\n"


@no_gpu
def test_at_pre_push_the_gpu_hook_compares_with_the_remotes_commit(
        capsys: pytest.CaptureFixture[str], tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    root = project(tmp_path)
    repo = git.Repo(root)
    edit(root / "csrc" / "matmul.cu", "#define TILE 16", "#define TILE 32")
    repo.git.add("-A")
    repo.index.commit("bigger tiles")
    monkeypatch.setenv("PRE_COMMIT_FROM_REF", repo.commit("HEAD~1").hexsha)
    assert main(["hook", "verify", "--repo", str(root)]) == 0
    assert capsys.readouterr().out.endswith("not verified: matmul_kernel\n")


def test_hook_needs_the_hook_name(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        main(["hook"])
    assert exited.value.code == 2
    assert "verify" in capsys.readouterr().err


# --- the hook manifest ------------------------------------------------------------------------


def test_the_pre_commit_manifest() -> None:
    hooks = {h["id"]: h for h in yaml.safe_load((ROOT / ".pre-commit-hooks.yaml").read_text())}
    assert set(hooks) == {"kfbot-check", "kfbot-verify"}
    light, gpu = hooks["kfbot-check"], hooks["kfbot-verify"]
    assert (light["entry"], light["language"]) == ("kfbot check --staged", "python")
    assert "stages" not in light  # every stage the user installs, pre-commit first
    # Runs on every commit and reads the staged change itself: deletions included.
    assert (light["always_run"], light["pass_filenames"]) == (True, False)
    assert "verbose" not in light  # silent when it passes
    assert (gpu["entry"], gpu["language"]) == ("kfbot hook verify", "system")
    assert gpu["stages"] == ["manual", "pre-push"]
    assert gpu["pass_filenames"] is True and gpu["verbose"] is True  # slower: a warning
    for name in ("csrc/a.cu", "inc/a.cuh", "b.cpp", "x/y.h", "z.hpp", "w.inl", "c.c",
                 "tests/t.py", "kfbot.yaml", ".github/kfbot.yml", ".kfbot.yaml"):
        assert tags_from_filename(name) & set(gpu["types_or"]), name
    for name in ("README.md", "data.json", "notes.txt", "a.cu.orig"):
        assert not tags_from_filename(name) & set(gpu["types_or"]), name
    for hook in hooks.values():
        assert hook["name"] == hook["id"]  # pre-commit's status lines stay short
        assert hook["require_serial"] is True
        assert set(hook) <= {"id", "name", "description", "entry", "language", "types_or",
                             "pass_filenames", "require_serial", "stages", "verbose",
                             "always_run", "minimum_pre_commit_version"}
    args = build_parser().parse_args(light["entry"].split()[1:])
    assert callable(args.run) and args.staged and args.files == []
    args = build_parser().parse_args([*gpu["entry"].split()[1:], "a.cu", "b.py"])
    assert callable(args.run) and [str(f) for f in args.files] == ["a.cu", "b.py"]
