"""Temporary git projects for the hook tests: a fixture copied and committed, edited, and
the repository's state read (what a hook must leave as it found it)."""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import git

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "fixtures" / "example"
SOFTMAX = "csrc/softmax.cu"


def commit(root: Path, message: str = "initial") -> git.Repo:
    repo = git.Repo.init(root)
    with repo.config_writer() as cfg:
        cfg.set_value("user", "name", "Dev")
        cfg.set_value("user", "email", "dev@example.com")
    repo.git.add("-A")
    repo.index.commit(message)
    return repo


def project(tmp_path: Path, fixture: Path = EXAMPLE) -> Path:
    root = tmp_path / "project"
    shutil.copytree(fixture, root)
    commit(root)
    return root


def edit(path: Path, old: str, new: str) -> None:
    text = path.read_text()
    assert old in text
    path.write_text(text.replace(old, new))


def drop_softmax_test(root: Path) -> None:
    tests = root / "tests" / "test_ops.py"
    kept = re.sub(r'@pytest.mark.parametrize\("shape", \[\(4096.*?\n\n\n', "", tests.read_text(),
                  flags=re.S)
    assert "def test_softmax" not in kept
    tests.write_text(kept)


def commit_all(root: Path) -> None:
    repo = git.Repo(root)
    repo.git.add("-A")
    repo.index.commit("more")


def snapshot(root: Path) -> tuple[str, ...]:
    repo = git.Repo(root)
    return (repo.git.status("--porcelain", "--untracked-files=all"), repo.head.commit.hexsha,
            repo.git.worktree("list", "--porcelain"), repo.git.stash("list"),
            *(p.read_text() for p in sorted((root / "csrc").iterdir())))
