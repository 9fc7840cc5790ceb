"""Writing a winner to a branch through a temporary worktree, on real git repositories:
the user's working tree, index and uncommitted changes stay exactly as they were."""

from __future__ import annotations

from pathlib import Path

import git
import pytest

from kfbot.errors import KfbotError
from kfbot.search.branch import branch_name, write_branch


def _repo(tmp_path: Path) -> git.Repo:
    repo = git.Repo.init(tmp_path / "r")
    with repo.config_writer() as cfg:
        cfg.set_value("user", "name", "Dev")
        cfg.set_value("user", "email", "dev@example.com")
    root = Path(repo.working_tree_dir or "")
    (root / "proj" / "csrc").mkdir(parents=True)
    (root / "proj" / "csrc" / "k.cu").write_text("__global__ void k() {}\n")
    (root / "README.md").write_text("hello\n")
    repo.index.add(["proj/csrc/k.cu", "README.md"])
    repo.index.commit("initial")
    return repo


def test_the_winner_lands_on_a_branch_and_the_working_tree_is_untouched(tmp_path: Path) -> None:
    repo = _repo(tmp_path)
    root = Path(repo.working_tree_dir or "")
    (root / "proj" / "csrc" / "k.cu").write_text("// my uncommitted work\n")
    (root / "notes.txt").write_text("untracked\n")
    repo.index.add(["README.md"])
    before = (repo.git.status("--porcelain"), repo.head.commit.hexsha, repo.active_branch.name)

    sha = write_branch(root / "proj", {"csrc/k.cu": "__global__ void k_fast() {}\n"},
                       "kfbot/k-abc", "kfbot: k 1.8x faster")

    assert (repo.git.status("--porcelain"), repo.head.commit.hexsha,
            repo.active_branch.name) == before
    assert (root / "proj" / "csrc" / "k.cu").read_text() == "// my uncommitted work\n"
    commit = repo.commit("kfbot/k-abc")
    assert commit.hexsha == sha and commit.parents[0].hexsha == before[1]
    assert commit.message.strip() == "kfbot: k 1.8x faster"
    assert commit.author.email == "dev@example.com"
    blob = commit.tree / "proj" / "csrc" / "k.cu"
    assert blob.data_stream.read().decode() == "__global__ void k_fast() {}\n"
    assert repo.git.worktree("list").count("\n") == 0  # the temporary worktree is gone


def test_refusals_say_why(tmp_path: Path) -> None:
    repo = _repo(tmp_path)
    root = Path(repo.working_tree_dir or "")
    write_branch(root, {"README.md": "changed\n"}, "kfbot/x", "m")
    with pytest.raises(KfbotError, match="already exists"):
        write_branch(root, {"README.md": "again\n"}, "kfbot/x", "m")
    with pytest.raises(KfbotError, match="changes nothing"):
        write_branch(root, {"README.md": "hello\n"}, "kfbot/y", "m")
    with pytest.raises(KfbotError, match="outside the repository"):
        write_branch(root, {"../evil.txt": "x"}, "kfbot/z", "m")
    (tmp_path / "elsewhere").mkdir()
    with pytest.raises(KfbotError, match="not inside a git repository"):
        write_branch(tmp_path / "elsewhere", {"a": "b"}, "kfbot/w", "m")
    assert repo.git.worktree("list").count("\n") == 0
    assert sorted(h.name for h in repo.heads) == sorted(["kfbot/x", repo.active_branch.name])


def test_branch_names_are_valid_refs() -> None:
    assert branch_name("csrc/softmax.cu::softmax_kernel", "1a2b3c") == "kfbot/softmax_kernel-1a2b3c"
    assert branch_name("a.cu::ns::op<float>", "ff") == "kfbot/op-float-ff"
