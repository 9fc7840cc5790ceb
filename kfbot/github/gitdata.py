"""A branch written through GitHub's Git Data API, from bytes kfbot holds in memory.

    data = GitData(repo)
    base = data.base_files(commit, ["csrc/softmax.cu"])      # path -> BaseFile
    sha, tree = data.commit(commit, changes, message)        # blobs, tree, commit
    data.move("kfbot/softmax", sha, expected=None)           # create or move the ref

The publish job has no checkout: every file it reads comes from the API at a pinned
commit, and every object it writes is made by GitHub from the bytes it sends. So nothing
of a repository's `.git` (clean filters, `replace` refs, `insteadOf`, proxies, hooks)
can change what is committed, and the token never reaches a git process. GitHub's refs
API has no compare-and-swap for a forced move, so `move` reads the ref again right
before it moves it and refuses when it is not where kfbot last saw it.
"""

from __future__ import annotations

import base64
import binascii
from collections.abc import Callable, Iterable, Sequence
from typing import TypeVar

from github.Commit import Commit
from github.GitCommit import GitCommit
from github.GitRef import GitRef
from github.GitTree import GitTree
from github.InputGitTreeElement import InputGitTreeElement
from github.Repository import Repository

from kfbot.github.api import DEFAULT_RETRY, GitHubError, Retry, call
from kfbot.github.recheck import MAX_FILE_BYTES, BaseFile, Change

T = TypeVar("T")
# Commits kfbot reads on a branch to tell whether a person pushed there.
MAX_COMPARED = 250


class GitData:
    """One repository's objects and refs, through the API."""

    def __init__(self, repo: Repository, retry: Retry = DEFAULT_RETRY) -> None:
        self.repo = repo
        self.retry = retry
        self._trees: dict[str, GitTree] = {}
        self._commits: dict[str, GitCommit] = {}

    def _call(self, fn: Callable[[], T], what: str) -> T:
        return call(fn, what, self.retry)

    # ---- reading ------------------------------------------------------------------------

    def ref(self, branch: str) -> str | None:
        """The commit `branch` points at, or None when there is no such branch."""
        try:
            found = self._call(lambda: self.repo.get_git_ref(f"heads/{branch}"),
                               f"reading branch {branch}")
        except GitHubError as exc:
            if exc.status == 404:
                return None
            raise
        return str(found.object.sha)

    def git_commit(self, sha: str) -> GitCommit:
        if sha not in self._commits:
            self._commits[sha] = self._call(lambda: self.repo.get_git_commit(sha),
                                            f"reading commit {sha[:10]}")
        return self._commits[sha]

    def tree_of(self, commit: str) -> str:
        return str(self.git_commit(commit).tree.sha)

    def _tree(self, sha: str) -> GitTree:
        if sha not in self._trees:
            self._trees[sha] = self._call(lambda: self.repo.get_git_tree(sha),
                                          f"reading tree {sha[:10]}")
        return self._trees[sha]

    def base_files(self, commit: str, paths: Iterable[str]) -> dict[str, BaseFile]:
        """What `commit` holds at each path: mode and UTF-8 text, or nothing."""
        return {path: self._file(commit, path) for path in paths}

    def _file(self, commit: str, path: str) -> BaseFile:
        tree = self.tree_of(commit)
        parts = path.split("/")
        for i, part in enumerate(parts):
            entry = next((e for e in self._tree(tree).tree if e.path == part), None)
            if entry is None:
                return BaseFile(None, None)
            if i < len(parts) - 1:
                if entry.type != "tree":
                    return BaseFile(None, None)
                tree = entry.sha
            elif entry.type != "blob":
                return BaseFile(entry.mode, None)
            else:
                return BaseFile(entry.mode, self._text(entry.sha, path, entry.size))
        raise AssertionError("unreachable: the last part returns")

    def _text(self, sha: str, path: str, size: int | None) -> str | None:
        if size is not None and size > MAX_FILE_BYTES:
            raise GitHubError(f"{path} at the base commit is {size} bytes, more than the "
                              f"{MAX_FILE_BYTES} kfbot publishes")
        blob = self._call(lambda: self.repo.get_git_blob(sha), f"reading {path}")
        try:
            data = base64.b64decode(blob.content, validate=False) \
                if blob.encoding == "base64" else str(blob.content).encode()
        except binascii.Error as exc:
            raise GitHubError(f"reading {path}: GitHub sent undecodable base64 ({exc})"
                              ) from None
        try:
            return data.decode("utf-8")
        except UnicodeDecodeError:
            raise GitHubError(f"{path} at the base commit is not UTF-8 text: kfbot commits "
                              "kernel sources as text") from None

    def foreign(self, base: str, head: str, trailer: str, kernel_id: str) -> list[str]:
        """Commits on `head` since it left `base` whose `trailer` does not name kernel_id."""
        comparison = self._call(lambda: self.repo.compare(base, head),
                                f"comparing {base[:10]}...{head[:10]}")
        commits: list[Commit] = self._call(lambda: list(comparison.commits[:MAX_COMPARED]),
                                           "listing the branch's commits")
        found = []
        for commit in commits:
            values = [line.split(":", 1)[1].strip() for line in commit.commit.message.splitlines()
                      if line.startswith(f"{trailer}:")]
            if kernel_id not in values:
                found.append(commit.sha)
        return found

    # ---- writing ------------------------------------------------------------------------

    def commit(self, parent: str, changes: Sequence[Change], message: str) -> tuple[str, str]:
        """A commit of `changes` on top of `parent`: (commit sha, tree sha)."""
        elements = [InputGitTreeElement(c.path, c.mode, "blob", sha=self._blob(c))
                    for c in changes]
        base_tree = self._tree(self.tree_of(parent))
        tree = self._call(lambda: self.repo.create_git_tree(elements, base_tree),
                          "writing the tree")
        parents = [self.git_commit(parent)]
        made = self._call(lambda: self.repo.create_git_commit(message, tree, parents),
                          "writing the commit")
        return str(made.sha), str(tree.sha)

    def _blob(self, change: Change) -> str:
        data = base64.b64encode(change.text.encode("utf-8")).decode()
        blob = self._call(lambda: self.repo.create_git_blob(data, "base64"),
                          f"uploading {change.path}")
        return str(blob.sha)

    def move(self, branch: str, sha: str, expected: str | None) -> bool:
        """Point `branch` at `sha` if it is still at `expected` (None: absent); False when
        it moved meanwhile, and nothing is overwritten."""
        try:
            ref: GitRef | None = self._call(lambda: self.repo.get_git_ref(f"heads/{branch}"),
                                            f"reading branch {branch}")
        except GitHubError as exc:
            if exc.status != 404:
                raise
            ref = None
        if (str(ref.object.sha) if ref is not None else None) != expected:
            return False
        if ref is not None:
            self._call(lambda: ref.edit(sha, force=True), f"moving branch {branch}")
            return True
        try:
            self._call(lambda: self.repo.create_git_ref(f"refs/heads/{branch}", sha),
                       f"creating branch {branch}")
        except GitHubError as exc:
            if exc.status == 422:  # made by someone else since the read
                return False
            raise
        return True
