"""Candidates given on the command line: a folder, a patch, or one file."""

from __future__ import annotations

from pathlib import Path

import pytest

from kfbot.errors import KfbotError
from kfbot.evaluate.candidate_files import load_candidate


def _repo(tmp_path: Path) -> Path:
    root = tmp_path / "repo"
    (root / "csrc").mkdir(parents=True)
    (root / "csrc" / "k.cu").write_text("int block = 128;\nint other = 1;\n")
    return root


def test_folder_mirrors_repository_paths(tmp_path: Path) -> None:
    root = _repo(tmp_path)
    cand = tmp_path / "cand" / "csrc"
    cand.mkdir(parents=True)
    (cand / "k.cu").write_text("int block = 256;\n")
    got = load_candidate(tmp_path / "cand", root, ["csrc/k.cu"])
    assert dict(got.files) == {"csrc/k.cu": "int block = 256;\n"}
    assert got.origin == "user"


def test_patch_is_applied_to_copies_only(tmp_path: Path) -> None:
    root = _repo(tmp_path)
    patch = tmp_path / "c.patch"
    patch.write_text("--- a/csrc/k.cu\n+++ b/csrc/k.cu\n@@ -1,2 +1,2 @@\n-int block = 128;\n"
                     "+int block = 512;\n int other = 1;\n")
    got = load_candidate(patch, root, ["csrc/k.cu"])
    assert dict(got.files) == {"csrc/k.cu": "int block = 512;\nint other = 1;\n"}
    assert (root / "csrc" / "k.cu").read_text() == "int block = 128;\nint other = 1;\n"


def test_patch_that_does_not_apply(tmp_path: Path) -> None:
    root = _repo(tmp_path)
    patch = tmp_path / "bad.patch"
    patch.write_text("--- a/csrc/k.cu\n+++ b/csrc/k.cu\n@@ -1,1 +1,1 @@\n-int nope = 3;\n"
                     "+int nope = 4;\n")
    with pytest.raises(KfbotError, match=r"bad\.patch: does not apply"):
        load_candidate(patch, root, ["csrc/k.cu"])


def test_single_file_replaces_the_editable_file_of_that_name(tmp_path: Path) -> None:
    root = _repo(tmp_path)
    single = tmp_path / "k.cu"
    single.write_text("int block = 64;\n")
    assert set(load_candidate(single, root, ["csrc/k.cu"]).files) == {"csrc/k.cu"}
    with pytest.raises(KfbotError, match="name the file it replaces"):
        load_candidate(single, root, ["csrc/a.cu"])


def test_missing_candidate(tmp_path: Path) -> None:
    with pytest.raises(KfbotError, match="no such candidate"):
        load_candidate(tmp_path / "nope", _repo(tmp_path), [])
