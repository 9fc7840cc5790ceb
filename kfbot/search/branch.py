"""Write a winning candidate to a new local branch without touching the working tree.

The commit is made in a temporary git worktree checked out at the repository's
HEAD, so the user's checkout, index and uncommitted changes are never read from or
written to; the worktree is removed afterwards, whatever happens.
"""

from __future__ import annotations

import re
import tempfile
from collections.abc import Mapping
from pathlib import Path

import git

from kfbot.errors import KfbotError

_BAD_REF = re.compile(r"[^A-Za-z0-9._/-]+")


def branch_name(kernel: str, short_hash: str) -> str:
    """`kfbot/softmax_kernel-1a2b3c4d5e`: a valid, readable ref name."""
    name = _BAD_REF.sub("-", kernel.rsplit("::", 1)[-1]).strip("-./") or "kernel"
    return f"kfbot/{name}-{short_hash}"


def write_branch(root: Path, files: Mapping[str, str], branch: str, message: str) -> str:
    """Commit `files` (repository-relative path -> new text) on a new branch from HEAD.

    Returns the commit's hexsha. The branch must not exist yet; the paths must stay
    inside the repository.
    """
    repo = _repo(root)
    prefix = Path(repo.working_tree_dir or root).resolve()
    rel_root = root.resolve().relative_to(prefix)
    if branch in [h.name for h in repo.heads]:
        raise KfbotError(f"branch {branch} already exists in {prefix}")
    with tempfile.TemporaryDirectory(prefix="kfbot-worktree-") as tmp:
        tree = Path(tmp) / "tree"
        repo.git.worktree("add", "--quiet", "-b", branch, str(tree), "HEAD")
        committed = False
        try:
            sha = _commit(git.Repo(tree), tree, rel_root, files, message)
            committed = True
            return sha
        finally:
            repo.git.worktree("remove", "--force", str(tree))
            if not committed:  # leave no empty branch behind
                repo.git.branch("-D", branch)


def _repo(root: Path) -> git.Repo:
    try:
        repo = git.Repo(root, search_parent_directories=True)
    except (git.InvalidGitRepositoryError, git.NoSuchPathError) as exc:
        raise KfbotError(f"{root}: not inside a git repository") from exc
    if not repo.head.is_valid():
        raise KfbotError(f"{root}: the repository has no commit to branch from")
    return repo


def _commit(work: git.Repo, tree: Path, rel_root: Path, files: Mapping[str, str],
            message: str) -> str:
    paths = []
    for rel, text in sorted(files.items()):
        target = (tree / rel_root / rel).resolve()
        if not target.is_relative_to(tree.resolve()):
            raise KfbotError(f"{rel}: outside the repository")
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(text)
        paths.append(str(target.relative_to(tree.resolve())))
    work.index.add(paths)
    if not work.index.diff("HEAD"):
        raise KfbotError("the candidate changes nothing against HEAD")
    commit = work.index.commit(message)  # the user's configured git identity
    return str(commit.hexsha)
